//! `[methods]`: which request methods are forwarded, and what happens to a request that names
//! another method by override (`X-HTTP-Method-Override`, `_method`). See [`crate::methods`].

use super::{ConfigError, Ctx};
use crate::methods::{
    is_token, param_name, MethodRules, OverrideMode, DEFAULT_ALLOWED, DEFAULT_OVERRIDE_HEADERS,
    DEFAULT_OVERRIDE_PARAMS, MAX_ALLOWED, MAX_METHOD_LEN, MAX_NAMES, MAX_NAME_LEN, NEVER_ALLOWED,
};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMethods {
    #[serde(rename = "override")]
    mode: Option<String>,
    override_headers: Option<Vec<String>>,
    override_params: Option<Vec<String>>,
    allowed: Option<Vec<String>>,
}

/// Headers that frame or route a request, or that the limiter reads itself: naming one as an
/// override header would strip it (`strip`) or refuse every request (`refuse`).
const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "connection",
    "content-length",
    "content-type",
    "cookie",
    "forwarded",
    "host",
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "x-agent-id",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-method",
    "x-forwarded-proto",
    "x-forwarded-uri",
    "x-original-method",
    "x-original-uri",
];

/// `[methods]` read into [`MethodRules`], field by field in the order their errors win.
pub(super) fn build_methods(raw: RawMethods, ctx: &Ctx) -> Result<MethodRules, ConfigError> {
    let mode = override_mode(raw.mode.as_deref(), ctx)?;
    let headers = override_headers(raw.override_headers, ctx)?;
    let params = override_params(raw.override_params, ctx)?;
    let allowed = allowed_methods(raw.allowed, ctx)?;
    Ok(MethodRules::new(mode, &headers, &params, &allowed))
}

/// `methods.override`: what becomes of a request naming another method (default `meter`).
fn override_mode(mode: Option<&str>, ctx: &Ctx) -> Result<OverrideMode, ConfigError> {
    match mode.map(str::trim) {
        None => Ok(OverrideMode::default()),
        Some(m) => OverrideMode::ALL
            .into_iter()
            .find(|k| k.as_str() == m)
            .ok_or_else(|| {
                ctx.err(
                    "methods.override",
                    format!(
                        "`{m}` is not a mode; use \"meter\" (the default: charged as its own method and as every method it names), \"strip\" (removed before the upstream sees it) or \"refuse\" (answered 400)"
                    ),
                )
            }),
    }
}

/// `methods.override_headers`: header names, none of them one that frames or routes a request.
fn override_headers(raw: Option<Vec<String>>, ctx: &Ctx) -> Result<Vec<String>, ConfigError> {
    let headers = raw.unwrap_or_else(|| DEFAULT_OVERRIDE_HEADERS.map(String::from).to_vec());
    if headers.len() > MAX_NAMES {
        return Err(ctx.err(
            "methods.override_headers",
            format!(
                "lists {} headers; at most {MAX_NAMES} are read",
                headers.len()
            ),
        ));
    }
    for h in &headers {
        let name = h.trim();
        if name.is_empty() || name.len() > MAX_NAME_LEN || !is_token(name) {
            return Err(ctx.err(
                "methods.override_headers",
                format!(
                    "`{h}` is not a header name; name one of 1-{MAX_NAME_LEN} letters, digits and `-`, e.g. \"X-HTTP-Method-Override\""
                ),
            ));
        }
        let folded = name.to_ascii_lowercase().replace('_', "-");
        if RESERVED_HEADERS.contains(&folded.as_str()) {
            return Err(ctx.err(
                "methods.override_headers",
                format!(
                    "`{h}` cannot name a method override: it frames or routes the request, or the limiter reads it, and `strip` would remove it while `refuse` would refuse every request carrying it; name the header your clients or framework use, e.g. \"X-HTTP-Method-Override\""
                ),
            ));
        }
    }
    Ok(headers)
}

/// `methods.override_params`: query parameter names as written before `=`.
fn override_params(raw: Option<Vec<String>>, ctx: &Ctx) -> Result<Vec<String>, ConfigError> {
    let params = raw.unwrap_or_else(|| DEFAULT_OVERRIDE_PARAMS.map(String::from).to_vec());
    if params.len() > MAX_NAMES {
        return Err(ctx.err(
            "methods.override_params",
            format!(
                "lists {} parameters; at most {MAX_NAMES} are read",
                params.len()
            ),
        ));
    }
    for p in &params {
        let name = p.trim();
        let plain = name.bytes().all(|b| {
            b.is_ascii_graphic()
                && !matches!(b, b'&' | b';' | b'=' | b'#' | b'%' | b'+' | b'[' | b']')
        });
        if name.is_empty()
            || name.len() > MAX_NAME_LEN
            || !plain
            || param_name(name.as_bytes()).is_empty()
        {
            return Err(ctx.err(
                "methods.override_params",
                format!(
                    "`{p}` is not a query parameter name; name one of 1-{MAX_NAME_LEN} visible characters other than & ; = # % + [ ], as it is written before `=`, e.g. \"_method\""
                ),
            ));
        }
    }
    Ok(params)
}

/// `methods.allowed`: the methods forwarded, never CONNECT or TRACE.
fn allowed_methods(raw: Option<Vec<String>>, ctx: &Ctx) -> Result<Vec<String>, ConfigError> {
    let allowed = raw.unwrap_or_else(|| DEFAULT_ALLOWED.map(String::from).to_vec());
    if allowed.is_empty() {
        return Err(ctx.err(
            "methods.allowed",
            format!(
                "is empty, so every request would be refused; list the methods the upstream serves, e.g. {:?} (the default)",
                DEFAULT_ALLOWED
            ),
        ));
    }
    if allowed.len() > MAX_ALLOWED {
        return Err(ctx.err(
            "methods.allowed",
            format!("lists {} methods; at most {MAX_ALLOWED}", allowed.len()),
        ));
    }
    for m in &allowed {
        let method = m.trim().to_ascii_uppercase();
        if method.len() > MAX_METHOD_LEN || !is_token(&method) {
            return Err(ctx.err(
                "methods.allowed",
                format!(
                    "`{m}` is not an HTTP method; a method is a token of up to {MAX_METHOD_LEN} letters, digits and !#$%&'*+-.^_`|~, e.g. \"PATCH\""
                ),
            ));
        }
        if let Some(never) = NEVER_ALLOWED.iter().find(|n| **n == method) {
            let why = if *never == "CONNECT" {
                "the gateway forwards requests to one upstream and opens no tunnels, and an upstream that took the request would hold the client's connection with no answer"
            } else {
                "it asks the server to echo the request back, cookies and credentials included (cross-site tracing), and no API route needs it"
            };
            return Err(ctx.err(
                "methods.allowed",
                format!("`{m}` cannot be allowed: {why}; remove it from methods.allowed"),
            ));
        }
    }
    Ok(allowed)
}

#[cfg(test)]
mod tests {
    use crate::config::Loader;
    use crate::methods::{OverrideMode, DEFAULT_ALLOWED};

    fn load(env: &[(&str, &str)]) -> Result<crate::config::Config, String> {
        Loader::new()
            .env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .load()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_meter_overrides_and_allow_the_usual_methods() {
        let cfg = load(&[]).unwrap();
        assert_eq!(cfg.methods.mode(), OverrideMode::Meter);
        assert_eq!(cfg.methods.allowed().collect::<Vec<_>>(), DEFAULT_ALLOWED);
        for h in [
            "x-http-method-override",
            "x-http-method",
            "x-method-override",
        ] {
            assert!(cfg.methods.is_override_header(h), "{h}");
        }
    }

    /// The error loading `toml` as a file, its directory shown as `<dir>`.
    fn file_error(toml: &str) -> String {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("fleet-limiter.toml");
        std::fs::write(&path, toml).expect("write");
        Loader::new()
            .file(&path)
            .load()
            .expect_err("this configuration must be refused")
            .to_string()
            .replace(&dir.path().display().to_string(), "<dir>")
    }

    #[test]
    fn bad_values_are_refused_naming_the_field_and_the_fix() {
        snap!(
            "config_error_methods_override_mode",
            file_error("[methods]\noverride = \"ignore\"\n")
        );
        snap!(
            "config_error_methods_override_type",
            file_error("[methods]\noverride = true\n")
        );
        snap!(
            "config_error_methods_allowed_connect",
            file_error("[methods]\nallowed = [\"GET\", \"connect\"]\n")
        );
        snap!(
            "config_error_methods_allowed_trace",
            load(&[("FLEET_LIMITER_ALLOWED_METHODS", "GET,TRACE")]).unwrap_err()
        );
        snap!(
            "config_error_methods_allowed_empty",
            file_error("[methods]\nallowed = []\n")
        );
        snap!(
            "config_error_methods_allowed_token",
            file_error("[methods]\nallowed = [\"GET\", \"GE T\"]\n")
        );
        snap!(
            "config_error_methods_allowed_too_many",
            load(&[(
                "FLEET_LIMITER_ALLOWED_METHODS",
                &(0..33)
                    .map(|i| format!("M{i}"))
                    .collect::<Vec<_>>()
                    .join(",")
            )])
            .unwrap_err()
        );
        snap!(
            "config_error_methods_header_reserved",
            file_error(
                "[methods]\noverride_headers = [\"X-HTTP-Method-Override\", \"Content_Length\"]\n"
            )
        );
        snap!(
            "config_error_methods_header_token",
            file_error("[methods]\noverride_headers = [\"X-HTTP-Method:\"]\n")
        );
        snap!(
            "config_error_methods_param",
            file_error("[methods]\noverride_params = [\"_method[]\"]\n")
        );
        snap!(
            "config_error_methods_unknown_field",
            file_error("[methods]\noverride_header = [\"X-Verb\"]\n")
        );
    }

    #[test]
    fn variables_set_every_field() {
        let cfg = load(&[
            ("FLEET_LIMITER_METHOD_OVERRIDE", "strip"),
            ("FLEET_LIMITER_METHOD_OVERRIDE_HEADERS", "X-Verb"),
            ("FLEET_LIMITER_METHOD_OVERRIDE_PARAMS", "verb, _method"),
            ("FLEET_LIMITER_ALLOWED_METHODS", "get,post,PROPFIND"),
        ])
        .unwrap();
        assert_eq!(cfg.methods.mode(), OverrideMode::Strip);
        assert!(cfg.methods.is_override_header("x-verb"));
        assert!(!cfg.methods.is_override_header("x-http-method-override"));
        assert_eq!(cfg.methods.allow(), "GET, POST, PROPFIND");
        assert_eq!(
            cfg.methods
                .strip_query("verb=GET&a=1&_method=PUT")
                .as_deref(),
            Some("a=1")
        );
        // No override headers or parameters at all: nothing is read.
        let cfg = load(&[
            ("FLEET_LIMITER_METHOD_OVERRIDE_HEADERS", ""),
            ("FLEET_LIMITER_METHOD_OVERRIDE_PARAMS", ""),
        ])
        .unwrap();
        assert!(!cfg.methods.is_override_header("x-http-method-override"));
        assert_eq!(cfg.methods.strip_query("_method=GET"), None);
    }
}

//! The TOML configuration and its environment layer (src/config: `Loader` with a file and
//! `FLEET_LIMITER_*` pairs): a configuration error never shows a secret's value.
//!
//! Input, as text: the first line picks which secret-bearing settings the file sets (a
//! character's low bits: `identity.jwt_hs256_secret`, the password of `store.url`, of
//! `server.upstream`, the query of `identity.jwks_url`, the password of a `store.cluster`
//! node, `store.backend = "redis"`, `ops.admin_token`) and the text around each secret (`before<TAB>after`); then
//! TOML up to a line `%%`; then environment variables, `NAME=VALUE`, where `$S` in the value of
//! a secret-bearing variable stands for the secret where it is one (anywhere in the HS256
//! secret or the admin token; in a URL's userinfo, query or fragment), and for `x` elsewhere.
//!
//! The secret is a marker made from a hash of the whole input, so the input cannot spell it
//! anywhere else. Held: the error, the store's description and the loader's warnings never
//! contain it.
#![no_main]

use fleet_limiter::Loader;
use fuzz_support::{first_line, fnv};
use libfuzzer_sys::fuzz_target;

/// A TOML basic string holding `s`.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What may stand in a URL's userinfo around a password without ending it.
fn userinfo(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=%".contains(*c))
        .collect()
}

/// `$S` in one URL: the marker where the redaction contract calls it a credential (the
/// userinfo's password, or all of a userinfo without one; or after the first `?` or `#`; for a value without `://`, after the first `:`), `x`
/// elsewhere.
fn place_in_url(url: &str, marker: &str) -> String {
    let start = match url.find("://") {
        Some(i) => i + 3,
        None => url.find(':').map_or(url.len(), |i| i + 1),
    };
    let rest = &url[start..];
    let query = rest.find(['?', '#']);
    let at = rest[..query.unwrap_or(rest.len())].rfind('@');
    // The userinfo's secret is its password (after its first `:`), or all of it when it has
    // none (a token); a user name beside a password is shown, as `redact::url` documents.
    let password_from = at.map(|a| rest[..a].find(':').map_or(0, |c| c + 1));
    let mut out = url[..start].replace("$S", "x");
    let mut i = 0;
    while i < rest.len() {
        if rest[i..].starts_with("$S") {
            let in_userinfo = at.is_some_and(|a| i < a) && password_from.is_some_and(|p| i >= p);
            let secret = in_userinfo || query.is_some_and(|q| i > q);
            out.push_str(if secret { marker } else { "x" });
            i += 2;
        } else {
            let c = rest[i..].chars().next().expect("inside the string");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn env_value(var: &str, raw: &str, marker: &str) -> String {
    match var {
        "FLEET_LIMITER_JWT_HS256_SECRET" | "FLEET_LIMITER_ADMIN_TOKEN" => raw.replace("$S", marker),
        "FLEET_LIMITER_STORE_URL"
        | "FLEET_LIMITER_STORE"
        | "FLEET_LIMITER_UPSTREAM"
        | "FLEET_LIMITER_JWKS_URL" => place_in_url(raw, marker),
        "FLEET_LIMITER_STORE_CLUSTER" => raw
            .split(',')
            .map(|u| place_in_url(u, marker))
            .collect::<Vec<_>>()
            .join(","),
        _ => raw.to_owned(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Paths the configuration would read (a PEM key, a CA bundle) that never end.
    if ["/dev", "/proc", "/sys"].iter().any(|p| text.contains(p)) {
        return;
    }
    let marker = format!("Mk{:016x}", fnv(data));
    let (head, rest) = first_line(data);
    let head = std::str::from_utf8(head).unwrap_or_default();
    let bits = head.bytes().next().unwrap_or(0);
    let deco = head.get(1..).unwrap_or_default();
    let (before, after) = deco.split_once('\t').unwrap_or((deco, ""));
    let rest = std::str::from_utf8(rest).unwrap_or_default();
    let (toml, env) = match rest.split_once("\n%%\n") {
        Some((t, e)) => (t, e),
        None => (rest, ""),
    };

    let mut file = String::new();
    if bits & 1 != 0 {
        file += &format!(
            "identity.jwt_hs256_secret = {}\n",
            toml_str(&format!("{before}{marker}{after}"))
        );
    }
    if bits & 2 != 0 {
        let url = format!(
            "redis://{}:{marker}{}@127.0.0.1:6379/0",
            userinfo(before),
            userinfo(after)
        );
        file += &format!("store.url = {}\n", toml_str(&url));
    }
    if bits & 4 != 0 {
        let url = format!(
            "http://{}:{marker}{}@127.0.0.1:8080{}",
            userinfo(before),
            userinfo(after),
            before
        );
        file += &format!("server.upstream = {}\n", toml_str(&url));
    }
    if bits & 8 != 0 {
        let url = format!("https://127.0.0.1/{}?{after}{marker}", userinfo(before));
        file += &format!("identity.jwks_url = {}\n", toml_str(&url));
    }
    if bits & 16 != 0 {
        let url = format!("redis://:{marker}{}@127.0.0.1:7000", userinfo(after));
        file += &format!("store.cluster = [{}]\n", toml_str(&url));
    }
    if bits & 32 != 0 {
        file += "store.backend = \"redis\"\n";
    }
    if bits & 64 != 0 {
        file += &format!(
            "ops.admin_token = {}\n",
            toml_str(&format!("{before}{marker}{after}"))
        );
    }
    file += toml;

    let vars: Vec<(String, String)> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), env_value(k, v, &marker)))
        .collect();
    let path = std::env::temp_dir().join(format!("fleet-limiter-fuzz-{}.toml", std::process::id()));
    std::fs::write(&path, &file).expect("write the configuration file");
    let loader = Loader::new().file(&path).env(vars);
    for w in loader.warnings() {
        assert!(!w.contains(&marker), "a warning shows the secret: {w}");
    }
    match loader.load() {
        Ok(cfg) => {
            let shown = cfg.store.describe();
            assert!(
                !shown.contains(&marker),
                "the store's description shows the secret: {shown}"
            );
        }
        Err(e) => {
            let e = e.to_string();
            assert!(
                !e.contains(&marker),
                "the error shows the secret:\n{e}\n--- file:\n{file}"
            );
        }
    }
});

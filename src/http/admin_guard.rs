//! What no web page can make the admin listener do. A browser will send a request anywhere a
//! page asks it to: a `text/plain` or form POST to `http://127.0.0.1:7391/overrides` needs no
//! permission (a "simple" cross-site request), and a page on a name the attacker re-points at
//! 127.0.0.1 (DNS rebinding) reads the answers as its own. So every request to the admin
//! listener, with or without `ops.admin_token`, must:
//!
//! - name the listener in `Host`: an IP literal (a rebinding page has a name, never an address),
//!   `localhost`, or a name in `ops.admin_hosts`; sent once;
//! - not come from another site: an `Origin` other than the listener's own, or
//!   `Sec-Fetch-Site` other than `same-origin` or `none` (a browser sends both), is refused;
//! - write only JSON: a request other than GET or HEAD with a body must be
//!   `application/json` (a browser cannot send that cross-site without a CORS preflight, which
//!   the listener never grants); one without a body may carry no `Content-Type` at all, so
//!   `curl -X POST http://127.0.0.1:7391/reload` works.
//!
//! Pure: [`judge`] reads the method and headers; the listener answers its [`Refused`].

use actix_web::http::header::{
    HeaderMap, CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN, TRANSFER_ENCODING,
};
use actix_web::http::Method;
use std::net::IpAddr;

/// Why the admin listener refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No `Host`, more than one, or a name the listener is not reached by (421).
    Host,
    /// An `Origin` or `Sec-Fetch-Site` of another site (403).
    CrossSite,
    /// A write whose body is not `application/json` (415).
    NotJson,
}

impl Refused {
    pub(crate) fn status(self) -> u16 {
        match self {
            Refused::Host => 421,
            Refused::CrossSite => 403,
            Refused::NotJson => 415,
        }
    }

    /// What the caller is told, and how to pass: never a value it sent.
    pub(crate) fn detail(self) -> &'static str {
        match self {
            Refused::Host => "The admin listener answers only requests whose Host is an IP address, localhost, or a name listed in ops.admin_hosts (FLEET_LIMITER_ADMIN_HOSTS), so that a web page on another name cannot reach it (DNS rebinding). Ask it by its address, or list the name you use.",
            Refused::CrossSite => "The admin listener refuses requests a web page on another site makes (Origin, Sec-Fetch-Site). Use curl or the fleet-limiter command line.",
            Refused::NotJson => "The admin listener takes writes as application/json only (Content-Type: application/json), so that no web page can send one without permission; a request with no body needs no Content-Type.",
        }
    }

    /// The metric label and log field.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refused::Host => "host",
            Refused::CrossSite => "cross_site",
            Refused::NotJson => "not_json",
        }
    }
}

/// The answer to a refused request: the status and a problem document saying how to pass.
pub(crate) fn answer(r: Refused) -> actix_web::HttpResponse {
    let title = match r {
        Refused::Host => "Misdirected Request",
        Refused::CrossSite => "Forbidden",
        Refused::NotJson => "Unsupported Media Type",
    };
    crate::http::response::Problem {
        kind: "urn:fleet-limiter:problem:admin-refused",
        title,
        status: r.status(),
        detail: r.detail().to_owned(),
        retry_after: None,
    }
    .into_response()
}

/// Whether a request to the admin listener may be served (see the module's rules); `hosts` is
/// `ops.admin_hosts`.
pub(crate) fn judge(method: &Method, headers: &HeaderMap, hosts: &[String]) -> Result<(), Refused> {
    let host = only(headers, HOST.as_str()).ok_or(Refused::Host)?;
    let host = std::str::from_utf8(host).map_err(|_| Refused::Host)?.trim();
    if !host_allowed(host, hosts) {
        return Err(Refused::Host);
    }
    let mut origins = headers.get_all(ORIGIN);
    if let Some(origin) = origins.next() {
        let same = origin.to_str().ok().is_some_and(|o| {
            o.strip_prefix("http://")
                .is_some_and(|rest| rest.eq_ignore_ascii_case(host))
        });
        if !same || origins.next().is_some() {
            return Err(Refused::CrossSite);
        }
    }
    for site in headers.get_all("sec-fetch-site") {
        let ok = site
            .to_str()
            .is_ok_and(|s| s.eq_ignore_ascii_case("same-origin") || s.eq_ignore_ascii_case("none"));
        if !ok {
            return Err(Refused::CrossSite);
        }
    }
    if method == Method::GET || method == Method::HEAD {
        return Ok(());
    }
    let has_body = headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get_all(CONTENT_LENGTH)
            .any(|v| v.as_bytes().trim_ascii() != b"0");
    let mut types = headers.get_all(CONTENT_TYPE);
    match (types.next(), types.next()) {
        (None, _) if !has_body => Ok(()),
        (Some(ct), None) if is_json(ct.as_bytes()) => Ok(()),
        _ => Err(Refused::NotJson),
    }
}

/// A header's value when it was sent exactly once.
fn only<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    let mut all = headers.get_all(name);
    match (all.next(), all.next()) {
        (Some(v), None) => Some(v.as_bytes()),
        _ => None,
    }
}

/// `application/json`, any case, parameters (a charset) ignored.
fn is_json(ct: &[u8]) -> bool {
    ct.split(|b| *b == b';')
        .next()
        .is_some_and(|m| m.trim_ascii().eq_ignore_ascii_case(b"application/json"))
}

/// Whether `host` (a `Host` value: a name or an address, with or without a port) names the
/// listener: an IP literal, `localhost`, or one of `hosts`.
fn host_allowed(host: &str, hosts: &[String]) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // An IPv6 literal, `[addr]` or `[addr]:port`.
        let Some((addr, after)) = rest.split_once(']') else {
            return false;
        };
        let port_ok = after.is_empty()
            || after.strip_prefix(':').is_some_and(|p| {
                !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
            });
        return port_ok && addr.parse::<std::net::Ipv6Addr>().is_ok();
    } else {
        match host.rsplit_once(':') {
            Some((name, port))
                if !port.is_empty()
                    && port.len() <= 5
                    && port.bytes().all(|b| b.is_ascii_digit()) =>
            {
                name
            }
            Some(_) => return false,
            None => host,
        }
    };
    if name.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv4()) {
        return true;
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    name == "localhost" || hosts.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    fn get(pairs: &[(&str, &str)]) -> Result<(), Refused> {
        judge(&Method::GET, &headers(pairs), &["admin.ops.svc".to_owned()])
    }

    fn post(pairs: &[(&str, &str)]) -> Result<(), Refused> {
        judge(&Method::POST, &headers(pairs), &[])
    }

    #[test]
    fn the_listener_answers_to_addresses_localhost_and_listed_names_only() {
        for ok in [
            "127.0.0.1:7391",
            "127.0.0.1",
            "10.1.2.3:7391",
            "[::1]:7391",
            "[::1]",
            "[fd00::17]:7391",
            "localhost:7391",
            "LOCALHOST",
            "localhost.",
            "admin.ops.svc:7391",
            "Admin.OPS.svc.",
        ] {
            assert_eq!(get(&[("host", ok)]), Ok(()), "{ok}");
        }
        for refused in [
            "rebind.evil.example",
            "rebind.evil.example:7391",
            "127.0.0.1.nip.io",
            "localhost.evil.example",
            "evil.localhost",
            "127.1",
            "2130706433",
            "0x7f000001",
            "[::1",
            "[::1]x",
            "[::1]:",
            "[evil]",
            "127.0.0.1:",
            "127.0.0.1:7391:1",
            "127.0.0.1:123456",
            "admin.ops.svc.evil",
            "",
            "::1",
        ] {
            assert_eq!(get(&[("host", refused)]), Err(Refused::Host), "{refused:?}");
        }
        assert_eq!(get(&[]), Err(Refused::Host), "no Host");
        assert_eq!(
            get(&[("host", "127.0.0.1:7391"), ("host", "127.0.0.1:7391")]),
            Err(Refused::Host),
            "Host twice"
        );
    }

    #[test]
    fn a_page_on_another_site_is_refused() {
        let h = ("host", "127.0.0.1:7391");
        assert_eq!(get(&[h, ("origin", "http://127.0.0.1:7391")]), Ok(()));
        assert_eq!(get(&[h, ("sec-fetch-site", "same-origin")]), Ok(()));
        assert_eq!(get(&[h, ("sec-fetch-site", "none")]), Ok(()));
        for origin in [
            "http://evil.example",
            "http://127.0.0.1:8080",
            "https://127.0.0.1:7391",
            "null",
            "http://127.0.0.1:7391.evil.example",
            "",
        ] {
            assert_eq!(
                get(&[h, ("origin", origin)]),
                Err(Refused::CrossSite),
                "{origin}"
            );
        }
        assert_eq!(
            get(&[
                h,
                ("origin", "http://127.0.0.1:7391"),
                ("origin", "http://evil.example")
            ]),
            Err(Refused::CrossSite)
        );
        for site in ["cross-site", "same-site", "", "whatever"] {
            assert_eq!(
                get(&[h, ("sec-fetch-site", site)]),
                Err(Refused::CrossSite),
                "{site}"
            );
        }
    }

    #[test]
    fn writes_are_json_or_have_no_body() {
        let h = ("host", "127.0.0.1:7391");
        assert_eq!(post(&[h]), Ok(()), "curl -X POST …/reload");
        assert_eq!(post(&[h, ("content-length", "0")]), Ok(()));
        assert_eq!(
            post(&[
                h,
                ("content-type", "application/json"),
                ("content-length", "20")
            ]),
            Ok(())
        );
        assert_eq!(
            post(&[
                h,
                ("content-type", "Application/JSON; charset=utf-8"),
                ("content-length", "2")
            ]),
            Ok(())
        );
        for ct in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json-seq",
            "text/plain; application/json",
        ] {
            assert_eq!(
                post(&[h, ("content-type", ct), ("content-length", "20")]),
                Err(Refused::NotJson),
                "{ct}"
            );
        }
        assert_eq!(
            post(&[h, ("content-length", "20")]),
            Err(Refused::NotJson),
            "no type"
        );
        assert_eq!(
            post(&[h, ("transfer-encoding", "chunked")]),
            Err(Refused::NotJson)
        );
        assert_eq!(
            post(&[h, ("content-type", "text/plain")]),
            Err(Refused::NotJson),
            "a non-JSON type even without a body"
        );
        assert_eq!(
            post(&[
                h,
                ("content-type", "application/json"),
                ("content-type", "text/plain"),
                ("content-length", "2")
            ]),
            Err(Refused::NotJson)
        );
        assert_eq!(
            judge(&Method::DELETE, &headers(&[h]), &[]),
            Ok(()),
            "DELETE /overrides/<id>"
        );
    }
}

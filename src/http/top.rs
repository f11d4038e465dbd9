//! `GET /top` on the admin listener: the principals each limiter refused and metered most over
//! the last 1, 5 or 15 minutes ([`crate::top`]), as JSON for scripts and `fleet-limiter top`, or
//! as a page a browser can leave open (`Accept: text/html`), from which an operator resets a
//! row's bucket or gives its address an override, with the admin token.
//!
//! The JSON needs what the levers need (the admin token when one is set; else a listener on
//! loopback alone): a list of who is refused is not for everyone who can reach `/metrics`. The
//! page itself holds no data, only the script that asks for it.
//!
//! Query: `window` (`1m`, `5m` or `15m`; default `5m`), `n` (rows per list, 1 to 100; default
//! 20), `limiter` (one configured limiter), `format` (`json` or `html`). Anything else, a name
//! given twice, or a query over 512 bytes is refused `400` saying what works.

use super::control::Control;
use super::levers::{authorized, problem};
use crate::top::{LimiterTop, MAX_ROWS};
use actix_web::http::header::{ACCEPT, CACHE_CONTROL};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;

/// The longest query string read.
const MAX_QUERY: usize = 512;

/// What the query asked for.
#[derive(Debug, PartialEq, Eq)]
struct Asked {
    minutes: u64,
    n: usize,
    limiter: Option<String>,
    html: Option<bool>,
}

fn parse_query(q: &str) -> Result<Asked, String> {
    if q.len() > MAX_QUERY {
        return Err(format!(
            "the query is {} bytes; send at most {MAX_QUERY}",
            q.len()
        ));
    }
    let mut asked = Asked {
        minutes: 5,
        n: 20,
        limiter: None,
        html: None,
    };
    let mut seen: Vec<String> = Vec::new();
    let pairs = web::Query::<Vec<(String, String)>>::from_query(q)
        .map_err(|_| "the query is not form-encoded; use window, n, limiter or format".to_owned())?
        .into_inner();
    for (name, value) in pairs {
        let shown = crate::redact::printable(&name, 32);
        if seen.contains(&name) {
            return Err(format!("`{shown}` is given twice; give it once"));
        }
        seen.push(name.clone());
        match name.as_str() {
            "window" => {
                asked.minutes = match value.as_str() {
                    "1m" | "1" => 1,
                    "5m" | "5" => 5,
                    "15m" | "15" => 15,
                    _ => return Err("window: use 1m, 5m or 15m".to_owned()),
                }
            }
            "n" => {
                asked.n = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_ROWS).contains(n))
                    .ok_or_else(|| format!("n: use a whole number of rows from 1 to {MAX_ROWS}"))?
            }
            "limiter" => asked.limiter = Some(value),
            "format" => {
                asked.html = Some(match value.as_str() {
                    "json" => false,
                    "html" => true,
                    _ => return Err("format: use json or html".to_owned()),
                })
            }
            _ => {
                return Err(format!(
                    "`{shown}` is not asked of /top; use window, n, limiter or format"
                ))
            }
        }
    }
    Ok(asked)
}

/// The answer's JSON.
#[derive(Debug, Serialize)]
struct Answer {
    window_seconds: u64,
    /// Instances whose lists are summed: this one, and the others on the same Redis store that
    /// published within 30 s (each publishes every 5 s, its top 20 per list).
    instances: usize,
    /// Buckets each list holds per minute; counts are exact until a minute has more distinct
    /// buckets than this.
    capacity: usize,
    generated_at: String,
    limiters: Vec<LimiterTop>,
}

/// Whether a request without `format` wants the page: a browser's navigation asks for HTML.
fn wants_html(req: &HttpRequest) -> bool {
    req.headers()
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"))
}

pub(crate) async fn top(control: web::Data<Control>, req: HttpRequest) -> HttpResponse {
    let asked = match parse_query(req.query_string()) {
        Ok(a) => a,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &e, None),
    };
    if asked.html.unwrap_or_else(|| wants_html(&req)) {
        return page();
    }
    if let Err(r) = authorized(&control, &req) {
        return *r;
    }
    let decider = control.decider();
    let settings = decider.settings();
    if !settings.top_talkers {
        return problem(
            StatusCode::NOT_FOUND,
            "this instance keeps no top-talker lists (ops.top_talkers = false); set it to true (FLEET_LIMITER_TOP_TALKERS=true) and reload",
            None,
        );
    }
    let configured: Vec<String> = settings
        .policy
        .limiters()
        .iter()
        .map(|l| l.name.to_string())
        .collect();
    if let Some(l) = &asked.limiter {
        if !configured.contains(l) {
            return problem(
                StatusCode::NOT_FOUND,
                &format!(
                    "`{}` is not a configured limiter; name one of {}",
                    crate::redact::printable(l, 64),
                    configured.join(", ")
                ),
                Some("limiter"),
            );
        }
    }
    let unix = decider.overrides().unix_now();
    let mut all = vec![decider.top().top(decider.now(), asked.minutes, MAX_ROWS)];
    if let Some(table) = decider.store().shared_table() {
        match decider.top().others(table, asked.minutes, unix).await {
            Ok(others) => all.extend(others),
            Err(e) => {
                tracing::warn!(error = %e, "top talkers: cannot read other instances' lists; answering with this instance's");
            }
        }
    }
    let instances = all.len();
    let limiters = crate::top::merge_instances(&all, asked.n)
        .into_iter()
        .filter(|t| configured.contains(&t.limiter))
        .filter(|t| asked.limiter.as_ref().is_none_or(|l| *l == t.limiter))
        .collect();
    HttpResponse::Ok()
        .insert_header((CACHE_CONTROL, "no-store"))
        .json(Answer {
            window_seconds: asked.minutes * 60,
            instances,
            capacity: crate::top::CAPACITY,
            generated_at: crate::overrides::format_rfc3339(unix),
            limiters,
        })
}

/// The page: its script and style allowed by a nonce of this response alone, nothing loaded
/// from anywhere else, never framed.
fn page() -> HttpResponse {
    let nonce = format!("{:032x}", rand::random::<u128>());
    let body = PAGE.replace("{{NONCE}}", &nonce);
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((CACHE_CONTROL, "no-store"))
        .insert_header((
            "content-security-policy",
            format!("default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
        ))
        .insert_header(("x-frame-options", "DENY"))
        .insert_header(("x-content-type-options", "nosniff"))
        .insert_header(("referrer-policy", "no-referrer"))
        .body(body)
}

const PAGE: &str = include_str!("top.html");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_takes_what_it_names_and_refuses_the_rest() {
        assert_eq!(
            parse_query("").unwrap(),
            Asked {
                minutes: 5,
                n: 20,
                limiter: None,
                html: None
            }
        );
        let a = parse_query("window=15m&n=3&limiter=api-key&format=json").unwrap();
        assert_eq!(
            (a.minutes, a.n, a.limiter.as_deref(), a.html),
            (15, 3, Some("api-key"), Some(false))
        );
        for (bad, says) in [
            ("window=2m", "window: use 1m, 5m or 15m"),
            ("n=0", "n: use a whole number"),
            ("n=101", "n: use a whole number"),
            ("n=-1", "n: use a whole number"),
            ("window=1m&window=5m", "given twice"),
            ("format=xml", "format: use json or html"),
            ("x=1", "is not asked of /top"),
            ("%00%ff=1", "is not asked of /top"),
        ] {
            let e = parse_query(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let long = format!("limiter={}", "a".repeat(600));
        assert!(parse_query(&long).unwrap_err().contains("at most 512"));
    }
}

//! CORS for the responses the gateway makes itself.
//!
//! A browser on a dashboard origin can only read a response that carries
//! `Access-Control-Allow-Origin` for it. The upstream adds that to its own answers; a 429 (or
//! 502/504) the gateway makes never reached the upstream, so without this layer the browser
//! reports a CORS error instead of the refusal and its `Retry-After`. This layer:
//!
//! - gives gateway-made responses the CORS headers for an origin on the configured allow-list
//!   (`[cors] allowed_origins`, optionally `allow_credentials`);
//! - exposes `Retry-After` and the `RateLimit*` headers on those, and on every proxied response
//!   the upstream already allowed (by appending to `Access-Control-Expose-Headers`);
//! - leaves everything else alone: the upstream keeps deciding CORS for its own answers, and
//!   preflight `OPTIONS` requests go to the upstream unmetered (see [`is_preflight`]).

use crate::config::ops::CorsConfig;
use crate::http::response::GatewayMade;
use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{
    HeaderMap, HeaderValue, ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use actix_web::http::Method;
use actix_web::Error;
use futures_util::future::{ready, LocalBoxFuture, Ready};
use parking_lot::RwLock;
use std::rc::Rc;
use std::sync::Arc;

/// The headers a browser script needs to see to honour a limit: `Retry-After` and every limit
/// header any `[headers]` profile sends (a name the profile in force does not send costs
/// nothing, and a reload that changes the profile needs no change here).
pub(crate) const EXPOSED: &[&str] = &[
    "Retry-After",
    "RateLimit",
    "RateLimit-Policy",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "X-RateLimit-Limit",
    "X-RateLimit-Remaining",
    "X-RateLimit-Reset",
];

/// A CORS preflight: `OPTIONS` with `Origin` and `Access-Control-Request-Method`. It carries no
/// credentials and must get a 2xx for the real request to be sent, so it is forwarded unmetered.
pub(crate) fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::OPTIONS
        && headers.contains_key(ORIGIN)
        && headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD)
}

/// The allow-list, ready to answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CorsPolicy {
    origins: Vec<String>,
    any: bool,
    credentials: bool,
}

impl CorsPolicy {
    pub fn new(cfg: &CorsConfig) -> Self {
        Self {
            any: cfg.allowed_origins.iter().any(|o| o == "*"),
            origins: cfg
                .allowed_origins
                .iter()
                .filter(|o| *o != "*")
                .cloned()
                .collect(),
            credentials: cfg.allow_credentials,
        }
    }

    /// The `Access-Control-Allow-Origin` value for this request origin, if it is allowed.
    pub fn allow_origin(&self, origin: &str) -> Option<String> {
        if self.origins.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
            Some(origin.to_owned())
        } else if self.any {
            // `*` is only ever configured without credentials (the loader rejects the mix).
            Some("*".to_owned())
        } else {
            None
        }
    }

    /// Add what a browser on `origin` needs to `headers` of a response.
    pub fn apply(&self, origin: Option<&HeaderValue>, gateway_made: bool, headers: &mut HeaderMap) {
        let Some(origin) = origin.and_then(|o| o.to_str().ok()) else {
            return;
        };
        if gateway_made {
            let Some(allow) = self.allow_origin(origin) else {
                return;
            };
            if let Ok(v) = HeaderValue::from_str(&allow) {
                headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, v);
            }
            if self.credentials {
                headers.insert(
                    ACCESS_CONTROL_ALLOW_CREDENTIALS,
                    HeaderValue::from_static("true"),
                );
            }
            if allow != "*" {
                append_list(headers, VARY, &["Origin"]);
            }
            append_list(headers, ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSED);
        } else if headers.contains_key(ACCESS_CONTROL_ALLOW_ORIGIN) {
            append_list(headers, ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSED);
        }
    }
}

/// Append the names missing from a comma-separated header, keeping what is there.
fn append_list(headers: &mut HeaderMap, name: actix_web::http::header::HeaderName, items: &[&str]) {
    let present: Vec<String> = headers
        .get_all(&name)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    let missing: Vec<&str> = items
        .iter()
        .copied()
        .filter(|i| !present.iter().any(|p| p.eq_ignore_ascii_case(i)))
        .collect();
    if missing.is_empty() {
        return;
    }
    let mut all: Vec<String> = headers
        .get_all(&name)
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    all.extend(missing.iter().map(|s| (*s).to_owned()));
    if let Ok(v) = HeaderValue::from_str(&all.join(", ")) {
        headers.insert(name, v);
    }
}

/// The layer as actix-web middleware; [`Cors::set`] swaps the allow-list on reload.
#[derive(Clone, Default)]
pub struct Cors {
    policy: Arc<RwLock<Arc<CorsPolicy>>>,
}

impl Cors {
    pub fn new(cfg: &CorsConfig) -> Self {
        Self {
            policy: Arc::new(RwLock::new(Arc::new(CorsPolicy::new(cfg)))),
        }
    }

    /// Take a new allow-list for the next response.
    pub fn set(&self, cfg: &CorsConfig) {
        *self.policy.write() = Arc::new(CorsPolicy::new(cfg));
    }

    pub fn policy(&self) -> Arc<CorsPolicy> {
        self.policy.read().clone()
    }
}

impl<S, B> Transform<S, ServiceRequest> for Cors
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Transform = CorsService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(CorsService {
            service: Rc::new(service),
            cors: self.clone(),
        }))
    }
}

pub struct CorsService<S> {
    service: Rc<S>,
    cors: Cors,
}

impl<S, B> Service<ServiceRequest> for CorsService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<B>;
    type Error = Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let origin = req.headers().get(ORIGIN).cloned();
        let policy = self.cors.policy();
        let fut = self.service.call(req);
        Box::pin(async move {
            let mut res = fut.await?;
            if origin.is_some() {
                let gateway_made = res.response().extensions().contains::<GatewayMade>();
                policy.apply(origin.as_ref(), gateway_made, res.headers_mut());
            }
            Ok(res)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(origins: &[&str], credentials: bool) -> CorsConfig {
        CorsConfig {
            allowed_origins: origins.iter().map(|s| (*s).to_owned()).collect(),
            allow_credentials: credentials,
        }
    }

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).expect("valid header")
    }

    #[test]
    fn every_limit_header_any_profile_sends_is_exposed() {
        let exposed: Vec<String> = EXPOSED.iter().map(|n| n.to_ascii_lowercase()).collect();
        let names: Vec<&str> = crate::http::response::limit_header_names().collect();
        assert_eq!(names.len(), 8);
        for name in names {
            assert!(exposed.iter().any(|e| e == name), "{name} is not exposed");
        }
        assert!(exposed.iter().any(|e| e == "retry-after"));
    }

    #[test]
    fn gateway_made_response_gets_headers_for_listed_origin_only() {
        let p = CorsPolicy::new(&cfg(&["https://dash.example"], true));
        let mut h = HeaderMap::new();
        p.apply(Some(&hv("https://dash.example")), true, &mut h);
        assert_eq!(
            h.get(ACCESS_CONTROL_ALLOW_ORIGIN),
            Some(&hv("https://dash.example"))
        );
        assert_eq!(h.get(ACCESS_CONTROL_ALLOW_CREDENTIALS), Some(&hv("true")));
        assert_eq!(h.get(VARY), Some(&hv("Origin")));
        let exposed = h
            .get(ACCESS_CONTROL_EXPOSE_HEADERS)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(
            exposed.contains("Retry-After") && exposed.contains("RateLimit-Policy"),
            "{exposed}"
        );

        let mut h = HeaderMap::new();
        p.apply(Some(&hv("https://evil.example")), true, &mut h);
        assert!(h.is_empty(), "an unlisted origin gets nothing: {h:?}");
        let mut h = HeaderMap::new();
        p.apply(None, true, &mut h);
        assert!(h.is_empty());
    }

    #[test]
    fn wildcard_without_credentials_answers_star() {
        let p = CorsPolicy::new(&cfg(&["*"], false));
        let mut h = HeaderMap::new();
        p.apply(Some(&hv("http://anything.test")), true, &mut h);
        assert_eq!(h.get(ACCESS_CONTROL_ALLOW_ORIGIN), Some(&hv("*")));
        assert!(h.get(ACCESS_CONTROL_ALLOW_CREDENTIALS).is_none());
        assert!(h.get(VARY).is_none());
    }

    #[test]
    fn proxied_responses_keep_upstream_cors_and_gain_exposed_headers() {
        let p = CorsPolicy::new(&cfg(&[], false));
        let mut h = HeaderMap::new();
        h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, hv("https://dash.example"));
        h.insert(
            ACCESS_CONTROL_EXPOSE_HEADERS,
            hv("X-Request-Id, retry-after"),
        );
        p.apply(Some(&hv("https://dash.example")), false, &mut h);
        assert_eq!(
            h.get(ACCESS_CONTROL_ALLOW_ORIGIN),
            Some(&hv("https://dash.example"))
        );
        assert_eq!(
            h.get(ACCESS_CONTROL_EXPOSE_HEADERS),
            Some(&hv(
                "X-Request-Id, retry-after, RateLimit, RateLimit-Policy, RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset, X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset"
            ))
        );
        // The upstream did not allow the origin: nothing is added.
        let mut h = HeaderMap::new();
        p.apply(Some(&hv("https://dash.example")), false, &mut h);
        assert!(h.is_empty());
    }

    #[test]
    fn preflight_needs_origin_and_request_method() {
        let mut h = HeaderMap::new();
        h.insert(ORIGIN, hv("https://dash.example"));
        assert!(!is_preflight(&Method::OPTIONS, &h));
        h.insert(ACCESS_CONTROL_REQUEST_METHOD, hv("GET"));
        assert!(is_preflight(&Method::OPTIONS, &h));
        assert!(!is_preflight(&Method::GET, &h));
    }
}

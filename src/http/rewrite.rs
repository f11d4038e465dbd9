//! What the middleware changes in a request before it passes it on: method overrides judged
//! and stripped, the headers some frameworks route on instead of the target removed, and the
//! canonical path put in place of the one sent.

use crate::decision::Settings;
use crate::methods::{At, MethodRules, Overrides, Refusal, Source};
use crate::path::Rejected;
use actix_web::dev::ServiceRequest;
use actix_web::http::header::HeaderName;
use actix_web::http::uri::PathAndQuery;
use actix_web::http::Uri;
use smallvec::SmallVec;

/// What to do about the method overrides `req` names (see [`crate::methods`]).
pub(super) fn overrides(settings: &Settings, req: &ServiceRequest) -> Overrides {
    let headers = req
        .headers()
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_bytes()));
    settings
        .methods
        .judge(headers, req.uri().query(), At::Gateway)
}

/// Remove the headers with which some frameworks route a request to another path
/// ([`crate::path::PATH_OVERRIDE_HEADERS`], in any spelling).
pub(super) fn strip_path_overrides(req: &mut ServiceRequest) {
    let named = req
        .headers()
        .keys()
        .any(|name| crate::path::is_path_override_header(name.as_str()));
    if !named {
        return;
    }
    let names: SmallVec<[HeaderName; 2]> = req
        .headers()
        .keys()
        .filter(|name| crate::path::is_path_override_header(name.as_str()))
        .cloned()
        .collect();
    for name in names {
        req.headers_mut().remove(name);
    }
}

/// Remove every override header and query parameter from `req`, so that what runs after the
/// limiter (the gateway's proxy, or the app) never sees them.
pub(super) fn strip_overrides(
    req: &mut ServiceRequest,
    rules: &MethodRules,
) -> Result<(), Refusal> {
    let names: SmallVec<[HeaderName; 2]> = req
        .headers()
        .keys()
        .filter(|name| rules.is_override_header(name.as_str()))
        .cloned()
        .collect();
    for name in names {
        req.headers_mut().remove(name);
    }
    let Some(query) = req.uri().query().and_then(|q| rules.strip_query(q)) else {
        return Ok(());
    };
    let pq = if query.is_empty() {
        req.path().to_owned()
    } else {
        format!("{}?{query}", req.path())
    };
    // The query is the request's own, less some parameters, so this cannot fail; if it did,
    // the request could not be forwarded without them, so it is refused.
    let unusable = || {
        let name = rules.params().next().unwrap_or("_method");
        Refusal::Unstrippable(Source::Param(name.into()))
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::try_from(pq).map_err(|_| unusable())?);
    let uri = Uri::from_parts(parts).map_err(|_| unusable())?;
    req.match_info_mut().get_mut().update(&uri);
    req.head_mut().uri = uri;
    Ok(())
}

/// Give the request its canonical path (the query unchanged), so that what runs after the
/// limiter — the gateway's proxy, or the app's own routes — sees the path that was decided on.
pub(super) fn rewrite_path(req: &mut ServiceRequest, path: &str) -> Result<(), Rejected> {
    let uri = req.uri();
    let pq = match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    // The canonical form is ASCII made of URI characters only, so this cannot fail; if it did,
    // the request could not be forwarded as decided, so it is refused rather than passed on.
    let unusable = Rejected {
        class: crate::path::Class::InvalidEscape,
        at: 0,
    };
    parts.path_and_query = Some(PathAndQuery::try_from(pq).map_err(|_| unusable)?);
    let uri = Uri::from_parts(parts).map_err(|_| unusable)?;
    req.match_info_mut().get_mut().update(&uri);
    req.head_mut().uri = uri;
    Ok(())
}

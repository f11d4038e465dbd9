//! RFC 9457 problem documents: every refusal and failure the gateway answers itself, and the
//! mark its own responses carry.

use actix_web::http::header::CONTENT_TYPE;
use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use serde::Serialize;

pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

/// Marks a response the gateway made itself (a refusal or an upstream failure), as opposed to
/// one the upstream sent; the CORS layer adds the allow-list's headers only to these.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GatewayMade;

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct Problem {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl Problem {
    pub(crate) fn rate_limited(retry_after: u64) -> Self {
        let unit = if retry_after == 1 {
            "second"
        } else {
            "seconds"
        };
        Self {
            kind: "urn:fleet-limiter:problem:rate-limited",
            title: "Too Many Requests",
            status: 429,
            detail: format!("Request rate limit exceeded; retry after {retry_after} {unit}."),
            retry_after: Some(retry_after),
        }
    }

    /// The store could not answer and a limiter with `on_store_error = "deny"` refused: the
    /// server's failure, not the caller's budget (that is [`Problem::rate_limited`]).
    pub(crate) fn store_unavailable(retry_after: u64) -> Self {
        let unit = if retry_after == 1 {
            "second"
        } else {
            "seconds"
        };
        Self {
            kind: "urn:fleet-limiter:problem:store-unavailable",
            title: "Service Unavailable",
            status: 503,
            detail: format!(
                "The rate limiter's store cannot answer, and this route is refused while it cannot (on_store_error = \"deny\"); this is not the client's budget; retry after {retry_after} {unit}."
            ),
            retry_after: Some(retry_after),
        }
    }

    /// Admission control turned the request away: every slot of its group was taken and the
    /// queue was full, or it waited the queue timeout for one (503); or its client address
    /// already held its share of the group's slots (429).
    pub(crate) fn overloaded(
        group: &str,
        reason: crate::metrics::ShedReason,
        retry_after: u64,
    ) -> Self {
        use crate::metrics::ShedReason;
        let unit = if retry_after == 1 {
            "second"
        } else {
            "seconds"
        };
        let why = match reason {
            ShedReason::QueueFull => "and the queue is full",
            ShedReason::QueueTimeout => "and none came free while it waited",
            ShedReason::ClientShare | ShedReason::BodyHold => {
                return Self {
                    kind: "urn:fleet-limiter:problem:client-share",
                    title: "Too Many Requests",
                    status: 429,
                    detail: format!(
                        "This client address already has as many requests in flight as one address may (admission group `{group}`, admission.client_share_percent); the others are being served; retry after {retry_after} {unit}."
                    ),
                    retry_after: Some(retry_after),
                }
            }
        };
        Self {
            kind: "urn:fleet-limiter:problem:overloaded",
            title: "Service Unavailable",
            status: 503,
            detail: format!(
                "The upstream API has as many requests in flight as it takes (admission group `{group}`) {why}; retry after {retry_after} {unit}."
            ),
            retry_after: Some(retry_after),
        }
    }

    /// A WebSocket handshake refused before the upstream saw it: as many upgraded connections
    /// are open as the gateway holds (503), or as this client address may hold (429).
    pub(crate) fn upgrade_refused(
        reason: crate::metrics::UpgradeRefusal,
        cap: usize,
        retry_after: u64,
    ) -> Self {
        use crate::metrics::UpgradeRefusal;
        match reason {
            UpgradeRefusal::MaxOpen => Self {
                kind: "urn:fleet-limiter:problem:websockets-full",
                title: "Service Unavailable",
                status: 503,
                detail: format!(
                    "The gateway has as many WebSockets open as it holds ({cap}, websocket.max_open); retry after {retry_after} seconds."
                ),
                retry_after: Some(retry_after),
            },
            UpgradeRefusal::MaxPerClient => Self {
                kind: "urn:fleet-limiter:problem:client-websockets",
                title: "Too Many Requests",
                status: 429,
                detail: format!(
                    "This client address has {cap} WebSockets open, as many as one address may (websocket.max_per_client); close one, or retry after {retry_after} seconds."
                ),
                retry_after: Some(retry_after),
            },
        }
    }

    pub(crate) fn bad_gateway(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:upstream-unavailable",
            title: "Bad Gateway",
            status: 502,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// A path with no canonical form (see [`crate::path`]), refused before any limiter; or, at
    /// the decision endpoint, a target that is not its own canonical form.
    pub(crate) fn non_canonical_path(rejected: &crate::path::Rejected) -> Self {
        let detail = if rejected.class.decision_only() {
            format!(
                "The request target contains {} (at byte {}). The proxy in front forwards the target as it was sent, and the upstream may route that spelling elsewhere than the path the rate limiter would read, so it is refused. Send the path in canonical form ({}).",
                rejected.class.describe(),
                rejected.at,
                rejected.class.as_str()
            )
        } else {
            format!(
                "The request path contains {} (at byte {}), which HTTP servers and routers read differently; this gateway does not forward it. Send the path without it ({}).",
                rejected.class.describe(),
                rejected.at,
                rejected.class.as_str()
            )
        };
        Self {
            kind: "urn:fleet-limiter:problem:non-canonical-path",
            title: "Bad Request",
            status: 400,
            detail,
            retry_after: None,
        }
    }

    /// A body a `body:` limiter must read that cannot be read with certainty (see
    /// [`crate::keys::body::Unreadable`]).
    pub(crate) fn unreadable_body(
        why: crate::keys::body::Unreadable,
        field: &str,
        max_bytes: usize,
    ) -> Self {
        use crate::keys::body::Unreadable;
        let (kind, title) = match why {
            Unreadable::MediaType | Unreadable::Charset | Unreadable::Encoding => (
                "urn:fleet-limiter:problem:unreadable-body",
                "Unsupported Media Type",
            ),
            Unreadable::TooLarge => (
                "urn:fleet-limiter:problem:unreadable-body",
                "Content Too Large",
            ),
            Unreadable::TooSlow => (
                "urn:fleet-limiter:problem:unreadable-body",
                "Request Timeout",
            ),
            _ => ("urn:fleet-limiter:problem:unreadable-body", "Bad Request"),
        };
        Self {
            kind,
            title,
            status: why.status(),
            detail: why.detail(field, max_bytes),
            retry_after: None,
        }
    }

    /// A method the resource does not take; the caller adds `Allow`.
    pub(crate) fn method_not_allowed(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:method-not-allowed",
            title: "Method Not Allowed",
            status: 405,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// A request whose method is not in `methods.allowed` (RFC 9110 §15.6.2: the service does
    /// not implement it for any resource). The caller adds `Allow`.
    pub(crate) fn unsupported_method(method: &str, allow: &str) -> Self {
        // A method is a token (the HTTP parser saw to it); only its length is the client's.
        let shown: String = method
            .chars()
            .take(crate::methods::MAX_METHOD_LEN)
            .collect();
        Self {
            kind: "urn:fleet-limiter:problem:unsupported-method",
            title: "Not Implemented",
            status: 501,
            detail: format!(
                "This gateway forwards only {allow} (methods.allowed); `{shown}` is not one of them, so the request was not forwarded."
            ),
            retry_after: None,
        }
    }

    /// A method override refused (see [`crate::methods`]).
    pub(crate) fn method_override(detail: String) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:method-override",
            title: "Bad Request",
            status: 400,
            detail,
            retry_after: None,
        }
    }

    pub(crate) fn gateway_timeout(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:upstream-timeout",
            title: "Gateway Timeout",
            status: 504,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// The client's request body did not arrive in time (its pace is in `detail`).
    pub(crate) fn request_timeout(detail: impl Into<String>) -> Self {
        Self {
            kind: "urn:fleet-limiter:problem:request-timeout",
            title: "Request Timeout",
            status: 408,
            detail: detail.into(),
            retry_after: None,
        }
    }

    pub(crate) fn into_response(self) -> HttpResponse {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_string(&self).unwrap_or_default();
        let mut res = HttpResponse::build(status)
            .insert_header((CONTENT_TYPE, PROBLEM_JSON))
            .body(body);
        res.extensions_mut().insert(GatewayMade);
        res
    }
}

//! The request body, read for `body:<field>` keys on the routes a `body:` limiter meters (by the
//! gateway and the middleware alike), and put back for what runs after the limiter; or the
//! reason it cannot be read with certainty ([`crate::keys::body::Unreadable`]), for which the
//! middleware refuses the request.

use super::request::only_value;
use crate::decision::{BodyValue, Settings};
use crate::keys::body::Unreadable;
use actix_web::dev::ServiceRequest;
use actix_web::http::Method;
use actix_web::HttpMessage;
use futures_util::StreamExt;
use smallvec::SmallVec;
use std::sync::Arc;

/// The values of `fields` in the request's body, for `body:<field>` keys, with the body put
/// back exactly as it came (the same bytes, in the same chunks) for whatever runs after the
/// limiter: the gateway's proxy, or the app. Or the reason the body cannot be read with
/// certainty, and the request is refused (see [`crate::keys::body::Unreadable`]): a body of
/// another type or encoding, declared or found larger than `server.body_key_max_bytes`, not
/// parsed as a whole, the field in an ambiguous shape, or arriving slower than the pace rules
/// allow (`server.body_timeout` for the next chunk and in all, `server.body_min_rate` on
/// average after the first 5 s of waiting). An empty body names no field, whatever its type.
pub(super) async fn read(
    req: &mut ServiceRequest,
    settings: &Settings,
    fields: &[Arc<str>],
) -> Result<Vec<BodyValue>, Unreadable> {
    use crate::http::proxy::pace::{BodyPace, BodyRules};
    use crate::keys::body;
    if req.head().upgrade() || req.method() == Method::CONNECT {
        return Ok(Vec::new());
    }
    let headers = req.headers();
    let format = body::format_of(
        only_value(headers, "content-type"),
        only_value(headers, "content-encoding"),
    );
    let max = settings.body_key_max_bytes;
    let declared = only_value(headers, "content-length").map(|v| {
        std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    });
    match declared {
        // No body at all: nothing names a field.
        Some(Some(0)) => return Ok(Vec::new()),
        Some(Some(n)) if n > max as u64 => return Err(Unreadable::TooLarge),
        Some(Some(_)) => {
            format?;
        }
        // A length actix-web let through but that does not parse here: not read with certainty.
        Some(None) => return Err(Unreadable::Malformed),
        // Chunked, or no body: read it to know.
        None => {}
    }
    let mut payload = req.take_payload();
    let mut chunks: Vec<bytes::Bytes> = Vec::new();
    let mut pace = BodyPace::new(BodyRules::new(
        settings.body_key_timeout,
        settings.body_key_min_rate,
    ));
    let read = async {
        let mut seen = 0usize;
        loop {
            let (allowed, _) = pace.allowance();
            let asked = std::time::Instant::now();
            match actix_web::rt::time::timeout(allowed, payload.next()).await {
                Err(_) => return Err(Unreadable::TooSlow),
                Ok(None) => return Ok(()),
                Ok(Some(Ok(chunk))) => {
                    pace.chunk(asked.elapsed(), chunk.len() as u64);
                    seen = seen.saturating_add(chunk.len());
                    chunks.push(chunk);
                    if seen > max {
                        return Err(Unreadable::TooLarge);
                    }
                }
                Ok(Some(Err(_))) => return Err(Unreadable::Broken),
            }
        }
    };
    // However steady the pace, the whole body comes within one body timeout.
    actix_web::rt::time::timeout(settings.body_key_timeout, read)
        .await
        .unwrap_or(Err(Unreadable::TooSlow))?;
    let whole: Vec<u8> = chunks.concat();
    let values = if whole.is_empty() {
        Vec::new()
    } else {
        let format = format?;
        let names: SmallVec<[&str; 2]> = fields.iter().map(|f| &**f).collect();
        fields
            .iter()
            .zip(body::values(format, &whole, &names)?)
            .filter_map(|(field, value)| {
                value.map(|value| BodyValue {
                    field: field.clone(),
                    value,
                })
            })
            .collect()
    };
    // Put the body back, in the chunks it came in.
    let read_back = futures_util::stream::iter(chunks.into_iter().map(Ok));
    type Body = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<bytes::Bytes, actix_web::error::PayloadError>>>,
    >;
    let rest: Body = Box::pin(read_back);
    req.set_payload(actix_web::dev::Payload::Stream { payload: rest });
    Ok(values)
}

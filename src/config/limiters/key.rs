//! A limiter's `key`: the key kinds a configuration may name, each checked as written.

use super::*;

/// Longest header name a `header:<name>` key may name.
pub(super) const MAX_KEY_HEADER_NAME: usize = 64;

/// Headers whose values a client or the gateway itself controls in other ways: keying on them
/// would let the client choose its bucket, or would duplicate a key kind that does it right.
pub(super) const RESERVED_KEY_HEADERS: &[&str] = &[
    "authorization",
    "cookie",
    "host",
    "x-forwarded-for",
    "forwarded",
    "x-agent-id",
    "connection",
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
];

/// `ip`, `ip+agent`, `user-or-ip`, `credential`, `global`, `header:<name>` (the name
/// lower-cased), or `body:<field>` (the field as written).
pub(crate) fn parse_key(s: &str) -> Result<KeyKind, String> {
    let kinds = "use ip, ip+agent, user-or-ip, credential, global, header:<name> (e.g. \"header:x-tenant-id\"), client-header:<name> (e.g. \"client-header:x-api-key\"), body:<field> (e.g. \"body:email\"), body:<field>+ip (e.g. \"body:email+ip\"), claim:<name> (e.g. \"claim:org_id\") or ip+path:<name> (e.g. \"ip+path:id\")";
    if let Some(name) = s.strip_prefix("ip+path:") {
        let name = name.trim();
        if !crate::policy::valid_param_name(name) {
            return Err(format!(
                "`{s}`: a path parameter is named as the routes name it, `{{name}}`: 1-32 characters of a-z, 0-9 and `_`, starting with a letter, e.g. \"ip+path:id\" for \"POST /api/fleet/agents/{{id}}/checkin\""
            ));
        }
        return Ok(KeyKind::IpPath(Arc::from(name)));
    }
    if let Some(name) = s.strip_prefix("path:") {
        return Err(format!(
            "`{s}`: an id in the path is the client's to choose, so it is keyed with the client's address, as the agent id is: key = \"ip+path:{}\"",
            name.trim()
        ));
    }
    if let Some(name) = s.strip_prefix("claim:") {
        let name = name.trim();
        if !crate::identity::valid_claim_name(name) {
            return Err(format!(
                "`{s}`: a claim name is 1-64 characters of A-Z, a-z, 0-9, `.`, `_`, `:` and `-`, named as the verified token spells it, e.g. \"claim:org_id\""
            ));
        }
        if crate::identity::REGISTERED_CLAIMS.contains(&name) {
            return Err(format!(
                "`{s}`: `{name}` is a registered claim, not a principal; key on the subject with key = \"user-or-ip\", or name an organisation claim, e.g. \"claim:org_id\""
            ));
        }
        return Ok(KeyKind::Claim(Arc::from(name)));
    }
    if let Some(field) = s.strip_prefix("body:") {
        let field = field.trim();
        if let Some(field) = field.strip_suffix("+ip") {
            if !crate::keys::body::valid_field(field) {
                return Err(format!(
                    "`{s}`: a body field is 1-{} characters of A-Z, a-z, 0-9, `_`, `.` and `-`, named as the JSON or form body spells it, e.g. \"body:email+ip\"",
                    crate::keys::body::MAX_FIELD_LEN
                ));
            }
            return Ok(KeyKind::BodyIp(Arc::from(field)));
        }
        if !crate::keys::body::valid_field(field) {
            return Err(format!(
                "`{s}`: a body field is 1-{} characters of A-Z, a-z, 0-9, `_`, `.` and `-`, named as the JSON or form body spells it, e.g. \"body:email\"",
                crate::keys::body::MAX_FIELD_LEN
            ));
        }
        return Ok(KeyKind::Body(Arc::from(field)));
    }
    let (client, header) = match (s.strip_prefix("client-header:"), s.strip_prefix("header:")) {
        (Some(n), _) => (true, Some(n)),
        (None, n) => (false, n),
    };
    if let Some(name) = header {
        let name = name.trim().to_ascii_lowercase();
        let token = !name.is_empty()
            && name.len() <= MAX_KEY_HEADER_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !token {
            return Err(format!(
                "`{s}`: a header name is 1-{MAX_KEY_HEADER_NAME} characters of a-z, 0-9, `-` and `_`, e.g. \"header:x-tenant-id\""
            ));
        }
        if RESERVED_KEY_HEADERS.contains(&name.as_str()) {
            return Err(format!(
                "`{s}`: `{name}` cannot key a limiter (the client or the gateway sets it); name the header your trusted proxy sets, e.g. \"header:x-tenant-id\", or use the key kind made for it"
            ));
        }
        return Ok(if client {
            KeyKind::ClientHeader(Arc::from(name.as_str()))
        } else {
            KeyKind::Header(Arc::from(name.as_str()))
        });
    }
    let kind =
        match s {
            "ip" => KeyKind::Ip,
            "ip+agent" => KeyKind::IpAgent,
            "user-or-ip" => KeyKind::UserOrIp,
            "credential" => KeyKind::Credential,
            "global" => KeyKind::Global,
            "header" => return Err(
                "`header` needs the header's name: \"header:<name>\", e.g. \"header:x-tenant-id\""
                    .to_owned(),
            ),
            "body" => {
                return Err(
                    "`body` needs the body field's name: \"body:<field>\", e.g. \"body:email\""
                        .to_owned(),
                )
            }
            "ip+path" | "path" => {
                return Err(
                    "`ip+path` needs the path parameter's name: \"ip+path:<name>\", e.g. \"ip+path:id\" for routes such as \"POST /api/fleet/agents/{id}/checkin\""
                        .to_owned(),
                )
            }
            "claim" => {
                return Err(
                    "`claim` needs the claim's name: \"claim:<name>\", e.g. \"claim:org_id\""
                        .to_owned(),
                )
            }
            other => return Err(format!("`{other}` is not a key kind; {kinds}")),
        };
    Ok(kind)
}

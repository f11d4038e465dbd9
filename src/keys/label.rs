//! What the top-talker lists keep of a bucket's principal ([`Seed`]) and the label they show
//! for it ([`label`]): who it is, with no secret.

use super::{normalize_ip, KeyKind, Principal};
use std::net::IpAddr;
use std::sync::Arc;

/// What the top-talker lists keep of a bucket's principal, to name it when asked: the text of a
/// value that is no secret (a verified user, a proxy-set header's value, a claim), else the
/// kind, the client's address and whether the request carried the kind's own value. Made on
/// the request path for a bucket new to a list, so it allocates only for the text kinds.
#[derive(Debug, Clone)]
pub(crate) enum Seed {
    /// The label already made, and the address it names, if any.
    Text(Arc<str>, Option<Arc<str>>),
    Keyed {
        kind: KeyKind,
        ip: IpAddr,
        v6_prefix: u8,
        present: bool,
    },
}

impl Seed {
    pub(crate) fn of(kind: &KeyKind, p: &Principal<'_>, ip: IpAddr, v6_prefix: u8) -> Seed {
        let text = match kind {
            KeyKind::UserOrIp => p.user.map(|u| format!("user {u}")),
            KeyKind::Header(name) => p.header.map(|v| format!("{name}: {v}")),
            KeyKind::Claim(name) => match (p.claim, p.user) {
                (Some(v), _) => Some(format!("{name} {v}")),
                (None, Some(u)) => Some(format!("user {u}")),
                (None, None) => None,
            },
            _ => None,
        };
        if let Some(t) = text {
            return Seed::Text(Arc::from(t), None);
        }
        let present = match kind {
            KeyKind::IpAgent => p.agent_id.is_some(),
            KeyKind::Credential => p.credential.is_some(),
            KeyKind::ClientHeader(_) => p.header.is_some(),
            KeyKind::Body(_) | KeyKind::BodyIp(_) => p.body.is_some(),
            KeyKind::IpPath(_) => p.path.is_some(),
            _ => false,
        };
        Seed::Keyed {
            kind: kind.clone(),
            ip,
            v6_prefix,
            present,
        }
    }

    /// The label: see [`label`]; `tag` names the bucket.
    pub(crate) fn label(&self, tag: &str) -> (String, Option<String>) {
        match self {
            Seed::Text(t, address) => (t.to_string(), address.as_deref().map(str::to_owned)),
            Seed::Keyed {
                kind,
                ip,
                v6_prefix,
                present,
            } => {
                let ip = normalize_ip(*ip, *v6_prefix);
                let marker = present.then_some("");
                let p = Principal {
                    ip: &ip,
                    agent_id: marker,
                    credential: marker,
                    header: marker,
                    body: marker,
                    path: marker,
                    ..Principal::default()
                };
                label(kind, &p, tag)
            }
        }
    }
}

/// Who a bucket of `kind` belongs to, for the top-talker lists: the principal as an operator
/// reads it, with no secret, and the address when the bucket is keyed on it. A value that may
/// be a secret or that the client chose (an agent id, a token, a client's key header, a body
/// value) is named by `tag`, the first hex digits of the bucket's own digest (the same digest
/// the refusal log and `explain` show), never by the value; nothing is hashed again.
pub(crate) fn label(kind: &KeyKind, p: &Principal<'_>, tag: &str) -> (String, Option<String>) {
    let addr = || Some(p.ip.to_owned());
    let ip = || (p.ip.to_owned(), addr());
    match kind {
        KeyKind::Ip => ip(),
        KeyKind::IpAgent => match p.agent_id {
            Some(_) => (format!("agent #{tag} at {}", p.ip), None),
            None => (format!("{} (no agent id)", p.ip), None),
        },
        KeyKind::UserOrIp => match p.user {
            Some(u) => (format!("user {u}"), None),
            None => ip(),
        },
        KeyKind::Credential => match p.credential {
            Some(_) => (format!("credential #{tag}"), None),
            None => ip(),
        },
        KeyKind::Header(name) => match p.header {
            Some(v) => (format!("{name}: {v}"), None),
            None => ip(),
        },
        KeyKind::ClientHeader(name) => match p.header {
            Some(_) => (format!("{name} #{tag}"), None),
            None => ip(),
        },
        KeyKind::Body(field) => match p.body {
            Some(_) => (format!("body {field} #{tag}"), None),
            None => ip(),
        },
        KeyKind::BodyIp(field) => match p.body {
            Some(_) => (format!("body {field} #{tag} at {}", p.ip), None),
            None => ip(),
        },
        KeyKind::IpPath(name) => match p.path {
            Some(_) => (format!("{name} #{tag} at {}", p.ip), None),
            None => ip(),
        },
        KeyKind::Claim(name) => match (p.claim, p.user) {
            (Some(v), _) => (format!("{name} {v}"), None),
            (None, Some(u)) => (format!("user {u}"), None),
            (None, None) => ip(),
        },
        KeyKind::Global => ("everyone".to_owned(), None),
    }
}

//! The checks across limiters: a key the client chooses needs an address ceiling beside it, a
//! lockout on an account a per-account ceiling, and routes of one group a clear precedence.

use super::*;
use crate::identity::Credential;

/// The first request an enforcing limiter keyed on a value the client chooses meters with no
/// enforcing limiter keyed on the client's address beside it (see [`check_client_chosen_keys`]):
/// the limiter's index, the request, and the credential it carries. `None` when every such
/// request is guarded, as a configuration must have it to load.
pub(crate) fn unguarded_client_chosen_key(
    limiters: &[LimiterSpec],
) -> Option<(usize, String, Credential)> {
    let client_chosen = |l: &LimiterSpec| {
        matches!(
            l.key,
            KeyKind::IpAgent
                | KeyKind::Credential
                | KeyKind::Header(_)
                | KeyKind::ClientHeader(_)
                | KeyKind::Body(_)
                | KeyKind::BodyIp(_)
                | KeyKind::IpPath(_)
        )
    };
    let policy = crate::policy::Policy::new(limiters.to_vec());
    policy.first_unguarded(
        |l| l.mode == Mode::Enforce && client_chosen(l),
        |g, l| {
            g.mode == Mode::Enforce
                && g.key == KeyKind::Ip
                && (g.new_agents.is_none() || l.key == KeyKind::IpAgent)
        },
    )
}

/// Key kinds whose value the client chooses: the agent id (`ip+agent`), the Bearer token
/// (`credential`) and any header (`header:<name>`: nginx and Caddy pass a client's headers on,
/// so "set by the trusted proxy" is not a guarantee). A client varying the value would get a
/// fresh bucket on every request, so an enforcing limiter with one of these keys is allowed only
/// where, on every request it meters, an enforcing limiter keyed on the client's address meters
/// the request too (in another group, so both apply): varying the value then spends the
/// address's budget. For `ip+agent` the address limiter may meter new agent ids only
/// (`meter = "new-agents"`, the `agent-ip` ceiling); for the others it must meter every request,
/// since a known agent id would skip a new-agents ceiling. The check asks the real route picker
/// ([`Policy::first_unguarded`]), so precedence, exceptions and credential kinds count exactly
/// as they do for requests. A limiter in `shadow` mode refuses nothing and needs no ceiling.
pub(in crate::config) fn check_client_chosen_keys(
    limiters: &[LimiterSpec],
    ctx: &Ctx,
) -> Result<(), ConfigError> {
    let Some((i, request, cred)) = unguarded_client_chosen_key(limiters) else {
        return Ok(());
    };
    let Some(l) = limiters.get(i) else {
        return Ok(());
    };
    let value = match l.key {
        KeyKind::IpAgent => "the agent id (X-Agent-ID)",
        KeyKind::Credential => "the Bearer token",
        KeyKind::Body(_) | KeyKind::BodyIp(_) => "a field of the request body",
        KeyKind::IpPath(_) => "an id in the request's path",
        _ => "a header (nginx and Caddy pass a client's own headers on)",
    };
    let key = l.key.to_string();
    let with = match cred {
        Credential::None => "",
        Credential::ApiKey => " (with an API key)",
        Credential::CliToken => " (with a CLI token)",
        Credential::VerifiedUser => " (from a verified user)",
    };
    let routes: Vec<String> = l.routes.iter().map(|r| format!("\"{r}\"")).collect();
    let builtin_ceiling = limiters
        .iter()
        .any(|c| &*c.name == super::ceiling::AGENT_IP);
    let example = if &*l.name == super::ceiling::AGENT_DEVICE && builtin_ceiling {
        "set [limiters.agent-ip] mode = \"enforce\": agent-ip is the ceiling made for agent-device"
            .to_owned()
    } else if l.key == KeyKind::IpAgent {
        format!(
            "e.g. [limiters.{}-ip] with key = \"ip\", meter = \"new-agents\", group = \"{}-ip\", routes = [{}] and its own limit",
            l.name,
            l.name,
            routes.join(", ")
        )
    } else {
        format!(
            "e.g. [limiters.{}-ip] with key = \"ip\", group = \"{}-ip\", routes = [{}] and its own limit",
            l.name,
            l.name,
            routes.join(", ")
        )
    };
    Err(ctx.err(
        &format!("limiters.{}.key", l.name),
        format!(
            "`{key}` keys on {value}, which the client chooses, so each new value would get a fresh bucket; `{request}`{with} is metered by `{}` with no enforcing limiter keyed on the client's address beside it. Add one in another group that meters every request this one meters (its `except` list and the more specific routes of its own group must leave none of them out): {example}",
            l.name,
        ),
    ))
}

/// A lockout keyed on what a request targets alone (`body:<field>`) would let a stranger lock
/// the owner out: a few wrong answers from anywhere lock the account for everyone. So a lockout
/// on a body key is refused unless the key is `body:<field>+ip` (the account and the client's
/// address together), and an enforcing one needs a per-account ceiling beside it: an enforcing
/// limiter keyed `body:<field>` on the same field, without a lockout, in another group, that
/// meters every request the lock meters. A guesser spread over many addresses meets that
/// ceiling, which refuses one request's worth at a time and never locks.
pub(in crate::config) fn check_lockouts(
    limiters: &[LimiterSpec],
    ctx: &Ctx,
) -> Result<(), ConfigError> {
    if let Some(l) = limiters
        .iter()
        .find(|l| matches!(l.key, KeyKind::Body(_)) && l.quota.lockout().is_some())
    {
        let field = l.key.body_field().unwrap_or("email");
        return Err(ctx.err(
            &format!("limiters.{}.lockout", l.name),
            format!(
                "a lockout keyed on `{}` alone lets anyone lock the account's owner out with a few wrong answers from anywhere; key the lock on the account and the address together (key = \"body:{field}+ip\"), and keep a per-account ceiling without a lockout beside it (e.g. [limiters.{}-ceiling] with key = \"body:{field}\", group = \"{}-ceiling\", the same routes, count = \"failed\" and a larger limit)",
                l.key, l.name, l.name
            ),
        ));
    }
    let policy = crate::policy::Policy::new(limiters.to_vec());
    let unguarded = policy.first_unguarded(
        |l| {
            l.mode == Mode::Enforce
                && matches!(l.key, KeyKind::BodyIp(_))
                && l.quota.lockout().is_some()
        },
        |g, l| {
            g.mode == Mode::Enforce
                && g.quota.lockout().is_none()
                && matches!(&g.key, KeyKind::Body(f) if Some(&**f) == l.key.body_field())
        },
    );
    let Some((i, request, _)) = unguarded else {
        return Ok(());
    };
    let Some(l) = limiters.get(i) else {
        return Ok(());
    };
    let field = l.key.body_field().unwrap_or("email");
    let routes: Vec<String> = l.routes.iter().map(|r| format!("\"{r}\"")).collect();
    Err(ctx.err(
        &format!("limiters.{}.key", l.name),
        format!(
            "`{}` locks each address out of an account on its own, so a guesser spread over many addresses is held by nothing per account; `{request}` is metered by `{}` with no enforcing per-account ceiling beside it. Add one in another group, without a lockout, that meters every request this one meters: e.g. [limiters.{}-ceiling] with key = \"body:{field}\", group = \"{}-ceiling\", routes = [{}], count = \"failed\" and a larger limit",
            l.key,
            l.name,
            l.name,
            l.name,
            routes.join(", ")
        ),
    ))
}

/// Within one group the most specific route wins; two routes of equal specificity that can
/// match the same request leave no winner, which is an error.
pub(super) fn check_precedence(limiters: &[LimiterSpec], ctx: &Ctx) -> Result<(), ConfigError> {
    for (i, a) in limiters.iter().enumerate() {
        for b in &limiters[i + 1..] {
            if a.group != b.group {
                continue;
            }
            for ra in &a.routes {
                for rb in &b.routes {
                    if ra.overlaps(rb) && ra.specificity() == rb.specificity() {
                        return Err(ctx.err(
                            &format!("limiters.{}.routes", b.name),
                            format!(
                                "route `{rb}` overlaps `{ra}` of limiter `{}` in group `{}` with the same specificity, so neither takes precedence; make one route more specific, or put the limiters in different groups (they then both apply)",
                                a.name, a.group
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

//! The label values of the metric families: each enum owns its names (`as_str`, `ALL`), and
//! the label sets the families are keyed by.

use prometheus_client::encoding::EncodeLabelSet;

/// What one limiter's verdict came to: the `outcome` label of `fleet_limiter_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimiterFate {
    /// Within budget.
    Allowed,
    /// Over budget, and the limiter enforces: the request got a 429.
    Refused,
    /// Over budget in shadow mode: counted and logged, the request went through.
    ShadowRefused,
    /// The store failed and `on_store_error = "allow"` let the request through.
    StoreErrorAllowed,
    /// The store failed and `on_store_error = "deny"` answered no.
    StoreErrorRefused,
    /// The store failed and `on_store_error = "local"` allowed on this instance's own bucket.
    LocalAllowed,
    /// The store failed and `on_store_error = "local"` found this instance's own bucket over
    /// budget (the request was refused when the limiter enforces).
    LocalRefused,
}

impl LimiterFate {
    pub const ALL: [LimiterFate; 7] = [
        LimiterFate::Allowed,
        LimiterFate::Refused,
        LimiterFate::ShadowRefused,
        LimiterFate::StoreErrorAllowed,
        LimiterFate::StoreErrorRefused,
        LimiterFate::LocalAllowed,
        LimiterFate::LocalRefused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LimiterFate::Allowed => "allowed",
            LimiterFate::Refused => "refused",
            LimiterFate::ShadowRefused => "shadow_refused",
            LimiterFate::StoreErrorAllowed => "store_error_allowed",
            LimiterFate::StoreErrorRefused => "store_error_refused",
            LimiterFate::LocalAllowed => "local_allowed",
            LimiterFate::LocalRefused => "local_refused",
        }
    }

    /// The fate of a verdict counted on this instance's own bucket while the store failed.
    pub fn local(allowed: bool) -> Self {
        if allowed {
            LimiterFate::LocalAllowed
        } else {
            LimiterFate::LocalRefused
        }
    }

    /// The fate of one limiter's verdict: `allowed`, whether the store failed, and whether the
    /// limiter enforces (an over-budget verdict of a limiter that does not is a shadow refusal).
    pub fn of(allowed: bool, store_error: bool, enforces: bool) -> Self {
        match (store_error, allowed, enforces) {
            (true, true, _) => LimiterFate::StoreErrorAllowed,
            (true, false, _) => LimiterFate::StoreErrorRefused,
            (false, true, _) => LimiterFate::Allowed,
            (false, false, true) => LimiterFate::Refused,
            (false, false, false) => LimiterFate::ShadowRefused,
        }
    }
}

/// What limiting did with a whole request: the `outcome` label of `fleet_limiter_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFate {
    /// Every enforcing limiter allowed (shadow refusals included).
    Forwarded,
    /// An enforcing limiter refused: 429.
    Refused,
    /// Refused only because the store could not answer (`on_store_error = "deny"`): 503.
    StoreUnavailable,
    /// No limiter applies to the route (or limiting is switched off).
    Unmetered,
}

impl RequestFate {
    pub(super) const ALL: [RequestFate; 4] = [
        RequestFate::Forwarded,
        RequestFate::Refused,
        RequestFate::StoreUnavailable,
        RequestFate::Unmetered,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            RequestFate::Forwarded => "forwarded",
            RequestFate::Refused => "refused",
            RequestFate::StoreUnavailable => "store_unavailable",
            RequestFate::Unmetered => "unmetered",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LimiterLabel {
    pub(super) limiter: String,
}

/// What became of one give-back (a `count = "failed"` or `"succeeded"` limiter returning an
/// admitted request): the `result` label of `fleet_limiter_give_backs_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveBackResult {
    /// The store took it back.
    Done,
    /// The store could not (an error or a timeout): the request stays counted.
    Failed,
    /// Too many give-backs were already under way: dropped, the request stays counted.
    Dropped,
}

impl GiveBackResult {
    pub const ALL: [GiveBackResult; 3] = [
        GiveBackResult::Done,
        GiveBackResult::Failed,
        GiveBackResult::Dropped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GiveBackResult::Done => "done",
            GiveBackResult::Failed => "failed",
            GiveBackResult::Dropped => "dropped",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LimiterResultLabels {
    pub(super) limiter: String,
    pub(super) result: &'static str,
}

/// A shaped route (`[shaping.routes.<name>]`): at most 64 names, from the configuration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RouteLabel {
    pub(super) route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GroupLabel {
    pub(super) group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GroupReasonLabels {
    pub(super) group: String,
    pub(super) reason: &'static str,
}

/// Why admission control turned a request away or cut it off: the `reason` label of
/// `fleet_limiter_admission_shed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShedReason {
    /// Every slot was taken and the queue was full: refused at once (503).
    QueueFull,
    /// It waited in the queue for `queue_timeout` and no slot came free (503).
    QueueTimeout,
    /// Its client address already held or waited for its share of the group's slots (429).
    ClientShare,
    /// It held a slot and was still sending its body after `body_hold` of waiting for it:
    /// cut off (408), its slot given back.
    BodyHold,
}

impl ShedReason {
    pub const ALL: [ShedReason; 4] = [
        ShedReason::QueueFull,
        ShedReason::QueueTimeout,
        ShedReason::ClientShare,
        ShedReason::BodyHold,
    ];

    /// Shed because the group is overloaded (503), not because of the client's own share (429)
    /// or its body (408).
    pub(crate) fn is_overload(self) -> bool {
        matches!(self, ShedReason::QueueFull | ShedReason::QueueTimeout)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::QueueTimeout => "queue_timeout",
            ShedReason::ClientShare => "client_share",
            ShedReason::BodyHold => "body_hold",
        }
    }
}

/// Which pace rule a client's request body broke when it was cut off: the `rule` label of
/// `fleet_limiter_client_body_timeouts_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyTimeout {
    /// Nothing came for `server.body_timeout`.
    Silence,
    /// The average fell below `server.body_min_rate` after the grace period.
    Rate,
}

/// Why a WebSocket handshake was refused before the upstream saw it: the `reason` label of
/// `fleet_limiter_upgrades_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpgradeRefusal {
    /// As many upgraded connections were open as `websocket.max_open` allows (503).
    MaxOpen,
    /// The client address held `websocket.max_per_client` of them (429).
    MaxPerClient,
}

impl UpgradeRefusal {
    pub const ALL: [UpgradeRefusal; 2] = [UpgradeRefusal::MaxOpen, UpgradeRefusal::MaxPerClient];

    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeRefusal::MaxOpen => "max_open",
            UpgradeRefusal::MaxPerClient => "max_per_client",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LimiterOutcomeLabels {
    pub(super) limiter: String,
    pub(super) outcome: &'static str,
}

/// One label, `name="value"`, for families whose series are all known up front.
pub(super) type OneLabel = [(&'static str, &'static str); 1];
/// Two labels, the same.
pub(super) type TwoLabels = [(&'static str, &'static str); 2];

/// `fleet_limiter_rls_decisions_total`: the domain (a configured one, or `unknown`), the rule
/// (its descriptor path, or `none`) and what the descriptor was answered.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RlsLabels {
    pub(super) domain: String,
    pub(super) rule: String,
    pub(super) outcome: &'static str,
}

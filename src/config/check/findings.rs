//! What the judge finds about a limiter, as numbers: each finding's class (`UNSAFE`, at risk,
//! a warning); `wording.rs` puts them in sentences.

use super::types::{Status, Workload};
use std::num::NonZeroU64;
use std::time::Duration;

/// One thing the judge found, with the numbers its sentence needs.
#[derive(Debug, Clone)]
pub(super) enum Finding {
    /// The known-agents table's protected half is smaller than the declared fleet.
    TableProtected {
        protected: u64,
        capacity: u64,
        max_agents: u64,
    },
    /// The known-agents table's first-sighting half holds fewer than two sites.
    TableProbation {
        probation: u64,
        capacity: u64,
        site: u64,
    },
    /// A `new-agents` ceiling remembers fewer agents per IP than a site has.
    MaxKnown { max_known: u32, site: NonZeroU64 },
    /// A `new-agents` ceiling forgets an agent before its next request.
    KnownFor { known_for: Duration, gap: u64 },
    /// Clients that would fit alone share one IP bucket for want of a token verifier.
    SharedIp {
        sharers: u64,
        unit: &'static str,
        amount: f64,
        refill: f64,
        workload: Workload,
    },
    /// The bucket refills slower than the cadence asks.
    RefillTooSlow {
        refill: f64,
        amount: f64,
        workload: Workload,
        per_bucket: String,
    },
    /// A refused agent can go longer than the heartbeat timeout without a heartbeat.
    HeartbeatGap {
        wait: f64,
        gap: f64,
        carries_heartbeat: bool,
        timeout: NonZeroU64,
    },
    /// A request costs more than the whole budget: none can ever pass (a limiter built in
    /// code; a configuration file with such a cost does not load).
    NothingFits { cost: u32, limit: u32 },
    /// A limiter keyed on what a request targets (a header, a field of the body) names itself in
    /// its answers: a client can tell its refusals from the address limiter's.
    Discloses { key: String },
    /// Under [`MIN_IDLE_HEADROOM`] over the agents' idle cadence.
    ThinHeadroom { headroom: f64 },
    /// The bucket holds less than a site's burst.
    Burst {
        site: NonZeroU64,
        limit: u32,
        burst: u64,
        worst: f64,
    },
}

impl Finding {
    /// The class of the finding, for a limiter that enforces.
    pub(super) fn status(&self) -> Status {
        match self {
            Finding::SharedIp { .. } => Status::AtRisk,
            Finding::ThinHeadroom { .. } | Finding::Discloses { .. } => Status::Warning,
            _ => Status::Unsafe,
        }
    }
}

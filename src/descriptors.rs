//! The process's open-file-descriptor limit (`RLIMIT_NOFILE`), raised to what the system allows
//! when the gateway starts.
//!
//! Every connection the gateway holds is a descriptor: a client's, an upstream's (pooled or
//! spliced to a WebSocket), the store's. Most systems start a process with a soft limit of
//! 1024 and a much higher hard limit; a process may raise its own soft limit up to the hard one
//! without privileges, as Go programs, nginx (`worker_rlimit_nofile`) and systemd services
//! (`LimitNOFILE`) do. The gateway raises it at start and derives the WebSocket cap from what it
//! got ([`crate::config::websocket::WebsocketConfig::caps`]).

/// The most the soft limit is raised to, even when the hard limit is higher or unlimited:
/// Linux's default `fs.nr_open`, which a higher value could not be set past anyway.
pub(crate) const MOST: u64 = 1 << 20;

/// The descriptor limit before and after [`raise`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Limit {
    /// The soft limit the process started with (`None`: unlimited or unknown).
    pub before: Option<u64>,
    /// The soft limit now.
    pub soft: Option<u64>,
    /// The hard limit (`None`: unlimited or unknown).
    pub hard: Option<u64>,
    /// Why the soft limit could not be raised, when it could not.
    pub refused: Option<String>,
}

impl Limit {
    /// Whether [`raise`] changed the soft limit.
    #[cfg(test)]
    pub(crate) fn raised(&self) -> bool {
        self.soft != self.before
    }
}

/// The soft limit a process with limits `soft` and `hard` raises itself to: the hard limit, at
/// most [`MOST`], and never lower than it is.
pub(crate) fn target(soft: Option<u64>, hard: Option<u64>) -> Option<u64> {
    let want = hard.map_or(MOST, |h| h.min(MOST));
    match soft {
        None => None,
        Some(s) if s >= want => None,
        Some(_) => Some(want),
    }
}

/// Raise the soft descriptor limit to the hard one (at most [`MOST`]) and report both.
#[cfg(unix)]
pub(crate) fn raise() -> Limit {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    let mut limit = Limit {
        before: now.current,
        soft: now.current,
        hard: now.maximum,
        refused: None,
    };
    if let Some(want) = target(now.current, now.maximum) {
        let new = Rlimit {
            current: Some(want),
            maximum: now.maximum,
        };
        match setrlimit(Resource::Nofile, new) {
            Ok(()) => limit.soft = getrlimit(Resource::Nofile).current,
            Err(e) => limit.refused = Some(e.to_string()),
        }
    }
    limit
}

/// Elsewhere the limit is unknown and left alone.
#[cfg(not(unix))]
pub fn raise() -> Limit {
    Limit {
        before: None,
        soft: None,
        hard: None,
        refused: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one_within_bounds() {
        assert_eq!(target(Some(1024), Some(524_288)), Some(524_288));
        assert_eq!(target(Some(1024), None), Some(MOST), "unlimited hard");
        assert_eq!(target(Some(1024), Some(u64::MAX)), Some(MOST));
        assert_eq!(target(Some(4096), Some(4096)), None, "already there");
        assert_eq!(target(Some(MOST * 2), None), None, "never lowered");
        assert_eq!(target(None, None), None, "unlimited soft");
    }

    #[cfg(unix)]
    #[test]
    fn raising_leaves_the_soft_limit_at_least_where_it_was() {
        let limit = raise();
        assert!(
            limit.soft >= limit.before || limit.soft.is_none(),
            "{limit:?}"
        );
        // Raising again changes nothing.
        let again = raise();
        assert!(!again.raised(), "{again:?}");
        assert_eq!(again.soft, limit.soft);
    }
}

//! Time, injected. Nothing on the decision path reads the system clock directly:
//! the memory store asks its [`Clock`], so tests and the simulator can run in virtual time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Nanoseconds on a clock's own monotonic time line.
pub type Nanos = u64;

/// A source of monotonic time in nanoseconds.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Nanos;
}

/// The process's monotonic clock, on the Unix epoch's time line: the wall clock read once at
/// start, advanced by the monotonic clock from then on (so a wall clock set back or forward
/// while the process runs moves no bucket). Calendar windows read their boundaries from it.
/// Never below one hour, so that "zero" never means "now".
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
    /// The wall clock at `origin`, in ns since the Unix epoch (at least [`ORIGIN_OFFSET`]).
    wall_at_origin: Nanos,
}

impl SystemClock {
    pub fn new() -> Self {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX / 2)) as Nanos);
        Self {
            origin: Instant::now(),
            wall_at_origin: wall.max(ORIGIN_OFFSET),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

const ORIGIN_OFFSET: Nanos = 3_600_000_000_000;

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        self.wall_at_origin
            .saturating_add(self.origin.elapsed().as_nanos() as Nanos)
    }
}

/// A clock that only moves when told to: tests and the simulator.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(start: Nanos) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_nanos() as Nanos, Ordering::SeqCst);
    }

    pub fn set(&self, to: Nanos) {
        self.now.store(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(5);
        assert_eq!(c.now(), 5);
        c.advance(Duration::from_nanos(10));
        assert_eq!(c.now(), 15);
        c.set(1);
        assert_eq!(c.now(), 1);
    }

    #[test]
    fn system_clock_is_monotonic_and_offset() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(a >= ORIGIN_OFFSET);
        assert!(b >= a);
    }
}

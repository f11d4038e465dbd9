//! Admission control: a cap on requests forwarded to the upstream at once, with a short bounded
//! queue in front of it.
//!
//! A [`Gate`] is a semaphore of `max_in_flight` slots and a count of waiters. A request takes a
//! free slot at once; when none is free it waits, if fewer than `queue` are already waiting, for
//! at most `queue_timeout`; otherwise it is shed ([`ShedReason`]). Waiters are served in arrival
//! order, and a newcomer never takes a slot ahead of one. The [`Slot`] gives its place back when
//! dropped.
//!
//! [`Admission`] holds one gate per route group (`[admission.groups.<name>]`, a share reserved
//! out of the cap) and one for every other route (the `default` group, the rest of the cap), so
//! the gates' slots add up to `admission.max_in_flight` and one group's traffic never takes
//! another's slots.
//!
//! Within a gate, one client address ([`crate::client_share`]) holds or waits for at most its
//! share of the slots (`admission.client_share_percent`); past it, it is shed at once
//! ([`ShedReason::ClientShare`]) and the other clients keep the rest. And the last share of a
//! gate's free slots is kept for addresses that hold none: an address that already holds a slot
//! is shed rather than take one of them, so a few addresses at their share cannot take every
//! slot, and a newcomer finds one (see [`Gate::enter`]). A slot also carries how
//! long its request may keep the gateway waiting for its body (`body_hold`), which the proxy
//! enforces: a body sent slowly enough to hold a slot for as long as it likes is cut off.

use crate::client_share::{ClientHold, ClientShares};
use crate::config::admission::{AdmissionConfig, DEFAULT_GROUP};
use crate::metrics::{AdmissionMeter, Metrics, ShedReason};
use crate::policy::RoutePattern;
use smallvec::SmallVec;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One pool of slots and its queue.
#[derive(Debug)]
pub(crate) struct Gate {
    name: Arc<str>,
    slots: Arc<Semaphore>,
    /// Requests waiting for a slot now.
    waiting: AtomicUsize,
    queue: usize,
    queue_timeout: Duration,
    meter: AdmissionMeter,
    /// What each client address holds or waits for; `None` when one address may take every
    /// slot (nothing to count).
    shares: Option<Arc<ClientShares>>,
    /// How long a request holding a slot may keep the gateway waiting for its body.
    body_hold: Duration,
    /// Free slots only an address holding none may take: one client's share, or half of what
    /// the other shares leave when that is less (0 when one address may take every slot).
    reserve: usize,
}

/// A place among the requests in flight; given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    /// Its client address's share, given back with the slot.
    _share: Option<ClientHold>,
    meter: AdmissionMeter,
    body_hold: Duration,
}

impl Slot {
    /// How long the request may keep the gateway waiting for its body while it holds this slot.
    pub(crate) fn body_hold(&self) -> Duration {
        self.body_hold
    }

    /// Where the slot's group counts what happens to it (a body cut off at the hold).
    pub(crate) fn meter(&self) -> &AdmissionMeter {
        &self.meter
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.meter.in_flight(-1);
    }
}

/// A request the gate turned away: which group, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shed {
    pub group: Arc<str>,
    pub reason: ShedReason,
}

/// Counts one waiter for as long as it waits (dropped when the wait ends, however it ends,
/// including when the request itself is dropped mid-wait).
struct Waiting<'a>(&'a Gate);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
        self.0.meter.queued(-1);
    }
}

/// How one gate shares its slots: the queue, and what each client address may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GateRules {
    /// How many may wait for a slot.
    pub queue: usize,
    /// How long one may wait.
    pub queue_timeout: Duration,
    /// How many slots one client address may hold or wait for at once.
    pub per_client: usize,
    /// How long a request holding a slot may keep the gateway waiting for its body.
    pub body_hold: Duration,
}

impl Gate {
    /// `slots` requests in flight at once; `rules.queue` more may wait, each at most
    /// `rules.queue_timeout`; one client address holds or waits for at most `rules.per_client`.
    pub(crate) fn new(name: &str, slots: usize, rules: GateRules, meter: AdmissionMeter) -> Self {
        let shares = (rules.per_client < slots).then(|| ClientShares::new(rules.per_client));
        let reserve = if shares.is_some() {
            rules
                .per_client
                .min(slots.saturating_sub(rules.per_client) / 2)
        } else {
            0
        };
        Self {
            name: Arc::from(name),
            slots: Arc::new(Semaphore::new(slots.min(Semaphore::MAX_PERMITS))),
            waiting: AtomicUsize::new(0),
            queue: rules.queue,
            queue_timeout: rules.queue_timeout,
            meter,
            shares,
            body_hold: rules.body_hold,
            reserve,
        }
    }

    #[cfg(test)]
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The most slots one client address may hold or wait for.
    #[cfg(test)]
    pub(crate) fn per_client(&self) -> Option<usize> {
        self.shares.as_ref().map(|s| s.limit())
    }

    /// A slot for a request from client address `client`: at once when one is free, after a
    /// wait in the queue when there is room in it, or the reason there is none. Never waits
    /// longer than `queue_timeout`. An address that already holds or waits for its share is
    /// shed at once, before it takes a place in the queue.
    ///
    /// The last [`Gate::reserve`] free slots are kept for addresses that hold none: an address
    /// that holds one already is shed (client share) rather than take one of them. So holding
    /// every slot takes an address per slot of that reserve beyond the addresses at their share
    /// (with 64 slots and a quarter each: 3 addresses at their 16, then 16 more, one each),
    /// where it took 4.
    pub(crate) async fn enter(&self, client: IpAddr) -> Result<Slot, Shed> {
        let share = match &self.shares {
            Some(shares) => match shares.take(client) {
                Some(held) if held.is_first() => Some(held),
                Some(held) if self.slots.available_permits() > self.reserve => Some(held),
                Some(_) | None => return Err(self.shed(ShedReason::ClientShare)),
            },
            None => None,
        };
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(self.slot(permit, share));
        }
        let joined = self
            .waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.queue).then_some(n + 1)
            });
        if joined.is_err() {
            return Err(self.shed(ShedReason::QueueFull));
        }
        self.meter.queued(1);
        let waiting = Waiting(self);
        let acquired =
            tokio::time::timeout(self.queue_timeout, self.slots.clone().acquire_owned()).await;
        drop(waiting);
        match acquired {
            Ok(Ok(permit)) => Ok(self.slot(permit, share)),
            // The semaphore is never closed; were it, the request could not be admitted.
            Ok(Err(_)) | Err(_) => Err(self.shed(ShedReason::QueueTimeout)),
        }
    }

    fn slot(&self, permit: OwnedSemaphorePermit, share: Option<ClientHold>) -> Slot {
        self.meter.in_flight(1);
        Slot {
            _permit: permit,
            _share: share,
            meter: self.meter.clone(),
            body_hold: self.body_hold,
        }
    }

    fn shed(&self, reason: ShedReason) -> Shed {
        self.meter.shed(reason);
        Shed {
            group: self.name.clone(),
            reason,
        }
    }
}

/// The gates of one gateway: one per route group, and the default one.
#[derive(Debug)]
pub(crate) struct Admission {
    groups: Vec<(Vec<RoutePattern>, Gate)>,
    default: Gate,
    /// The `Retry-After` of a 503: the queue timeout in whole seconds, at least 1.
    retry_after: u64,
}

impl Admission {
    /// The gates `cfg` describes, counting into `metrics`.
    pub(crate) fn new(cfg: &AdmissionConfig, metrics: &Metrics) -> Self {
        let groups = cfg
            .groups
            .iter()
            .map(|g| {
                let rules = GateRules {
                    queue: g.queue,
                    queue_timeout: cfg.queue_timeout,
                    per_client: cfg.per_client(g.max_in_flight),
                    body_hold: g.body_hold,
                };
                let gate = Gate::new(
                    &g.name,
                    g.max_in_flight,
                    rules,
                    metrics.admission_meter(&g.name),
                );
                (g.routes.clone(), gate)
            })
            .collect();
        let rules = GateRules {
            queue: cfg.queue,
            queue_timeout: cfg.queue_timeout,
            per_client: cfg.per_client(cfg.default_share()),
            body_hold: cfg.body_hold,
        };
        let default = Gate::new(
            DEFAULT_GROUP,
            cfg.default_share(),
            rules,
            metrics.admission_meter(DEFAULT_GROUP),
        );
        let retry_after =
            cfg.queue_timeout.as_secs() + u64::from(cfg.queue_timeout.subsec_nanos() > 0);
        Self {
            groups,
            default,
            retry_after: retry_after.max(1),
        }
    }

    /// The gate of the group whose route matches `method` and the canonical `path` most
    /// specifically, or the default one.
    pub(crate) fn gate(&self, method: &str, path: &str) -> &Gate {
        if self.groups.is_empty() {
            return &self.default;
        }
        let segs: SmallVec<[&str; 16]> = path.split('/').filter(|s| !s.is_empty()).collect();
        crate::policy::most_specific(
            self.groups
                .iter()
                .map(|(routes, gate)| (routes.as_slice(), gate)),
            method,
            &segs,
        )
        .unwrap_or(&self.default)
    }

    /// A slot for a request of `method` on the canonical `path` from client address `client`.
    pub(crate) async fn enter(
        &self,
        method: &str,
        path: &str,
        client: IpAddr,
    ) -> Result<Slot, Shed> {
        self.gate(method, path).enter(client).await
    }

    /// Whether any gate counts what each client address holds (else the proxy need not work
    /// out who the client is).
    pub(crate) fn shares_by_client(&self) -> bool {
        self.default.shares.is_some() || self.groups.iter().any(|(_, g)| g.shares.is_some())
    }

    /// How many seconds a shed request is told to wait (`Retry-After`).
    pub(crate) fn retry_after(&self) -> u64 {
        self.retry_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client address for tests where who asks does not matter.
    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));

    fn client(n: u8) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, n))
    }

    fn rules(queue: usize, timeout_ms: u64, per_client: usize) -> GateRules {
        GateRules {
            queue,
            queue_timeout: Duration::from_millis(timeout_ms),
            per_client,
            body_hold: Duration::from_secs(60),
        }
    }

    /// A gate where one address may take every slot.
    fn gate(slots: usize, queue: usize, timeout_ms: u64) -> (Gate, AdmissionMeter) {
        let meter = AdmissionMeter::default();
        let g = Gate::new("g", slots, rules(queue, timeout_ms, slots), meter.clone());
        (g, meter)
    }

    #[tokio::test]
    async fn takes_free_slots_then_sheds_when_the_queue_is_zero() {
        let (g, m) = gate(2, 0, 1000);
        let a = g.enter(CLIENT).await.expect("first slot");
        let _b = g.enter(CLIENT).await.expect("second slot");
        assert_eq!(m.in_flight_now(), 2);
        let shed = g.enter(CLIENT).await.expect_err("no slot, no queue");
        assert_eq!(shed.reason, ShedReason::QueueFull);
        assert_eq!(&*shed.group, "g");
        assert_eq!(m.shed_count(ShedReason::QueueFull), 1);
        drop(a);
        assert_eq!(m.in_flight_now(), 1);
        let _c = g.enter(CLIENT).await.expect("a slot came free");
        assert_eq!(m.in_flight_now(), 2);
        assert_eq!(m.shed_count(ShedReason::QueueTimeout), 0);
    }

    #[tokio::test]
    async fn a_waiter_gets_the_slot_given_back() {
        let (g, m) = gate(1, 1, 1000);
        let g = Arc::new(g);
        let held = g.enter(CLIENT).await.expect("slot");
        let waiter = tokio::spawn({
            let g = g.clone();
            async move { g.enter(CLIENT).await.map(|_| ()) }
        });
        while m.queued_now() == 0 {
            tokio::task::yield_now().await;
        }
        // The queue holds one: the next is refused at once.
        assert_eq!(
            g.enter(CLIENT).await.map(|_| ()),
            Err(Shed {
                group: Arc::from("g"),
                reason: ShedReason::QueueFull
            })
        );
        drop(held);
        assert_eq!(waiter.await.expect("joined"), Ok(()));
        assert_eq!(m.queued_now(), 0);
        assert_eq!(m.in_flight_now(), 0);
        assert_eq!(m.shed_count(ShedReason::QueueFull), 1);
        assert_eq!(m.shed_count(ShedReason::QueueTimeout), 0);
    }

    #[tokio::test]
    async fn a_waiter_is_shed_after_the_queue_timeout() {
        let (g, m) = gate(1, 4, 250);
        let _held = g.enter(CLIENT).await.expect("slot");
        let shed = g.enter(CLIENT).await.expect_err("no slot came free");
        assert_eq!(shed.reason, ShedReason::QueueTimeout);
        assert_eq!(m.shed_count(ShedReason::QueueTimeout), 1);
        assert_eq!(m.queued_now(), 0);
        assert_eq!(m.in_flight_now(), 1);
    }

    #[tokio::test]
    async fn an_abandoned_wait_leaves_the_queue() {
        let (g, m) = gate(1, 1, 1000);
        let g = Arc::new(g);
        let _held = g.enter(CLIENT).await.expect("slot");
        let waiter = tokio::spawn({
            let g = g.clone();
            async move { g.enter(CLIENT).await.map(|_| ()) }
        });
        while m.queued_now() == 0 {
            tokio::task::yield_now().await;
        }
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(m.queued_now(), 0);
        // Its place is free again: the next one may wait (and times out, nothing freed).
        assert_eq!(
            g.enter(CLIENT).await.map(|_| ()).map_err(|s| s.reason),
            Err(ShedReason::QueueTimeout)
        );
        assert_eq!(m.shed_count(ShedReason::QueueFull), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_more_in_flight_than_slots_under_contention() {
        // The queue timeout is never reached: slots are held until everything is counted.
        let (g, m) = gate(4, 4, 60_000);
        let g = Arc::new(g);
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(Semaphore::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (g, now, most, release) =
                    (g.clone(), now.clone(), most.clone(), release.clone());
                tokio::spawn(async move {
                    let slot = g.enter(CLIENT).await;
                    if slot.is_ok() {
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        if let Ok(p) = release.acquire().await {
                            p.forget();
                        }
                        now.fetch_sub(1, Ordering::SeqCst);
                    }
                    slot.map(|_| ()).map_err(|s| s.reason)
                })
            })
            .collect();
        // Four hold slots, four wait, the other 56 were refused: then let them all go.
        while !(m.in_flight_now() == 4
            && m.queued_now() == 4
            && m.shed_count(ShedReason::QueueFull) == 56)
        {
            tokio::task::yield_now().await;
        }
        release.add_permits(64);
        let (mut ok, mut full, mut timed_out) = (0, 0, 0);
        for t in tasks {
            match t.await.expect("joined") {
                Ok(()) => ok += 1,
                Err(ShedReason::QueueFull) => full += 1,
                Err(ShedReason::QueueTimeout) => timed_out += 1,
                Err(other) => panic!("shed for {other:?} with no client share"),
            }
        }
        assert_eq!(most.load(Ordering::SeqCst), 4);
        assert_eq!((ok, full, timed_out), (8, 56, 0));
        assert_eq!((m.in_flight_now(), m.queued_now()), (0, 0));
    }

    fn admission(toml: &str) -> (Admission, Arc<Metrics>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).expect("write");
        let cfg = crate::config::Loader::new()
            .file(&path)
            .load()
            .expect("valid")
            .admission
            .expect("on");
        let metrics = Arc::new(Metrics::new());
        (Admission::new(&cfg, &metrics), metrics)
    }

    #[test]
    fn requests_go_to_their_most_specific_group_or_the_default() {
        let (a, _) = admission(
            "[admission]\nmax_in_flight = 10\nqueue_timeout = \"1500ms\"\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = 3\n[admission.groups.enroll]\nroutes = [\"POST /api/agent/enroll\"]\nmax_in_flight = 1\n",
        );
        let group = |m: &str, p: &str| a.gate(m, p).name().to_owned();
        assert_eq!(group("GET", "/api/agent/heartbeat"), "agent");
        assert_eq!(group("POST", "/api/agent/enroll"), "enroll");
        assert_eq!(group("GET", "/api/agent/enroll"), "agent");
        assert_eq!(group("GET", "/api/dashboard/devices"), "default");
        assert_eq!(a.default.slots.available_permits(), 6);
        // 1.5 s rounds up: never told to come back sooner than a wait could last.
        assert_eq!(a.retry_after(), 2);
    }

    #[tokio::test]
    async fn a_full_group_leaves_the_others_their_slots() {
        let (a, metrics) = admission(
            "[admission]\nmax_in_flight = 3\nqueue = 0\nqueue_timeout = \"100ms\"\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = 1\n",
        );
        // Three clients: one address may hold one of the default group's two slots.
        let (c1, c2, c3) = (client(1), client(2), client(3));
        let _d1 = a.enter("GET", "/dash/1", c1).await.expect("default slot 1");
        let _d2 = a.enter("GET", "/dash/2", c2).await.expect("default slot 2");
        let shed = a
            .enter("GET", "/dash/3", c3)
            .await
            .expect_err("default full");
        assert_eq!(&*shed.group, "default");
        let _agent = a
            .enter("POST", "/api/agent/heartbeat", c1)
            .await
            .expect("the agent share is its own");
        let text = metrics.render();
        for sample in [
            "fleet_limiter_admission_in_flight{group=\"default\"} 2",
            "fleet_limiter_admission_in_flight{group=\"agent\"} 1",
            "fleet_limiter_admission_shed_total{group=\"default\",reason=\"queue_full\"} 1",
            "fleet_limiter_admission_shed_total{group=\"agent\",reason=\"queue_full\"} 0",
            "fleet_limiter_admission_queued{group=\"agent\"} 0",
        ] {
            assert!(text.lines().any(|l| l == sample), "{sample}\n{text}");
        }
    }

    #[tokio::test]
    async fn one_address_holds_or_waits_for_at_most_its_share() {
        // 8 slots, a share of 2 per address, a queue of 8.
        let meter = AdmissionMeter::default();
        let g = Arc::new(Gate::new("g", 8, rules(8, 60_000, 2), meter.clone()));
        assert_eq!(g.per_client(), Some(2));
        let (a, b) = (client(1), client(2));
        let a1 = g.enter(a).await.expect("a's first");
        let _a2 = g.enter(a).await.expect("a's second");
        let shed = g.enter(a).await.expect_err("a holds its share");
        assert_eq!(shed.reason, ShedReason::ClientShare);
        assert_eq!(meter.shed_count(ShedReason::ClientShare), 1);
        // Everyone else still gets in.
        let others: Vec<Slot> = futures_util::future::join_all((3..9).map(|n| {
            let g = g.clone();
            async move { g.enter(client(n)).await.expect("another address") }
        }))
        .await;
        assert_eq!(meter.in_flight_now(), 8);
        // Every slot is taken: b waits (it is within its share); a may not even wait.
        let waiter = tokio::spawn({
            let g = g.clone();
            async move { g.enter(b).await.map(|_| ()) }
        });
        while meter.queued_now() == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            g.enter(a).await.map(|_| ()).map_err(|s| s.reason),
            Err(ShedReason::ClientShare),
            "at its share, an address cannot queue either"
        );
        drop(a1);
        assert_eq!(waiter.await.expect("joined"), Ok(()));
        drop(others);
        let _a4 = g.enter(a).await.expect("a has its share again");
    }

    #[tokio::test]
    async fn addresses_at_their_share_cannot_take_the_slots_kept_for_newcomers() {
        // 16 slots, a quarter (4) per address: 4 are kept for addresses that hold none.
        let meter = AdmissionMeter::default();
        let g = Arc::new(Gate::new("g", 16, rules(0, 100, 4), meter.clone()));
        let mut held = Vec::new();
        let mut shed = 0;
        for n in 1..=4 {
            for _ in 0..4 {
                match g.enter(client(n)).await {
                    Ok(slot) => held.push(slot),
                    Err(s) => {
                        assert_eq!(s.reason, ShedReason::ClientShare);
                        shed += 1;
                    }
                }
            }
        }
        // Three addresses at their share (12), the fourth one slot: 13 held, 3 left.
        assert_eq!((held.len(), shed), (13, 3));
        // Each newcomer gets one, until none is left.
        for n in 10..13 {
            held.push(g.enter(client(n)).await.expect("a newcomer's slot"));
            assert_eq!(
                g.enter(client(n)).await.map(|_| ()).map_err(|s| s.reason),
                Err(ShedReason::ClientShare),
                "a newcomer with one slot does not take a second from the reserve"
            );
        }
        assert_eq!(meter.in_flight_now(), 16);
        // Without shares (one address may take every slot) nothing is kept back.
        let (open, _) = gate(4, 0, 100);
        let mut all = Vec::new();
        for _ in 0..4 {
            all.push(open.enter(client(1)).await.expect("every slot"));
        }
    }

    #[tokio::test]
    async fn a_waiting_address_counts_against_its_share_and_leaves_it_when_shed() {
        let meter = AdmissionMeter::default();
        let g = Arc::new(Gate::new("g", 4, rules(4, 100, 1), meter.clone()));
        let held: Vec<Slot> = futures_util::future::join_all((1..5).map(|n| {
            let g = g.clone();
            async move { g.enter(client(n)).await.expect("a slot") }
        }))
        .await;
        // Client 9 waits and is shed after the queue timeout: its place in its share is given
        // back, so it may wait again.
        for _ in 0..2 {
            assert_eq!(
                g.enter(client(9)).await.map(|_| ()).map_err(|s| s.reason),
                Err(ShedReason::QueueTimeout)
            );
        }
        assert_eq!(meter.shed_count(ShedReason::ClientShare), 0);
        drop(held);
        assert_eq!(meter.in_flight_now(), 0);
    }

    #[test]
    fn each_gate_gets_a_share_of_its_own_slots_and_its_body_hold() {
        let (a, _) = admission(
            "[admission]\nmax_in_flight = 20\nbody_hold = \"30s\"\n[admission.groups.agent]\nroutes = [\"/api/agent/**\"]\nmax_in_flight = 8\n[admission.groups.upload]\nroutes = [\"POST /api/upload\"]\nmax_in_flight = 2\nbody_hold = \"15m\"\n",
        );
        // 25 % by default: 10 default slots give 2 per address, 8 give 2, 2 give 1 (at least 1).
        assert_eq!(a.default.per_client(), Some(2));
        assert_eq!(a.gate("GET", "/api/agent/x").per_client(), Some(2));
        assert_eq!(a.gate("POST", "/api/upload").per_client(), Some(1));
        assert_eq!(a.default.body_hold, Duration::from_secs(30));
        assert_eq!(
            a.gate("POST", "/api/upload").body_hold,
            Duration::from_secs(900)
        );
        assert_eq!(
            a.gate("GET", "/api/agent/x").body_hold,
            Duration::from_secs(30)
        );
        assert!(a.shares_by_client());
        // At 100 %, one address may take a gate's every slot: nothing is counted per address.
        let (a, _) = admission("[admission]\nmax_in_flight = 20\nclient_share_percent = 100\n");
        assert_eq!(a.default.per_client(), None);
        assert!(!a.shares_by_client());
    }
}

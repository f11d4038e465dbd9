//! One request's decision: identity -> policy -> keys -> store -> outcome.
//!
//! This is the whole limiter with no HTTP in it: the actix middleware feeds it request facts,
//! the simulator feeds it scripted ones.

mod asked;
mod checks;
mod observe;
mod outcome;

use asked::{charge_nothing_if_refused, Asked};
pub(crate) use checks::build_checks;
use checks::fallback_verdicts;
pub use outcome::{LimitResult, Outcome};

use crate::client_ip::{self, TrustedProxies};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::identity::{self, TokenVerifier};
use crate::keys::{self, KeyDigest};
use crate::known_agents::{AgentAt, KnownAgents, Seen, ADDRESS_V6_PREFIX};
use crate::limiter::Verdict;
use crate::metrics::{GiveBackResult, LimiterMeter, Metrics};
use crate::path::{CanonicalPath, PathRules};
use crate::policy::{LimiterSpec, Mode, OnStoreError, Policy, Remember};
use crate::store::{Check, GiveBack, Store, StoreError};
use smallvec::SmallVec;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

/// The facts of one request that limiting needs; all borrowed from the request.
#[derive(Debug, Clone)]
pub struct RequestFacts<'a> {
    pub peer: IpAddr,
    pub method: &'a str,
    /// The request's path in canonical form: the path the upstream receives.
    pub path: CanonicalPath<'a>,
    /// Every value of the configured forwarding header, in order.
    pub forwarded: &'a [&'a [u8]],
    pub agent_id: Option<&'a [u8]>,
    pub authorization: Option<&'a [u8]>,
    /// A dashboard session token from a cookie, when one was sent.
    pub session_token: Option<&'a str>,
    /// The request's headers, for limiters keyed on one (`key = "header:<name>"`), and the
    /// fields its body names for limiters keyed on one (`key = "body:<field>"`).
    pub key_headers: KeyHeaders<'a>,
}

/// A lookup of the request's headers by lower-case name, for `header:<name>` keys and
/// `cost_header`: the header's only value, `None` when it is absent, and an empty value (which
/// neither reads as valid) when it was sent more than once: a value a proxy set is sent once, so
/// a client cannot add its own beside the proxy's, nor dodge a cost by repeating the header.
/// `KeyHeaders::default()` has none: every `header:<name>` limiter keys on the IP.
///
/// Inside the crate it also carries the normalised values of the body fields `body:<field>`
/// limiters read, when the request's body was read for them; without them (the decision
/// endpoint, which has no body) those limiters key on the IP. A body that cannot be read with
/// certainty never gets this far: the request is refused.
#[derive(Clone, Copy, Default)]
pub struct KeyHeaders<'a>(Option<&'a HeaderLookup<'a>>, &'a [BodyValue]);

pub(crate) use crate::keys::body::BodyValue;

/// Header values by lower-case name (see [`KeyHeaders`]).
pub(crate) type HeaderLookup<'a> = dyn Fn(&str) -> Option<&'a [u8]> + Sync + 'a;

impl<'a> KeyHeaders<'a> {
    pub fn new(lookup: &'a HeaderLookup<'a>) -> Self {
        Self(Some(lookup), &[])
    }

    /// These headers, and the body fields read for `body:<field>` limiters.
    pub(crate) fn with_body(self, body: &'a [BodyValue]) -> Self {
        Self(self.0, body)
    }

    pub fn get(&self, name: &str) -> Option<&'a [u8]> {
        self.0.and_then(|f| f(name))
    }

    /// Every body field read, normalised.
    pub(crate) fn bodies(&self) -> &'a [BodyValue] {
        self.1
    }

    /// The normalised value of body field `field`, when the body named it once.
    pub fn body(&self, field: &str) -> Option<&'a str> {
        self.1
            .iter()
            .find(|b| &*b.field == field)
            .map(|b| b.value.as_str())
    }
}

impl std::fmt::Debug for KeyHeaders<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "KeyHeaders(..)"
        } else {
            "KeyHeaders(none)"
        })
    }
}

/// Most give-backs under way at once per decider. Beyond it a give-back is dropped (the request
/// stays counted) and counted as `dropped`, so a flood of answers never queues without bound.
pub(crate) const MAX_GIVE_BACKS_IN_FLIGHT: usize = 4096;

/// One give-back under way: counted until dropped.
struct UnderWay(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The limiter with no HTTP: configuration, store and verifier.
pub struct Decider {
    /// Give-backs under way (see [`MAX_GIVE_BACKS_IN_FLIGHT`]).
    give_backs: Arc<std::sync::atomic::AtomicUsize>,
    /// Read without a lock or a shared count on every request ([`ArcSwap::load`]).
    state: arc_swap::ArcSwap<Settings>,
    store: Arc<dyn Store>,
    /// How the store wants its bucket names digested.
    digest: KeyDigest,
    verifier: Arc<dyn TokenVerifier>,
    /// This decider's own counters: a second decider in the process counts apart.
    metrics: Arc<Metrics>,
    /// The agent ids each `new-agents` limiter has admitted, per address (`/metrics` reads it).
    known: Arc<KnownAgents>,
    /// The store's clock when it has one, else the system's: `known` runs on it.
    clock: Arc<dyn Clock>,
    /// Other limits for chosen principals: the configuration's and the run-time ones.
    overrides: Arc<crate::overrides::Overrides>,
    /// The principals each limiter refused and metered most, minute by minute (`GET /top`).
    top: Arc<crate::top::TopTalkers>,
    /// The upstream's pressure against `[shaping.upstream]`'s target, on this instance; kept
    /// across reloads.
    pressure: Arc<crate::shaping::Pressure>,
}

/// The parts of the configuration a decision reads; swapped whole on reload.
#[derive(Debug)]
pub struct Settings {
    pub enabled: bool,
    pub policy: Policy,
    pub trusted: TrustedProxies,
    pub ipv6_prefix: u8,
    /// Which spellings of a path are refused before any limiter sees them.
    pub paths: PathRules,
    /// The methods forwarded, and what a method override costs.
    pub methods: crate::methods::MethodRules,
    /// Each limiter's metric handles, in policy order (see [`LimitResult::slot`]).
    pub meters: Box<[LimiterMeter]>,
    /// The limit headers a metered answer carries.
    pub headers: crate::config::headers::HeaderProfile,
    /// The largest body read for `body:<field>` keys (`server.body_key_max_bytes`).
    pub body_key_max_bytes: usize,
    /// The longest wait for the next chunk, and for the whole, of a body read for
    /// `body:<field>` keys (`server.body_timeout`).
    pub body_key_timeout: std::time::Duration,
    /// The least average bytes per second of such a body after the first 5 s of waiting
    /// (`server.body_min_rate`; 0: none).
    pub body_key_min_rate: u64,
    /// Whether decisions feed the top-talker lists (`ops.top_talkers`).
    pub top_talkers: bool,
    /// The domains of Envoy's rate-limit service (`rls.config`), read again on every reload.
    pub rls_domains: Arc<crate::rls_rules::Domains>,
    /// The proxies the rate-limit service answers (`rls.allow_from`).
    pub rls_allow_from: Arc<[ipnet::IpNet]>,
    /// Whether a descriptor's own `limit` counts (`rls.descriptor_limit`).
    pub rls_descriptor_limit: bool,
    /// The shaped routes (`[shaping]`): poll slots, priorities, in-flight caps; `None` without.
    pub(crate) shaping: Option<crate::shaping::Shaping>,
}

impl Settings {
    /// The settings of `cfg`, with their limiters' handles resolved in `metrics`.
    pub fn from_config(cfg: &Config, metrics: &Metrics) -> Self {
        let policy = Policy::new(cfg.limiters.clone());
        let meters = metrics.configure(cfg.enabled, policy.limiters(), cfg.ops.near_limit_percent);
        Self {
            enabled: cfg.enabled,
            policy,
            trusted: cfg.client_ip.trusted.clone(),
            ipv6_prefix: cfg.client_ip.ipv6_prefix,
            paths: cfg.path,
            methods: cfg.methods.clone(),
            meters,
            headers: cfg.headers,
            body_key_max_bytes: cfg.server.body_key_max_bytes,
            body_key_timeout: cfg.server.body_timeout,
            body_key_min_rate: cfg.server.body_min_rate,
            top_talkers: cfg.ops.top_talkers,
            rls_domains: cfg.rls.domains.clone(),
            rls_allow_from: cfg.rls.allow_from.clone().into(),
            rls_descriptor_limit: cfg.rls.descriptor_limit,
            shaping: crate::shaping::Shaping::metered(&cfg.shaping, metrics),
        }
    }
}

impl Decider {
    pub fn new(cfg: &Config, store: Arc<dyn Store>, verifier: Arc<dyn TokenVerifier>) -> Self {
        let known = Arc::new(KnownAgents::new(
            cfg.store.max_keys,
            crate::known_agents::grace(cfg.fleet.longest_gap_seconds()),
        ));
        let top = Arc::new(crate::top::TopTalkers::default());
        let clock = store
            .clock()
            .unwrap_or_else(|| Arc::new(SystemClock::new()));
        let pressure = Arc::new(crate::shaping::Pressure::with_clock(clock.clone()));
        let metrics = Arc::new(Metrics::for_decider(
            store.clone(),
            known.clone(),
            top.clone(),
            pressure.clone(),
        ));
        Self {
            give_backs: Arc::default(),
            overrides: Arc::new(crate::overrides::Overrides::new(
                cfg.overrides.clone(),
                Arc::new(crate::overrides::SystemWall),
            )),
            state: arc_swap::ArcSwap::from_pointee(Settings::from_config(cfg, &metrics)),
            known,
            clock,
            digest: store.key_digest(),
            store,
            verifier,
            metrics,
            top,
            pressure,
        }
    }

    /// The run-time levers over this decider's store, overrides and top-talker lists.
    pub(crate) fn levers(&self) -> crate::overrides::shared::Levers {
        crate::overrides::shared::Levers::new(
            self.store.clone(),
            self.overrides.clone(),
            self.clock.clone(),
            self.top.clone(),
        )
    }

    /// The principals each limiter refused and metered most.
    pub(crate) fn top(&self) -> &crate::top::TopTalkers {
        &self.top
    }

    /// The time its buckets are decided on (ns since the Unix epoch; virtual in tests).
    pub(crate) fn now(&self) -> crate::clock::Nanos {
        self.clock.now()
    }

    /// The clock [`Decider::now`] reads.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The agent ids its `new-agents` limiters know.
    pub fn known_agents(&self) -> &KnownAgents {
        &self.known
    }

    /// Write the store's buckets and the known agents to `path` (`store.state_file`): how many
    /// of each; `None` when the store keeps nothing in the process (Redis).
    pub(crate) fn save_state(
        &self,
        path: &std::path::Path,
    ) -> Option<std::io::Result<(usize, usize)>> {
        let (buckets_key, buckets) = self.store.kept_buckets()?;
        let now = self.clock.now();
        let (known_key, known) = self.known.export(now);
        let snapshot = crate::store::state_file::Snapshot {
            buckets_key,
            buckets,
            known_key,
            known,
        };
        Some(crate::store::state_file::write(path, now, &snapshot))
    }

    /// This decider's metrics: its decisions, and what the app built around it records.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn settings(&self) -> Arc<Settings> {
        self.state.load_full()
    }

    /// The current settings for one request: read without writing anything every worker
    /// shares (no lock, no reference count), held until the request is decided.
    pub fn current(&self) -> arc_swap::Guard<Arc<Settings>> {
        self.state.load()
    }

    /// Take a new configuration for the next request. Buckets live in the store under the
    /// limiter's name, so unchanged limiters keep their state.
    pub fn reload(&self, cfg: &Config) {
        let settings = Arc::new(Settings::from_config(cfg, &self.metrics));
        self.state.store(settings);
        self.known
            .set_grace(crate::known_agents::grace(cfg.fleet.longest_gap_seconds()));
        self.overrides.set_config(cfg.overrides.clone());
    }

    /// The overrides this decider applies.
    pub(crate) fn overrides(&self) -> &Arc<crate::overrides::Overrides> {
        &self.overrides
    }

    /// Decide by `wall` instead of the system's wall clock when overrides expire (virtual time:
    /// the simulator, tests).
    pub(crate) fn with_wall_clock(mut self, wall: Arc<dyn crate::overrides::WallClock>) -> Self {
        self.overrides = Arc::new(self.overrides.on_wall_clock(wall));
        self
    }

    /// Count and log one decision made under `settings` (see `decision/observe.rs`).
    pub fn observe(&self, settings: &Settings, outcome: &Outcome, elapsed: std::time::Duration) {
        observe::decision(&self.metrics, &settings.meters, outcome, elapsed);
    }

    /// Once the answer is known: give back what the limiters whose `count` says an answer with
    /// `status` should not have counted took for this request (`since_decision` tells how long
    /// ago it was decided, asked only when something is given back: most answers read no
    /// clock here). Returns the work to run after the response (spawned by the middleware, awaited
    /// by the simulator), or `None` when nothing is given back. A refused request consumed
    /// nothing and gives nothing back; neither does a limiter whose store failed. Beyond
    /// `MAX_GIVE_BACKS_IN_FLIGHT` the give-back is dropped and counted.
    pub fn give_back(
        &self,
        settings: &Settings,
        outcome: &Outcome,
        status: u16,
        since_decision: impl FnOnce() -> std::time::Duration,
    ) -> Option<futures_util::future::BoxFuture<'static, ()>> {
        if outcome.refused() {
            return None;
        }
        if !outcome.results.iter().any(|r| r.gives_back(status)) {
            return None;
        }
        let elapsed = u64::try_from(since_decision().as_nanos()).unwrap_or(u64::MAX);
        let mut items: SmallVec<[(GiveBack, Option<LimiterMeter>, bool); 4]> = SmallVec::new();
        for r in outcome.results.iter().filter(|r| r.gives_back(status)) {
            let meter = settings.meters.get(r.slot).cloned();
            items.push((
                GiveBack {
                    key: r.key.clone(),
                    quota: r.quota,
                    units: r.units,
                    outstanding_ns: r.verdict.reset_after_ns.saturating_sub(elapsed),
                },
                meter,
                r.local,
            ));
        }
        if items.is_empty() {
            return None;
        }
        use std::sync::atomic::Ordering;
        let under_way = self.give_backs.fetch_add(1, Ordering::AcqRel);
        if under_way >= MAX_GIVE_BACKS_IN_FLIGHT {
            self.give_backs.fetch_sub(1, Ordering::AcqRel);
            for (_, m, _) in &items {
                if let Some(m) = m {
                    m.give_back(GiveBackResult::Dropped);
                }
            }
            return None;
        }
        let store = self.store.clone();
        // Counted under way until the work finishes or is dropped unfinished.
        let under_way = UnderWay(self.give_backs.clone());
        Some(Box::pin(async move {
            let _under_way = under_way;
            // Counted locally while the store failed: given back on the local buckets.
            for local in [false, true] {
                let (list, meters): (Vec<GiveBack>, Vec<Option<LimiterMeter>>) = items
                    .iter()
                    .filter(|(_, _, l)| *l == local)
                    .map(|(g, m, _)| (g.clone(), m.clone()))
                    .unzip();
                if list.is_empty() {
                    continue;
                }
                let done = if local {
                    store.give_back_locally(&list).await
                } else {
                    store.give_back(&list).await
                };
                let result = match done {
                    Ok(()) => GiveBackResult::Done,
                    Err(e) => {
                        tracing::debug!(error = %e, "a give-back failed; the request stays counted");
                        GiveBackResult::Failed
                    }
                };
                for m in meters.iter().flatten() {
                    m.give_back(result);
                }
            }
        }))
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The token verifier `[identity]` built (its availability is reported by `/readyz`).
    pub fn verifier(&self) -> &Arc<dyn TokenVerifier> {
        &self.verifier
    }

    pub async fn decide(&self, req: &RequestFacts<'_>) -> Outcome {
        let settings = self.state.load();
        self.decide_with(&settings, req).await
    }

    /// [`Decider::decide`] under settings the caller already holds (one read of the current
    /// settings per request, shared with whatever else the caller read from them).
    pub async fn decide_with(&self, settings: &Settings, req: &RequestFacts<'_>) -> Outcome {
        self.decide_overridden(settings, req, &[]).await
    }

    /// [`Decider::decide_with`] for a request that names other methods by override (`also`,
    /// see `crate::methods`): it is metered by every limiter its own method picks and every
    /// limiter each method in `also` picks, each limiter once, in one all-or-nothing decision.
    /// With `also` empty it is exactly `decide_with`.
    pub async fn decide_overridden(
        &self,
        settings: &Settings,
        req: &RequestFacts<'_>,
        also: &[&str],
    ) -> Outcome {
        let mut outcome = self.decide_inner(settings, req, also, None).await;
        if let Some(shaping) = &settings.shaping {
            outcome.poll_after_secs = self.poll_hint(shaping, settings, req, &outcome);
        }
        outcome
    }

    /// `X-Poll-Interval` for `req`, decided as `outcome`, on a shaped route with an interval:
    /// its caller's next slot, in an interval stretched by the upstream's pressure.
    fn poll_hint(
        &self,
        shaping: &crate::shaping::Shaping,
        settings: &Settings,
        req: &RequestFacts<'_>,
        outcome: &Outcome,
    ) -> Option<u64> {
        let route = shaping.route(req.method, req.path.as_str())?;
        let ip = outcome.client_ip.unwrap_or(req.peer);
        let address = crate::shaping::address_of(ip, settings.ipv6_prefix);
        let agent = req.agent_id.and_then(keys::valid_agent_id);
        let step = if shaping.upstream().is_some() {
            self.pressure.step()
        } else {
            0
        };
        let (hint, came) = shaping.hint_followed(
            route,
            &address,
            agent,
            self.clock.now(),
            outcome.retry_after_secs(),
            step,
        )?;
        if let (Some(came), Some(_), None) = (came, shaping.upstream(), outcome.retry_after_secs())
        {
            self.pressure.hinted(came);
        }
        route.meter.hint(hint);
        Some(hint)
    }

    /// The upstream's pressure on this instance (`[shaping.upstream]`).
    pub(crate) fn pressure(&self) -> &Arc<crate::shaping::Pressure> {
        &self.pressure
    }

    /// What [`Decider::decide_with`] would answer `req` now, consuming nothing: each matching
    /// limiter's bucket as it stands, judged against one more request, and how its key was
    /// made (described, never a raw token). Nothing is counted, remembered or recorded.
    pub(crate) async fn explain(
        &self,
        settings: &Settings,
        req: &RequestFacts<'_>,
    ) -> (Outcome, Vec<Explained>) {
        let mut explained = Vec::new();
        let outcome = self
            .decide_inner(settings, req, &[], Some(&mut explained))
            .await;
        (outcome, explained)
    }

    /// The buckets limiter `name` keeps for the principal of `req` (whatever its routes): its
    /// own, and the one of an override in force for it; and how the key was made. What an
    /// operator's reset forgets. `None` for no such limiter.
    pub(crate) async fn bucket_of_named(
        &self,
        settings: &Settings,
        req: &RequestFacts<'_>,
        name: &str,
    ) -> Option<(Vec<keys::BucketKey>, String)> {
        let spec = settings
            .policy
            .limiters()
            .iter()
            .find(|l| &*l.name == name)?;
        let ip = client_ip::client_ip(req.peer, req.forwarded.iter().copied(), &settings.trusted);
        let id = identity::identify(
            self.verifier.as_ref(),
            req.agent_id,
            req.authorization,
            req.session_token,
        )
        .await;
        let ip_key = keys::normalize_ip(ip, settings.ipv6_prefix);
        let credential = (spec.key == keys::KeyKind::Credential)
            .then(|| req.authorization.and_then(identity::bearer_token))
            .flatten()
            .map(keys::credential_digest);
        let from_proxy = settings.trusted.contains(req.peer);
        let principal = keys::Principal {
            ip: &ip_key,
            agent_id: id.agent_id,
            user: id.user.as_deref(),
            credential: credential.as_deref(),
            header: match (spec.key.header(), from_proxy) {
                (Some(h), true) => req.key_headers.get(h).and_then(keys::valid_key_header),
                _ => None,
            },
            body: spec.key.body_field().and_then(|f| req.key_headers.body(f)),
            claim: spec.key.claim().and_then(|c| id.claims().get(c)),
            path: spec.path_id(req.method, req.path.as_str()),
        };
        let mut buckets = vec![self
            .digest
            .bucket_of(spec.name.clone(), &spec.key, &principal)];
        // The bucket an override in force keeps for the principal goes too.
        if let Some(ix) = self.overrides.index_if_any() {
            let who = crate::overrides::Who {
                ip,
                agent_id: id.agent_id,
                user: id.user.as_deref(),
                claims: id.claims(),
                body: req.key_headers.bodies(),
            };
            if let Some(o) = ix.find(&spec.name, &who, self.overrides.unix_now()) {
                buckets.push(
                    self.digest
                        .bucket_of(o.bucket.clone(), &spec.key, &principal),
                );
            }
        }
        Some((buckets, keys::describe(&spec.key, &principal)))
    }

    async fn decide_inner(
        &self,
        settings: &Settings,
        req: &RequestFacts<'_>,
        also: &[&str],
        mut explain: Option<&mut Vec<Explained>>,
    ) -> Outcome {
        if !settings.enabled {
            return Outcome::default();
        }
        let ip = client_ip::client_ip(req.peer, req.forwarded.iter().copied(), &settings.trusted);
        let id = identity::identify(
            self.verifier.as_ref(),
            req.agent_id,
            req.authorization,
            req.session_token,
        )
        .await;
        let slots = if also.is_empty() {
            settings.policy.picked(req.method, &req.path, id.credential)
        } else {
            settings
                .policy
                .picked_any(req.method, also, &req.path, id.credential)
        };
        if slots.is_empty() {
            return Outcome {
                client_ip: Some(ip),
                ..Outcome::default()
            };
        }
        let ip_key = keys::normalize_ip(ip, settings.ipv6_prefix);
        let now = self.clock.now();
        let (limiters, slots, remember) =
            self.metering(settings, &slots, ip, &ip_key, id.agent_id, now);
        if limiters.is_empty() {
            return Outcome {
                client_ip: Some(ip),
                ..Outcome::default()
            };
        }
        let index = self.overrides.index_if_any();
        let unix_now = if index.is_some() {
            self.overrides.unix_now()
        } else {
            0
        };
        let asked = Asked::new(
            settings, req, &id, ip, &ip_key, &limiters, index, unix_now, now,
        );
        let checks = build_checks(
            &self.digest,
            &limiters,
            |l| asked.principal(l),
            |l| asked.units(l),
            |l| asked.budget(l),
        );
        if let Some(list) = explain.as_deref_mut() {
            for l in &limiters {
                list.push(Explained {
                    key: keys::describe(&l.key, &asked.principal(l)),
                    chosen: asked.chosen(l),
                });
            }
        }
        let (verdicts, local, store_error) = if explain.is_some() {
            self.peek_on_store(&limiters, &checks).await
        } else {
            self.decide_on_store(&limiters, &checks).await
        };
        let errored = store_error.is_some();
        // Whether the i-th verdict counts a bucket: the store's, or the local one of an
        // `on_store_error = "local"` limiter while the store failed.
        let counted = |i: usize| !errored || local.get(i).copied().unwrap_or(false);
        let (verdicts, refused) = charge_nothing_if_refused(verdicts, &checks, counted);
        if !refused && !errored && explain.is_none() {
            for (at, r) in &remember {
                let known_for = u64::try_from(r.known_for.as_nanos()).unwrap_or(u64::MAX);
                self.known
                    .admitted(*at, now, known_for, r.max_known as usize);
            }
        }
        let results = limiters
            .into_iter()
            .zip(slots)
            .zip(checks)
            .zip(verdicts)
            .enumerate()
            .map(|(i, (((spec, slot), check), verdict))| {
                if settings.top_talkers && explain.is_none() && counted(i) {
                    let refused = !verdict.allowed && spec.mode == Mode::Enforce;
                    self.top.record(&spec.name, &check.key, refused, now, || {
                        keys::Seed::of(&spec.key, &asked.principal(&spec), ip, settings.ipv6_prefix)
                    });
                }
                self.result_of(&asked, spec, slot, check, verdict, errored, counted(i))
            })
            .collect();
        Outcome {
            client_ip: Some(ip),
            results,
            store_error,
            poll_after_secs: None,
        }
    }

    /// The limiters among `slots` that meter this request, their slots, and the agents to
    /// remember once it is allowed: a `new-agents` limiter meters only agent ids it does not
    /// know at this address.
    #[allow(clippy::type_complexity)]
    #[inline]
    fn metering(
        &self,
        settings: &Settings,
        slots: &[usize],
        ip: IpAddr,
        ip_key: &str,
        agent_id: Option<&str>,
        now: crate::clock::Nanos,
    ) -> (
        SmallVec<[Arc<LimiterSpec>; 4]>,
        SmallVec<[usize; 4]>,
        SmallVec<[(AgentAt, Remember); 1]>,
    ) {
        let mut remember: SmallVec<[(AgentAt, Remember); 1]> = SmallVec::new();
        let mut limiters: SmallVec<[Arc<LimiterSpec>; 4]> = SmallVec::new();
        let mut kept: SmallVec<[usize; 4]> = SmallVec::new();
        // The table's address: the key's, or its /56 when the key is a longer IPv6 prefix.
        let mut wider: Option<String> = None;
        for &i in slots {
            let Some(spec) = settings.policy.limiters().get(i) else {
                continue;
            };
            if let (Some(r), Some(agent)) = (spec.new_agents, agent_id) {
                let at = if settings.ipv6_prefix > ADDRESS_V6_PREFIX && ip.to_canonical().is_ipv6()
                {
                    let address =
                        wider.get_or_insert_with(|| keys::normalize_ip(ip, ADDRESS_V6_PREFIX));
                    self.known.at(&spec.name, address, Some(ip_key), agent)
                } else {
                    self.known.at(&spec.name, ip_key, None, agent)
                };
                remember.push((at, r));
                if self.known.seen(at, now) == Seen::Known {
                    continue;
                }
            }
            limiters.push(spec.clone());
            kept.push(i);
        }
        (limiters, kept, remember)
    }

    /// `checks` judged without a charge (`explain`): the store's verdicts, or each limiter's
    /// `on_store_error` answer when it fails.
    async fn peek_on_store(
        &self,
        limiters: &[Arc<LimiterSpec>],
        checks: &[Check],
    ) -> (Vec<Verdict>, SmallVec<[bool; 4]>, Option<StoreError>) {
        match self.store.peek(checks).await {
            Ok(v) if v.len() == checks.len() => (v, SmallVec::new(), None),
            Ok(_) => (
                fallback_verdicts(limiters, checks),
                SmallVec::new(),
                Some(StoreError::new(
                    crate::store::StoreErrorKind::Script,
                    "the store answered the wrong number of verdicts",
                )),
            ),
            Err(e) => (
                fallback_verdicts(limiters, checks),
                SmallVec::new(),
                Some(e),
            ),
        }
    }

    /// One limiter's result. A refused bucket is named by its shared digest (the name `reset`
    /// and `explain` use) whatever the store digests; `counted`: its verdict counts a bucket
    /// (the store's, or a `local` one while the store failed).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn result_of(
        &self,
        asked: &Asked<'_, '_>,
        spec: Arc<LimiterSpec>,
        slot: usize,
        check: Check,
        verdict: Verdict,
        errored: bool,
        counted: bool,
    ) -> LimitResult {
        let mut partition = [0u8; 8];
        partition.copy_from_slice(&check.key.digest[..8]);
        let key = if verdict.allowed || self.digest == KeyDigest::Shared {
            check.key
        } else {
            KeyDigest::Shared.bucket_of(check.key.limiter, &spec.key, &asked.principal(&spec))
        };
        LimitResult {
            quota: check.quota,
            spec,
            slot,
            key,
            verdict,
            store_error: !counted,
            local: errored && counted,
            units: check.units,
            partition,
        }
    }
}

/// Which budget judged a limiter's bucket for one request.
#[derive(Debug, Clone)]
pub(crate) enum Chosen {
    /// The limiter's own.
    Own,
    /// The plan the verified token names, and its quota.
    Plan(String, crate::limiter::Quota),
    /// An override for the principal.
    Override(Arc<crate::overrides::Override>),
}

/// How [`Decider::explain`] saw one limiter: its key, described, and the budget it chose.
#[derive(Debug, Clone)]
pub(crate) struct Explained {
    pub(crate) key: String,
    pub(crate) chosen: Chosen,
}

#[cfg(test)]
mod tests;

//! Asking the store: one all-or-nothing decision over a request's checks (each limiter's
//! `on_store_error` answer when the store fails, the local buckets of `local` limiters), a
//! check-only peek, and the checks themselves, one per limiter keyed on its principal.

use super::*;

impl Decider {
    /// How the store wants its bucket names digested.
    pub(crate) fn key_digest(&self) -> &KeyDigest {
        &self.digest
    }

    /// Each of `checks` judged against its units now, charging nothing (Envoy's per-descriptor
    /// `hits_addend` of 0, as `explain` judges); when the store fails, each limiter's
    /// `on_store_error` answer.
    pub(crate) async fn peek_checks(
        &self,
        checks: &[Check],
        limiters: &[Arc<LimiterSpec>],
    ) -> Vec<Verdict> {
        match self.store.peek(checks).await {
            Ok(v) if v.len() == checks.len() => v,
            Ok(_) | Err(_) => fallback_verdicts(limiters, checks),
        }
    }

    /// `checks` charged and `probes` only judged (one limiter each in `specs` and
    /// `probe_specs`), all or nothing: when an enforcing probe is over its limit, the request is
    /// refused and `checks` are judged without a charge, as a refusal charges nothing.
    pub(crate) async fn decide_with_probes(
        &self,
        checks: &[Check],
        specs: &[Arc<LimiterSpec>],
        probes: &[Check],
        probe_specs: &[Arc<LimiterSpec>],
    ) -> Probed {
        let probed = if probes.is_empty() {
            Vec::new()
        } else {
            self.peek_checks(probes, probe_specs).await
        };
        let refused_by_probe = probed
            .iter()
            .zip(probes)
            .any(|(v, c)| !v.allowed && !c.shadow);
        let (verdicts, errored, local) = if checks.is_empty() {
            (Vec::new(), false, SmallVec::new())
        } else if refused_by_probe {
            (
                self.peek_checks(checks, specs).await,
                false,
                SmallVec::new(),
            )
        } else {
            self.decide_checks(checks, specs).await
        };
        Probed {
            verdicts,
            probed,
            errored,
            local,
        }
    }

    /// Ask the store about `checks` (one per limiter in `limiters`) in one all-or-nothing
    /// decision, as [`Decider::decide_overridden`] does: the store's round trip counted, each
    /// limiter's `on_store_error` answer when it fails, and, when an enforcing check refuses,
    /// the other buckets reported as they stand (nothing was charged). `true` beside the
    /// verdicts: the store failed.
    pub(crate) async fn decide_checks(
        &self,
        checks: &[Check],
        limiters: &[Arc<LimiterSpec>],
    ) -> (Vec<Verdict>, bool, SmallVec<[bool; 4]>) {
        let (verdicts, local, store_error) = self.decide_on_store(limiters, checks).await;
        if let Some(e) = &store_error {
            tracing::warn!(error = %e, "rls: the store could not decide; each limiter's on_store_error answers");
        }
        let errored = store_error.is_some();
        let (verdicts, _) = super::charge_nothing_if_refused(verdicts, checks, |_| !errored);
        (verdicts, errored, local)
    }
}

/// What [`Decider::decide_with_probes`] found.
pub(crate) struct Probed {
    /// One per charged check, in order.
    pub(crate) verdicts: Vec<Verdict>,
    /// One per probe, in order.
    pub(crate) probed: Vec<Verdict>,
    /// The store failed: each limiter's `on_store_error` answered.
    pub(crate) errored: bool,
    /// Per charged check: a `local` limiter counted on this instance's bucket while the store
    /// failed.
    pub(crate) local: SmallVec<[bool; 4]>,
}

/// One check per limiter, keyed on the principal that limiter meters (on the stack for the
/// usual handful of limiters).
pub(crate) fn build_checks<'p>(
    digest: &KeyDigest,
    limiters: &[Arc<LimiterSpec>],
    principal: impl Fn(&LimiterSpec) -> keys::Principal<'p>,
    units: impl Fn(&LimiterSpec) -> NonZeroU32,
    budget: impl Fn(&LimiterSpec) -> (crate::limiter::Quota, Arc<str>),
) -> SmallVec<[Check; 4]> {
    limiters
        .iter()
        .map(|l| {
            let (quota, bucket) = budget(l);
            (l, quota, bucket)
        })
        .map(|(l, quota, bucket)| Check {
            key: digest.bucket_of(bucket, &l.key, &principal(l)),
            quota,
            shadow: l.mode != Mode::Enforce,
            units: units(l),
        })
        .collect()
}

impl Decider {
    /// The store's verdicts on `checks`, timed into the metrics; when it fails (or answers the
    /// wrong number of verdicts) each limiter's `on_store_error` answer, with which of them
    /// counted a local bucket, and the error.
    pub(super) async fn decide_on_store(
        &self,
        limiters: &[Arc<LimiterSpec>],
        checks: &[Check],
    ) -> (Vec<Verdict>, SmallVec<[bool; 4]>, Option<StoreError>) {
        // A store that decides in the process is timed on its own clock, and decides at the
        // reading that starts the timing: two readings of the clock instead of three.
        let started = self.clock.now();
        if let Some(v) = self.store.decide_in_process(checks, started) {
            let elapsed = self.clock.now().saturating_sub(started);
            self.metrics
                .store_round_trip(std::time::Duration::from_nanos(elapsed), None);
            return (v, SmallVec::new(), None);
        }
        let started = std::time::Instant::now();
        let answer = match self.store.decide(checks).await {
            Ok(v) if v.len() == checks.len() => Ok(v),
            Ok(v) => Err(StoreError::new(
                crate::store::StoreErrorKind::Script,
                format!(
                    "store answered {} verdicts for {} checks",
                    v.len(),
                    checks.len()
                ),
            )),
            Err(e) => Err(e),
        };
        let elapsed = started.elapsed();
        self.metrics
            .store_round_trip(elapsed, answer.as_ref().err().map(StoreError::kind));
        match answer {
            Ok(v) => (v, SmallVec::new(), None),
            // `on_store_error = "local"` limiters decide on this instance's buckets meanwhile.
            Err(e) => {
                let (v, local) = self.without_store(limiters, checks).await;
                (v, local, Some(e))
            }
        }
    }

    /// Each limiter's answer when the store could not decide, and which of them counted a
    /// bucket of this instance's own (`on_store_error = "local"`). The local limiters are
    /// decided together on the store's local buckets, all or nothing among themselves, unless
    /// an enforcing `deny` limiter refuses the request anyway: then nothing is counted and they
    /// answer like `allow`, as they do on a store that keeps no local buckets.
    async fn without_store(
        &self,
        limiters: &[Arc<LimiterSpec>],
        checks: &[Check],
    ) -> (Vec<Verdict>, SmallVec<[bool; 4]>) {
        let mut verdicts = fallback_verdicts(limiters, checks);
        let mut local: SmallVec<[bool; 4]> = SmallVec::from_elem(false, limiters.len());
        let is_local = |l: &LimiterSpec| l.on_store_error == OnStoreError::Local;
        let denied = limiters
            .iter()
            .any(|l| l.on_store_error == OnStoreError::Deny && l.mode == Mode::Enforce);
        if denied || !limiters.iter().any(|l| is_local(l)) {
            return (verdicts, local);
        }
        let picked: SmallVec<[usize; 4]> = (0..limiters.len())
            .filter(|&i| is_local(&limiters[i]))
            .collect();
        let subset: SmallVec<[Check; 4]> = picked.iter().map(|&i| checks[i].clone()).collect();
        let Some(decided) = self.store.decide_locally(&subset) else {
            return (verdicts, local);
        };
        match decided.await {
            Ok(v) if v.len() == picked.len() => {
                for (&i, v) in picked.iter().zip(v) {
                    verdicts[i] = v;
                    local[i] = true;
                }
            }
            Ok(_) | Err(_) => {
                tracing::debug!("the local buckets did not decide; local limiters allow");
            }
        }
        (verdicts, local)
    }
}

/// Each limiter's configured answer when the store cannot decide. A denial asks the client to
/// come back after one request's worth of refill: the only wait the quota itself implies.
/// `local` limiters answer like `allow` here (see [`Decider::without_store`] for their count).
pub(super) fn fallback_verdicts(limiters: &[Arc<LimiterSpec>], checks: &[Check]) -> Vec<Verdict> {
    limiters
        .iter()
        .zip(checks)
        .map(|(l, c)| {
            let allowed = l.on_store_error != OnStoreError::Deny;
            Verdict {
                allowed,
                limit: c.quota.limit(),
                remaining: 0,
                reset_after_ns: 0,
                retry_after_ns: if allowed {
                    0
                } else {
                    c.quota.emission_interval_ns()
                },
            }
        })
        .collect()
}

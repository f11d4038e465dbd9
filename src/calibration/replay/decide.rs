//! Each buffered request through the decision path, and the tallies the report is made of.

use super::*;

/// A principal as the logs name it: the client address, with the agent id for `ip+agent`
/// limiters and the logged user where there is one.
pub(super) fn principal(ip: IpAddr, p: &Pending, kind: &KeyKind) -> Box<str> {
    match (kind, &p.agent_id, &p.user) {
        (KeyKind::IpAgent, Some(a), _) => format!("{ip} agent {a}").into(),
        (KeyKind::IpAgent, None, _) => format!("{ip} no agent id").into(),
        (_, _, Some(u)) => format!("{ip} user {u}").into(),
        _ => ip.to_string().into(),
    }
}

impl Replayer {
    pub(super) fn new(cfg: &Config, opts: &Options) -> Self {
        let clock = ManualClock::new(ORIGIN);
        let store = MemoryStore::new(cfg.store.max_keys.max(100_000), Arc::new(clock.clone()));
        let secs = |s: u64| (s.min(10 * 365 * 86_400) as i64) * NS;
        Self {
            decider: Decider::new(cfg, Arc::new(store), Arc::new(SimVerifier)),
            clock,
            first: None,
            last_decided: i64::MIN,
            newest: i64::MIN,
            ahead: VecDeque::with_capacity(LOOK_AHEAD + 1),
            buffer: BTreeMap::new(),
            seq: 0,
            buffered_bytes: 0,
            window: secs(opts.reorder_seconds),
            timeout: secs(cfg.fleet.heartbeat_timeout_seconds.get()),
            limiters: BTreeMap::new(),
            agents: HashMap::new(),
            offline: BTreeMap::new(),
            malformed_sample: Vec::new(),
            report: ReplayReport {
                config: cfg.source.clone(),
                reorder_seconds: opts.reorder_seconds,
                reorder_budget_bytes: REORDER_BUDGET,
                identity: if opts.format.logs_agent_ids() {
                    "client address (and X-Agent-Id where logged); verified identity is not in access logs"
                } else {
                    "client address only: this log format has no X-Agent-Id, so agent-keyed limiters see every agent behind an address as one; verified identity is not in access logs"
                },
                offline_threshold_seconds: cfg.fleet.heartbeat_timeout_seconds.get(),
                ..ReplayReport::default()
            },
        }
    }

    /// Count a malformed line, and keep it (while few are kept) to try the other formats on.
    pub(super) fn malformed_line(&mut self, file: &str, line: u64, why: Malformed, text: &[u8]) {
        if self.malformed_sample.len() < SAMPLED_MALFORMED && text.len() <= SAMPLED_LINE_BYTES {
            self.malformed_sample.push(text.into());
        }
        self.malformed(file, line, why);
    }

    pub(super) fn malformed(&mut self, file: &str, line: u64, why: Malformed) {
        self.report.malformed += 1;
        *self
            .report
            .malformed_by_reason
            .entry(why.describe())
            .or_default() += 1;
        if self.report.first_malformed.len() < SHOWN_MALFORMED {
            self.report.first_malformed.push(BadLine {
                file: file.to_owned(),
                line,
                reason: why.describe(),
            });
        }
    }

    pub(super) async fn decide(&mut self, at: UnixNanos, p: &Pending) {
        let first = *self.first.get_or_insert(at);
        self.last_decided = at;
        // A line dated before the first decides at the first's time: the clock never goes back.
        self.clock
            .set(Nanos::try_from(at.max(first)).map_or(ORIGIN, |t| t.max(ORIGIN)));
        let path_only = p.target.split(['?', '#']).next().unwrap_or("/");
        let rules = self.decider.settings().paths;
        let Ok(path) = CanonicalPath::parse(path_only, rules) else {
            // The gateway refuses such a path before any limiter; nothing is metered.
            self.report.replayed += 1;
            return;
        };
        let forwarded: Vec<&[u8]> = p.forwarded.as_deref().into_iter().collect();
        let facts = RequestFacts {
            peer: p.peer,
            method: &p.method,
            path,
            forwarded: &forwarded,
            agent_id: p.agent_id.as_deref().map(str::as_bytes),
            authorization: None,
            session_token: None,
            key_headers: crate::decision::KeyHeaders::default(),
        };
        let outcome = self.decider.decide(&facts).await;
        self.report.replayed += 1;
        if !outcome.results.is_empty() {
            self.report.matched += 1;
        }
        let refused = outcome.refused();
        if refused {
            self.report.refused += 1;
        }
        for r in &outcome.results {
            let t = self.limiters.entry(r.spec.name.clone()).or_default();
            t.mode = match r.spec.mode {
                Mode::Enforce => "enforce",
                Mode::Shadow => "shadow",
                Mode::Off => "off",
            };
            t.metered += 1;
            t.window = i64::try_from(r.spec.quota.window().as_nanos()).unwrap_or(i64::MAX);
            let series = t.series.get_or_insert_with(|| Series {
                bin_seconds: PLOT_BIN_SECONDS,
                admitted: Vec::new(),
                refused: Vec::new(),
            });
            record_bounded(series, (at - first).max(0) as Nanos, r.verdict.allowed);
            let who = principal(outcome.client_ip.unwrap_or(p.peer), p, &r.spec.key);
            if r.verdict.allowed {
                if let Some(open) = t.open_runs.remove(&who) {
                    if open.ended_by(at, t.window) {
                        let run = at - open.start;
                        if run > t.longest.0 {
                            t.longest = (run, Some(who));
                        }
                    } else {
                        t.returned_later.push((who, open.last - open.start));
                    }
                }
                continue;
            }
            if r.spec.mode == Mode::Enforce {
                t.refused += 1;
            } else {
                t.shadow_refused += 1;
            }
            *t.by_principal.entry(who.clone()).or_default() += 1;
            let retry_after = i64::try_from(r.verdict.retry_after_ns).unwrap_or(i64::MAX);
            let open = t.open_runs.entry(who).or_insert(OpenRun {
                start: at,
                last: at,
                retry_after,
            });
            open.last = at;
            open.retry_after = retry_after;
        }
        let is_heartbeat = (&*p.method, path_only) == (traffic::HEARTBEAT.0, traffic::HEARTBEAT.1);
        if let (true, Some(agent)) = (is_heartbeat, &p.agent_id) {
            let hb = self.agents.entry(agent.clone()).or_insert(Heartbeats {
                last_admitted: at,
                last_seen: at,
                refused_since: false,
                worst_gap: 0,
            });
            hb.last_seen = at;
            if refused {
                hb.refused_since = true;
            } else {
                let gap = at - hb.last_admitted;
                if hb.refused_since && gap >= self.timeout {
                    let worst = self.offline.entry(agent.clone()).or_default();
                    *worst = (*worst).max(gap);
                }
                hb.worst_gap = hb.worst_gap.max(gap);
                hb.last_admitted = at;
                hb.refused_since = false;
            }
        }
    }

    /// Decide everything still buffered and close the open runs at the last instant.
    pub(super) async fn finish(mut self) -> ReplayReport {
        while let Some(next) = self.ahead.pop_front() {
            self.judge(next).await;
        }
        while let Some(((at, _), run)) = self.buffer.pop_first() {
            self.decide_run(at, run).await;
        }
        let end = self.last_decided;
        let mut last_refused = 0;
        for (agent, hb) in &self.agents {
            if !hb.refused_since {
                continue;
            }
            // Its last heartbeat was refused and it sent none after: offline only if its
            // refused heartbeats alone went past the threshold, not counted to the logs' end.
            last_refused += 1;
            let gap = hb.last_seen - hb.last_admitted;
            if gap >= self.timeout {
                let worst = self.offline.entry(agent.clone()).or_default();
                *worst = (*worst).max(gap);
            }
        }
        self.report.agents_last_heartbeat_refused = last_refused;
        self.report.seen.format_that_reads =
            if self.report.malformed * 2 > self.report.lines && !self.malformed_sample.is_empty() {
                summary::format_that_reads(&self.malformed_sample)
            } else {
                None
            };
        let mut r = self.report;
        r.span_seconds = self.first.map_or(0.0, |f| secs(end - f));
        r.agents_seen = self.agents.len() as u64;
        r.agents_offline = self
            .offline
            .into_iter()
            .map(|(agent_id, gap)| OfflineAgent {
                agent_id: agent_id.into(),
                longest_gap_seconds: secs(gap),
            })
            .collect();
        r.unmetered = r.replayed - r.matched.min(r.replayed);
        r.unmetered_percent = summary::percent(r.unmetered, r.replayed);
        if r.matched == 0 {
            r.no_limiter_matched = Some(if r.replayed == 0 {
                "No request matched any limiter: no line was replayed".to_owned()
            } else {
                format!(
                    "No request matched any limiter: none of the {} replayed requests is on a route this calibration meters",
                    r.replayed
                )
            });
        }
        for (name, t) in self.limiters {
            let mut unfinished = UnfinishedRuns::default();
            let mut longest: Option<(i64, Box<str>, &'static str)> = None;
            let open = t.open_runs.into_iter().map(|(who, run)| {
                let ends = if end - run.last < t.window {
                    STILL_REFUSED
                } else {
                    NEVER_SEEN_AGAIN
                };
                (who, run.last - run.start, ends)
            });
            let returned = t
                .returned_later
                .into_iter()
                .map(|(who, run)| (who, run, RETURNED_LATER));
            for (who, run, ends) in open.chain(returned) {
                match ends {
                    STILL_REFUSED => unfinished.still_refused_at_end += 1,
                    NEVER_SEEN_AGAIN => unfinished.never_seen_again += 1,
                    _ => unfinished.returned_later += 1,
                }
                let longer = longest
                    .as_ref()
                    .is_none_or(|(l, w, _)| run > *l || (run == *l && who < *w));
                if longer {
                    longest = Some((run, who, ends));
                }
            }
            unfinished.longest = longest.map(|(run, who, ends)| UnfinishedRun {
                principal: who.into(),
                refused_for_seconds: secs(run),
                ends,
            });
            let mut top: Vec<(String, u64)> = t
                .by_principal
                .into_iter()
                .map(|(k, n)| (k.into(), n))
                .collect();
            top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            top.truncate(SHOWN_PRINCIPALS);
            r.limiters.push(LimiterReport {
                name: name.to_string(),
                mode: t.mode,
                metered: t.metered,
                refused: t.refused,
                shadow_refused: t.shadow_refused,
                top_refused: top,
                longest_refusal_run_seconds: secs(t.longest.0),
                longest_refusal_run_principal: t.longest.1.map(Into::into),
                unfinished_refusal_runs: unfinished,
                series: t.series.unwrap_or_default(),
            });
        }
        summary::summarise(&mut r);
        r
    }
}

/// The bin widths a series widens through, in seconds: each a multiple of the one before.
pub(super) const WIDER_BINS: [u64; 9] = [60, 300, 600, 1_800, 3_600, 7_200, 21_600, 43_200, 86_400];

/// Count one decision in `series`, merging its bins into wider ones first if `at` lies past
/// [`MAX_PLOT_BINS`] of them, so logs spanning years keep a bounded series.
pub(super) fn record_bounded(series: &mut Series, at: Nanos, admitted: bool) {
    let ns = NS as Nanos;
    while (at / (series.bin_seconds.get() * ns)) as usize >= MAX_PLOT_BINS {
        let now = series.bin_seconds.get();
        let wider = WIDER_BINS
            .iter()
            .copied()
            .find(|w| *w > now && w % now == 0)
            .unwrap_or(now * 2);
        let k = (wider / now) as usize;
        let merge = |v: &[u64]| v.chunks(k).map(|c| c.iter().sum()).collect::<Vec<u64>>();
        series.admitted = merge(&series.admitted);
        series.refused = merge(&series.refused);
        series.bin_seconds = std::num::NonZeroU64::new(wider).unwrap_or(series.bin_seconds);
    }
    series.record(at, admitted);
}

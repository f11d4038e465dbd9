//! Redis Cluster: a request's checks grouped by slot, one call per slot sent at once, and the
//! refund of what one slot consumed when another refused.

use super::conn::classify;
use super::conn::Conn;
use super::scripts::{key_name, parse_answer, push_check, GroupAnswer};
use super::{Inner, StoreError, StoreErrorKind};
use crate::limiter::{Algorithm, Verdict};
use crate::store::Check;
use futures_util::future::join_all;
use redis::{Cmd, RedisResult};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Inner {
    /// Cluster: one call per slot the request's keys sit on, sent at once; refunds when one
    /// slot refused while another consumed.
    pub(super) async fn decide_by_slot(
        self: &Arc<Self>,
        conn: &Arc<Conn>,
        checks: &[Check],
    ) -> Result<Vec<Verdict>, StoreError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let now = self.now_args();
        let keys: Vec<String> = checks.iter().map(|c| key_name(&c.key)).collect();
        let groups = self.groups(&keys);
        let calls = groups
            .iter()
            .map(|g| self.run_group(conn, checks, &keys, g, &now));
        let deadline = tokio::time::Instant::now() + self.opts.timeout;
        let answers = match tokio::time::timeout_at(deadline, join_all(calls)).await {
            Ok(a) => a,
            Err(_) => {
                self.failed_in_row();
                return Err(self.failed(
                    StoreErrorKind::Timeout,
                    format!("no answer within {:?}", self.opts.timeout),
                ));
            }
        };
        let mut verdicts: Vec<Option<Verdict>> = vec![None; checks.len()];
        let mut done = Vec::with_capacity(groups.len());
        let mut error = None;
        for (g, a) in groups.iter().zip(answers) {
            match a {
                Ok(a) => {
                    for (&i, v) in g.iter().zip(&a.verdicts) {
                        verdicts[i] = Some(*v);
                    }
                    done.push((g, a));
                }
                Err(e) => error = Some(e),
            }
        }
        let blocked = error.is_some() || done.iter().any(|(_, a)| !a.committed);
        if blocked && groups.len() > 1 {
            let refund = self.give_back(conn, checks, &keys, &done, &now);
            if tokio::time::timeout_at(deadline, refund).await.is_err() {
                tracing::debug!("redis store: a refund did not finish within the timeout");
            }
        }
        if let Some(e) = error {
            self.failed_in_row();
            return Err(self.failed(classify(&e), e.to_string()));
        }
        match verdicts.into_iter().collect::<Option<Vec<_>>>() {
            Some(v) => Ok(v),
            None => Err(self.failed(
                StoreErrorKind::Script,
                "the script left a check unanswered".into(),
            )),
        }
    }

    /// The checks' indices grouped by Cluster slot.
    pub(super) fn groups(&self, keys: &[String]) -> Vec<Vec<usize>> {
        let mut by_slot: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            by_slot
                .entry(redis::cluster_routing::get_slot(k.as_bytes()))
                .or_default()
                .push(i);
        }
        by_slot.into_values().collect()
    }

    pub(super) async fn run_group(
        &self,
        conn: &Conn,
        checks: &[Check],
        keys: &[String],
        group: &[usize],
        now: &[String; 2],
    ) -> RedisResult<GroupAnswer> {
        let wall = self.opts.clock.now();
        let args = |cmd: &mut Cmd| {
            for &i in group {
                cmd.arg(&keys[i]);
            }
            self.push_clock(cmd, now);
            for &i in group {
                push_check(
                    cmd,
                    &checks[i].quota,
                    checks[i].shadow,
                    checks[i].units,
                    wall,
                );
            }
        };
        let value = self.slot.run(conn, group.len(), args).await?;
        parse_answer(&value, group.iter().map(|&i| &checks[i].quota))
    }

    /// A different slot refused: give back what the committed groups consumed. Returns how
    /// many buckets were touched.
    pub(super) async fn give_back(
        &self,
        conn: &Conn,
        checks: &[Check],
        keys: &[String],
        done: &[(&Vec<usize>, GroupAnswer)],
        now: &[String; 2],
    ) -> usize {
        let mut jobs = Vec::new();
        for (g, a) in done.iter().filter(|(_, a)| a.committed) {
            for (pos, &i) in g.iter().enumerate() {
                if a.written[pos].is_empty() {
                    continue;
                }
                let same: Vec<usize> = (0..g.len()).filter(|&p| keys[g[p]] == keys[i]).collect();
                let first = same.first().copied().unwrap_or(pos);
                let units: u64 = same
                    .iter()
                    .filter(|&&p| a.verdicts[p].allowed)
                    .map(|&p| u64::from(checks[g[p]].units.get()))
                    .sum();
                let q = &checks[i].quota;
                let algo = if q.algorithm == Algorithm::Gcra {
                    "g"
                } else {
                    "f"
                };
                let args = vec![
                    a.written[pos].clone(),
                    a.before[first].clone(),
                    algo.to_owned(),
                    q.emission_interval_ns().to_string(),
                    units.to_string(),
                ];
                jobs.push(([keys[i].clone()], args));
            }
        }
        if !jobs.is_empty() {
            self.refunds.fetch_add(1, Ordering::Relaxed);
            let calls = jobs.iter().map(|(k, args)| {
                self.refund.run(conn, 1, move |cmd: &mut Cmd| {
                    cmd.arg(k);
                    self.push_clock(cmd, now);
                    cmd.arg(args);
                })
            });
            for r in join_all(calls).await {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "redis store: a refund failed");
                }
            }
        }
        jobs.len()
    }
}

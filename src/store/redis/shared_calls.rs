//! Standalone: concurrent requests share script calls. They wait in a bounded queue, and the
//! batching loop sends what waits as one `batch.lua` call whenever a call slot is free.

use super::conn::{classify, is_connection_error, is_readonly};
use super::scripts::{key_name, parse_shared, push_check};
use super::{Inner, StoreError, StoreErrorKind};
use crate::limiter::{Quota, Verdict};
use crate::store::Check;
use redis::Cmd;
use std::num::NonZeroU32;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use tokio::sync::mpsc::error::TrySendError;

/// Most checks one shared call carries (Redis runs nothing else while a script runs: about
/// 0.4 ms for this many on the machine of docs/benchmarks.md).
pub(crate) const MAX_CALL_CHECKS: usize = 64;
/// Most requests waiting for a call; beyond that a decision fails at once (each limiter's
/// `on_store_error` answers) instead of queueing without bound.
pub(crate) const MAX_WAITING: usize = 4096;

impl Inner {
    /// Standalone: queue the request for the next shared call and wait for its answer.
    pub(super) async fn decide_shared(
        self: &Arc<Self>,
        jobs: &tokio::sync::mpsc::Sender<Job>,
        checks: &[Check],
    ) -> Result<Vec<Verdict>, StoreError> {
        let deadline = tokio::time::Instant::now() + self.opts.timeout;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job {
            keys: checks.iter().map(|c| key_name(&c.key)).collect(),
            checks: checks
                .iter()
                .map(|c| (c.quota, c.shadow, c.units))
                .collect(),
            reply,
        };
        if let Err(e) = jobs.try_send(job) {
            let (kind, msg) = match e {
                TrySendError::Full(_) => (
                    StoreErrorKind::Overload,
                    format!("{MAX_WAITING} decisions already wait for redis"),
                ),
                TrySendError::Closed(_) => {
                    (StoreErrorKind::Internal, "the store stopped".to_owned())
                }
            };
            return Err(self.failed(kind, msg));
        }
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(Ok(verdicts))) => Ok(verdicts),
            Ok(Ok(Err((kind, msg)))) => Err(self.failed(kind, msg)),
            Ok(Err(_)) => Err(self.failed(StoreErrorKind::Internal, "the store stopped".into())),
            Err(_) => {
                self.failed_in_row();
                Err(self.failed(
                    StoreErrorKind::Timeout,
                    format!("no answer within {:?}", self.opts.timeout),
                ))
            }
        }
    }

    /// Send one shared call for `jobs` and answer each of them.
    pub(super) async fn run_jobs(self: Arc<Self>, jobs: Vec<Job>) {
        let conn = self.conn.read().clone();
        let Some(conn) = conn else {
            self.reconnect();
            for job in jobs {
                let _ = job.reply.send(Err((
                    StoreErrorKind::Connection,
                    "not connected; reconnecting in the background".into(),
                )));
            }
            return;
        };
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let now = self.now_args();
        let wall = self.opts.clock.now();
        let nkeys = jobs.iter().map(|j| j.keys.len()).sum();
        let args = |cmd: &mut Cmd| {
            for job in &jobs {
                cmd.arg(&job.keys);
            }
            self.push_clock(cmd, &now);
            for job in &jobs {
                cmd.arg(job.checks.len());
                for (quota, shadow, units) in &job.checks {
                    push_check(cmd, quota, *shadow, *units, wall);
                }
            }
        };
        let answer = self.batch.run(&conn, nkeys, args).await;
        let requests: Vec<&[(Quota, bool, NonZeroU32)]> =
            jobs.iter().map(|j| j.checks.as_slice()).collect();
        match answer.and_then(|v| parse_shared(&v, &requests)) {
            Ok(verdicts) => {
                for (job, v) in jobs.into_iter().zip(verdicts) {
                    let _ = job.reply.send(Ok(v));
                }
            }
            Err(e) => {
                if is_readonly(&e) {
                    self.demoted(&conn);
                } else if is_connection_error(&e) {
                    // Drop the broken connection (unless a fresh one already replaced it).
                    let mut slot = self.conn.write();
                    if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                        *slot = None;
                    }
                    drop(slot);
                    self.reconnect();
                } else {
                    self.failed_in_row();
                }
                let (kind, msg) = (classify(&e), e.to_string());
                for job in jobs {
                    let _ = job.reply.send(Err((kind, msg.clone())));
                }
            }
        }
    }
}

/// A standalone request waiting for a shared call.
pub(super) struct Job {
    pub(super) keys: Vec<String>,
    pub(super) checks: Vec<(Quota, bool, NonZeroU32)>,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<Vec<Verdict>, (StoreErrorKind, String)>>,
}

/// The store's batching loop (standalone): while fewer than `calls_in_flight` calls are out,
/// send everything that waits (up to [`MAX_CALL_CHECKS`] checks) as one call, in arrival order.
/// Requests whose caller already gave up are dropped before they reach Redis.
pub(super) async fn share_calls(
    weak: Weak<Inner>,
    mut waiting: tokio::sync::mpsc::Receiver<Job>,
    calls_in_flight: usize,
) {
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let mut in_flight = FuturesUnordered::new();
    let mut next: Option<Job> = None;
    loop {
        let first = tokio::select! {
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => continue,
            job = async {
                match next.take() {
                    Some(job) => Some(job),
                    None => waiting.recv().await,
                }
            }, if in_flight.len() < calls_in_flight => job,
        };
        let Some(first) = first else { return };
        let Some(inner) = weak.upgrade() else { return };
        let mut checks = first.checks.len();
        let mut jobs = vec![first];
        while let Ok(job) = waiting.try_recv() {
            if checks + job.checks.len() > MAX_CALL_CHECKS {
                next = Some(job);
                break;
            }
            checks += job.checks.len();
            jobs.push(job);
        }
        jobs.retain(|j| !j.reply.is_closed());
        if !jobs.is_empty() {
            in_flight.push(inner.run_jobs(jobs));
        }
    }
}

//! The look-ahead that sets outliers aside and the reorder buffer that replays lines in time order.

use super::*;

impl Replayer {
    /// Take one parsed line into the look-ahead; the line it pushes out is judged.
    pub(super) async fn push(
        &mut self,
        f: &Fields<'_>,
        file: usize,
        line: u64,
    ) -> Result<(), Malformed> {
        let at = f.time.ok_or(Malformed::Time)?;
        fn text(b: &[u8]) -> Result<&str, Malformed> {
            std::str::from_utf8(b).map_err(|_| Malformed::Bytes)
        }
        let peer: IpAddr = text(f.addr)?.parse().map_err(|_| Malformed::Address)?;
        let request = Pending {
            peer,
            method: text(f.method)?.into(),
            target: text(f.target)?.into(),
            forwarded: f.forwarded.map(Into::into),
            agent_id: f.agent_id.map(text).transpose()?.map(Into::into),
            user: f.user.map(text).transpose()?.map(Into::into),
        };
        self.ahead.push_back(Ahead {
            at,
            file,
            line,
            request,
        });
        if self.ahead.len() > LOOK_AHEAD {
            if let Some(next) = self.ahead.pop_front() {
                self.judge(next).await;
            }
        }
        Ok(())
    }

    /// Set `x` aside when it would move the clock while most lines after it are dated more
    /// than the reorder window before it; otherwise accept it.
    pub(super) async fn judge(&mut self, x: Ahead) {
        let moves_clock = self.newest == i64::MIN || x.at > self.newest.saturating_add(self.window);
        let cutoff = x.at.saturating_sub(self.window);
        let after = self.ahead.len();
        let behind = self.ahead.iter().filter(|a| a.at < cutoff).count();
        let outlier = moves_clock && behind * 2 > after;
        // The log's disorder: how far each line is dated before the newest line before it,
        // outliers counted unless a clock set wrong put them far ahead.
        let seen = &mut self.report.seen;
        let far = FAR_SECONDS * NS;
        if let Some(newest) = seen.newest {
            let back = newest.saturating_sub(x.at);
            if back <= far {
                seen.disorder_max = seen.disorder_max.max(back);
            }
        }
        let far_ahead = outlier
            && self
                .ahead
                .iter()
                .map(|a| a.at)
                .min()
                .is_some_and(|e| x.at.saturating_sub(e) > far);
        if !far_ahead && seen.newest.is_none_or(|n| x.at > n) {
            seen.newest = Some(x.at);
        }
        if outlier {
            self.outlier(&x);
        } else {
            self.accept(x.at, x.request).await;
        }
    }

    pub(super) fn outlier(&mut self, x: &Ahead) {
        self.report.outliers += 1;
        // Accepted, it would have made lines up to this far behind it late.
        let earliest = self.ahead.iter().map(|a| a.at).min().unwrap_or(x.at);
        if x.at.saturating_sub(earliest) > FAR_SECONDS * NS {
            self.report.seen.outliers_far += 1;
        }
        if self.report.first_outliers.len() >= SHOWN_OUTLIERS {
            return;
        }
        let mut after: Vec<UnixNanos> = self.ahead.iter().map(|a| a.at).collect();
        after.sort_unstable();
        let median = after.get(after.len() / 2).copied().unwrap_or(x.at);
        self.report.first_outliers.push(Outlier {
            file: self.report.files.get(x.file).cloned().unwrap_or_default(),
            line: x.line,
            dated: emit::rfc3339(x.at),
            ahead_seconds: secs(x.at.saturating_sub(median)),
        });
    }

    /// Put an accepted line in the reorder buffer and decide what has left its window (or,
    /// with the buffer full, the earliest lines).
    pub(super) async fn accept(&mut self, at: UnixNanos, request: Pending) {
        if at < self.newest.saturating_sub(self.window) {
            self.report.late += 1;
            if self.newest.saturating_sub(at) > FAR_SECONDS * NS {
                self.report.seen.late_far += 1;
            }
            return;
        }
        if at < self.last_decided {
            self.report.late += 1;
            self.report.seen.late_after_early += 1;
            return;
        }

        let last_at_this_instant = self
            .buffer
            .range_mut((at, 0)..=(at, u64::MAX))
            .next_back()
            .map(|(_, run)| run);
        match last_at_this_instant {
            Some(run) if run.request == request => run.count += 1,
            _ => {
                self.buffered_bytes += RUN_BYTES + request.text_bytes();
                self.seq += 1;
                self.buffer
                    .insert((at, self.seq), Run { request, count: 1 });
            }
        }
        self.newest = self.newest.max(at);
        let horizon = self.newest.saturating_sub(self.window);
        while let Some(entry) = self.buffer.first_entry() {
            let early = entry.key().0 > horizon;
            if early && self.buffered_bytes <= REORDER_BUDGET {
                break;
            }
            let ((at, _), run) = entry.remove_entry();
            if early {
                self.report.decided_early += run.count;
            }
            self.decide_run(at, run).await;
        }
    }

    pub(super) async fn decide_run(&mut self, at: UnixNanos, run: Run) {
        self.buffered_bytes = self
            .buffered_bytes
            .saturating_sub(RUN_BYTES + run.request.text_bytes());
        for _ in 0..run.count {
            self.decide(at, &run.request).await;
        }
    }
}

//! The Lua scripts and their encoding: the key of a bucket, the arguments of a check, and the
//! verdicts read back from an answer.

use super::conn::Conn;
use super::Inner;
use crate::clock::Nanos;
use crate::keys::BucketKey;
use crate::limiter::{Algorithm, Quota, Verdict};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};
use std::num::NonZeroU32;

pub(super) const SLOT_LUA: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("lockout.lua"),
    include_str!("decide.lua"),
    include_str!("slot.lua")
);
pub(super) const BATCH_LUA: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("lockout.lua"),
    include_str!("decide.lua"),
    include_str!("batch.lua")
);
pub(super) const REFUND_LUA: &str =
    concat!(include_str!("prelude.lua"), include_str!("refund.lua"));

pub(super) struct Script {
    sha: String,
    src: &'static str,
}

impl Script {
    pub(super) fn new(src: &'static str) -> Self {
        Self {
            sha: redis::Script::new(src).get_hash().to_owned(),
            src,
        }
    }

    /// `EVALSHA`, and `EVAL` (which also caches the script) when the server does not know it.
    /// `args` appends the keys and the arguments after the key count.
    pub(super) async fn run(
        &self,
        conn: &Conn,
        nkeys: usize,
        args: impl Fn(&mut Cmd),
    ) -> RedisResult<Value> {
        let build = |name: &str, body: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(body).arg(nkeys);
            args(&mut cmd);
            cmd
        };
        match conn.query(&build("EVALSHA", &self.sha)).await {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                conn.query(&build("EVAL", self.src)).await
            }
            other => other,
        }
    }
}

/// The Redis key of a bucket: the hash tag is the whole bucket name.
pub(crate) fn key_name(key: &BucketKey) -> String {
    format!("fl:{{{key}}}")
}

impl Inner {
    pub(super) fn now_args(&self) -> [String; 2] {
        if self.opts.time_from_clock {
            let now = self.opts.clock.now();
            [
                (now / 1_000_000_000).to_string(),
                (now % 1_000_000_000).to_string(),
            ]
        } else {
            [String::new(), String::new()]
        }
    }

    /// The arguments every script starts with (`prelude.lua`'s ARGV[1..3]): now, and the
    /// padding added to every expiry.
    pub(super) fn push_clock(&self, cmd: &mut Cmd, now: &[String; 2]) {
        cmd.arg(&now[0])
            .arg(&now[1])
            .arg(self.opts.ttl_pad.as_millis() as u64);
    }
}

/// One slot's share of a request, as the script answered it.
pub(super) struct GroupAnswer {
    pub(super) committed: bool,
    pub(super) verdicts: Vec<Verdict>,
    pub(super) before: Vec<String>,
    pub(super) written: Vec<String>,
}

/// The seven script arguments of one check (see `decide.lua`). `now` (ns since the Unix epoch)
/// places a calendar window's boundary: its window is the time left until then.
pub(super) fn push_check(cmd: &mut Cmd, q: &Quota, shadow: bool, units: NonZeroU32, now: Nanos) {
    let limit = u64::from(q.limit());
    let (algo, p, burst) = match q.algorithm {
        Algorithm::Gcra => {
            let t = q.emission_interval_ns();
            ("g", t, t.saturating_mul(limit))
        }
        Algorithm::FixedWindow => ("f", q.window_end(now).saturating_sub(now).max(1), 0),
    };
    cmd.arg(algo)
        .arg(limit)
        .arg(p)
        .arg(burst)
        .arg(if shadow { "1" } else { "0" })
        .arg(units.get())
        .arg(q.lockout_ns().unwrap_or(0));
}

pub(super) fn int(v: &Value) -> RedisResult<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        other => redis::from_redis_value(other),
    }
}

/// A check's four integers from a script's answer: allowed, remaining, reset after, retry after.
pub(super) fn verdict(q: &Quota, v: &[Value]) -> RedisResult<Verdict> {
    Ok(Verdict {
        allowed: int(&v[0])? == 1,
        limit: q.limit(),
        remaining: int(&v[1])?.clamp(0, u32::MAX as i64) as u32,
        reset_after_ns: int(&v[2])?.max(0) as u64,
        retry_after_ns: int(&v[3])?.max(0) as u64,
    })
}

pub(super) fn unexpected() -> RedisError {
    RedisError::from((
        ErrorKind::TypeError,
        "unexpected answer from the decision script",
    ))
}

/// `batch.lua`'s answer: per request (each given by its checks), committed then four integers
/// per check.
pub(super) fn parse_shared(
    value: &Value,
    requests: &[&[(Quota, bool, NonZeroU32)]],
) -> RedisResult<Vec<Vec<Verdict>>> {
    let Value::Array(items) = value else {
        return Err(unexpected());
    };
    let want: usize = requests.iter().map(|checks| 1 + 4 * checks.len()).sum();
    if items.len() != want {
        return Err(unexpected());
    }
    let mut at = 0;
    let mut out = Vec::with_capacity(requests.len());
    for checks in requests {
        at += 1; // committed: the verdicts already say it
        let mut verdicts = Vec::with_capacity(checks.len());
        for (q, _, _) in checks.iter() {
            verdicts.push(verdict(q, &items[at..at + 4])?);
            at += 4;
        }
        out.push(verdicts);
    }
    Ok(out)
}

pub(super) fn parse_answer<'q>(
    value: &Value,
    quotas: impl ExactSizeIterator<Item = &'q Quota>,
) -> RedisResult<GroupAnswer> {
    let n = quotas.len();
    let Value::Array(items) = value else {
        return Err(unexpected());
    };
    if items.len() != 1 + 6 * n {
        return Err(unexpected());
    }
    let text = |i: usize| -> RedisResult<String> { redis::from_redis_value(&items[i]) };
    let committed = int(&items[0])? == 1;
    let mut verdicts = Vec::with_capacity(n);
    for (k, q) in quotas.enumerate() {
        let b = 1 + 4 * k;
        verdicts.push(verdict(q, &items[b..b + 4])?);
    }
    let mut before = Vec::with_capacity(n);
    let mut written = Vec::with_capacity(n);
    for k in 0..n {
        let b = 1 + 4 * n + 2 * k;
        before.push(text(b)?);
        written.push(text(b + 1)?);
    }
    Ok(GroupAnswer {
        committed,
        verdicts,
        before,
        written,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn key_names_are_one_hash_tag_per_bucket() {
        let k = BucketKey::new(Arc::from("agent-device"), "1.2.3.4|a1");
        let name = key_name(&k);
        assert_eq!(name, format!("fl:{{agent-device:{}}}", k.digest_hex()));
        assert!(!name.contains("1.2.3.4"), "only digests reach Redis");
    }
}

//! An operator's levers on the Redis store: a bucket judged without counting (`peek.lua`), a
//! bucket forgotten (`DEL`), and the small tables every instance reads (`table.lua`: run-time
//! overrides and resets, under the hash tag `{levers}` so a Cluster keeps each in one slot).

use super::conn::{self, Conn};
use super::scripts::{int, key_name, push_check, unexpected, verdict};
use super::{Inner, RedisStore};
use crate::keys::BucketKey;
use crate::limiter::Verdict;
use crate::store::{Check, SharedTable, StoreError, StoreErrorKind};
use futures_util::future::BoxFuture;
use redis::Value;
use std::sync::Arc;

pub(super) const PEEK_LUA: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("lockout.lua"),
    include_str!("decide.lua"),
    include_str!("peek.lua")
);
pub(super) const TABLE_LUA: &str = include_str!("table.lua");

/// Longest table name.
const MAX_TABLE_NAME: usize = 32;

fn table_keys(name: &str) -> [String; 2] {
    [
        format!("fl:{{levers}}:{name}"),
        format!("fl:{{levers}}:{name}:v"),
    ]
}

impl Inner {
    fn connected(&self) -> Result<Arc<Conn>, StoreError> {
        self.conn
            .read()
            .clone()
            .ok_or_else(|| StoreError::new(StoreErrorKind::Connection, "redis: not connected"))
    }

    async fn bounded<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.opts.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(StoreError::new(
                conn::classify(&e),
                format!("redis: {what}: {}", crate::redact::urls_in(&e.to_string())),
            )),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!("redis: {what}: no answer within {:?}", self.opts.timeout),
            )),
        }
    }

    /// Each check judged alone (one key per call, so any Cluster routes it), nothing written.
    pub(super) async fn peek(&self, checks: &[Check]) -> Result<Vec<Verdict>, StoreError> {
        let conn = self.connected()?;
        let now = self.now_args();
        let wall = self.opts.clock.now();
        let mut out = Vec::with_capacity(checks.len());
        for c in checks {
            let key = key_name(&c.key);
            let answer = self
                .bounded(
                    "peek",
                    self.peek_script.run(&conn, 1, |cmd| {
                        cmd.arg(&key);
                        self.push_clock(cmd, &now);
                        push_check(cmd, &c.quota, c.shadow, c.units, wall);
                    }),
                )
                .await?;
            let parsed = match &answer {
                Value::Array(v) if v.len() == 4 => verdict(&c.quota, v),
                _ => Err(unexpected()),
            };
            out.push(parsed.map_err(|e| {
                StoreError::new(StoreErrorKind::Script, format!("redis: peek: {e}"))
            })?);
        }
        Ok(out)
    }

    /// `DEL` each bucket (one key per call), and drop this instance's cached refusal of it.
    pub(super) async fn reset(&self, keys: &[BucketKey]) -> Result<u64, StoreError> {
        let conn = self.connected()?;
        let mut held = 0;
        for k in keys {
            self.cache.forget(k);
            let n = self
                .bounded("reset", conn.query(redis::cmd("DEL").arg(key_name(k))))
                .await?;
            held += u64::from(int(&n).unwrap_or(0) > 0);
        }
        Ok(held)
    }

    /// Forget this instance's cached refusal of `key` (another instance reset it).
    pub(super) fn forget_cached(&self, key: &BucketKey) {
        self.cache.forget(key);
    }

    async fn table(&self, name: &str, args: &[&str]) -> Result<Vec<Value>, StoreError> {
        if name.is_empty() || name.len() > MAX_TABLE_NAME {
            return Err(StoreError::new(
                StoreErrorKind::Config,
                "redis: a table name is 1-32 characters",
            ));
        }
        let conn = self.connected()?;
        let keys = table_keys(name);
        let answer = self
            .bounded(
                "table",
                self.table_script.run(&conn, 2, |cmd| {
                    cmd.arg(&keys[0]).arg(&keys[1]);
                    for a in args {
                        cmd.arg(*a);
                    }
                }),
            )
            .await?;
        match answer {
            Value::Array(v) if !v.is_empty() => Ok(v),
            _ => Err(StoreError::new(
                StoreErrorKind::Script,
                "redis: table: unexpected answer",
            )),
        }
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

impl SharedTable for RedisStore {
    fn read<'a>(
        &'a self,
        name: &'a str,
        known: u64,
    ) -> BoxFuture<'a, Result<crate::store::TableRead, StoreError>> {
        Box::pin(async move {
            let known_s = known.to_string();
            let v = self.inner.table(name, &["read", &known_s]).await?;
            let version = int(&v[0])
                .ok()
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or(0);
            // The same version: nothing changed. Another: every entry (none, for an empty table).
            if version == known {
                return Ok((version, None));
            }
            let entries = v[1..]
                .chunks(2)
                .filter_map(|p| match p {
                    [k, val] => Some((text(k)?, text(val)?)),
                    _ => None,
                })
                .collect();
            Ok((version, Some(entries)))
        })
    }

    fn write<'a>(
        &'a self,
        name: &'a str,
        id: &'a str,
        value: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let args: Vec<&str> = match value {
                Some(v) => vec!["set", id, v],
                None => vec!["del", id],
            };
            self.inner.table(name, &args).await.map(|_| ())
        })
    }
}

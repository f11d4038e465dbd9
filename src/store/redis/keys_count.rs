//! The count of bucket keys: a bounded SCAN of every node, off the request path.

use super::conn::Conn;
use super::Inner;
use redis::Value;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

/// How often the count of bucket keys is refreshed.
pub(super) const KEY_COUNT_EVERY: Duration = Duration::from_secs(10);
/// Keys of the limiter's buckets (`fl:{<limiter>:<hex digest>}`); nothing else matches.
pub(super) const BUCKET_PATTERN: &str = "fl:{*";
/// Keys one SCAN step examines.
pub(super) const SCAN_COUNT: usize = 1000;
/// Most SCAN steps one refresh takes per node (a million keys examined). Beyond that the count
/// is of the part examined: a lower bound.
pub(super) const MAX_SCAN_STEPS: usize = 1000;

/// Refresh the count of bucket keys until the store is dropped: off the request path, one
/// bounded SCAN pass per node every [`KEY_COUNT_EVERY`], each step bounded by the connect timeout.
pub(super) async fn count_keys(weak: Weak<Inner>) {
    loop {
        tokio::time::sleep(KEY_COUNT_EVERY).await;
        let Some(inner) = weak.upgrade() else { return };
        let conn = inner.conn.read().clone();
        if let Some(conn) = conn {
            if let Some(n) = count_buckets(&inner, &conn).await {
                inner.keys.store(n, Ordering::Relaxed);
            }
        }
    }
}

/// Bucket keys on a standalone server, or on every master of a Cluster.
pub(super) async fn count_buckets(inner: &Inner, conn: &Conn) -> Option<u64> {
    match conn {
        Conn::Single(_) => scan_node(inner, conn, None).await,
        Conn::Cluster(_) => {
            let mut total = 0;
            for node in masters(inner, conn).await? {
                total += scan_node(inner, conn, Some(node)).await?;
            }
            Some(total)
        }
    }
}

/// `host:port` of each Cluster master that is not failing, from `CLUSTER NODES`.
pub(super) async fn masters(inner: &Inner, conn: &Conn) -> Option<Vec<(String, u16)>> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("NODES");
    let v = tokio::time::timeout(inner.opts.connect_timeout, conn.query(&cmd))
        .await
        .ok()?
        .ok()?;
    let text: String = redis::from_redis_value(&v).ok()?;
    let nodes = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let addr = fields.nth(1)?;
            let flags = fields.next()?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            let hostport = addr.split('@').next()?;
            let (host, port) = hostport.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect();
    Some(nodes)
}

/// Bucket keys on one node (`None`: the standalone server), by `SCAN ... MATCH fl:{*`, the
/// shared tables' keys left out.
pub(super) async fn scan_node(
    inner: &Inner,
    conn: &Conn,
    node: Option<(String, u16)>,
) -> Option<u64> {
    use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
    let mut cursor: u64 = 0;
    let mut found = 0u64;
    for _ in 0..MAX_SCAN_STEPS {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(BUCKET_PATTERN)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let step = async {
            match (conn, &node) {
                (Conn::Cluster(c), Some((host, port))) => {
                    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port: *port,
                    });
                    c.clone().route_command(&cmd, routing).await
                }
                _ => conn.query(&cmd).await,
            }
        };
        let v = tokio::time::timeout(inner.opts.connect_timeout, step)
            .await
            .ok()?
            .ok()?;
        let (next, keys): (u64, Vec<Value>) = redis::from_redis_value(&v).ok()?;
        // The shared tables (`fl:{levers}:…`: overrides, resets, the top-talker lists) share
        // the prefix and are not buckets.
        found += keys
            .iter()
            .filter(|k| match k {
                Value::BulkString(b) => !b.starts_with(b"fl:{levers}"),
                _ => true,
            })
            .count() as u64;
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Some(found)
}

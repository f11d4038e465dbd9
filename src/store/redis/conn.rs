//! One connection to Redis (a server or a Cluster) and what its errors mean: the commands it
//! runs, the kind of each failure, and the check that a server just reached is a primary.
//! Below both the connection's life cycle (`connection.rs`) and Sentinel (`sentinel.rs`).

use super::StoreErrorKind;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Value};

/// A connection that multiplexes every request of the process.
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(super) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
    }
}

pub(super) fn is_connection_error(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

/// A server that refuses writes because it is a replica now: a primary demoted by a failover
/// (Sentinel, a managed service, an operator's `REPLICAOF`). The connection works, so nothing
/// else would make the store leave it.
pub(super) fn is_readonly(e: &RedisError) -> bool {
    e.kind() == ErrorKind::ReadOnly
}

/// Whether `ROLE`'s answer names a replica (Redis answers `slave`; `replica` is accepted too).
/// Anything else is taken as a primary: proxies and managed services that do not know `ROLE`
/// must keep working.
fn answers_as_replica(role: &Value) -> bool {
    let first = match role {
        Value::Array(items) => items.first(),
        _ => None,
    };
    match first {
        Some(Value::BulkString(b)) => b.as_slice() == b"slave" || b.as_slice() == b"replica",
        Some(Value::SimpleString(s)) => s == "slave" || s == "replica",
        _ => false,
    }
}

/// The kind of a redis-rs error: a timeout, a connection that failed or a server that cannot
/// serve right now, settings that cannot work, or else a script that failed or answered wrong.
pub(super) fn classify(e: &RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        return StoreErrorKind::Timeout;
    }
    if e.is_connection_dropped() || e.is_connection_refusal() || e.is_io_error() {
        return StoreErrorKind::Connection;
    }
    match e.kind() {
        ErrorKind::AuthenticationFailed
        | ErrorKind::BusyLoadingError
        | ErrorKind::TryAgain
        | ErrorKind::ClusterDown
        | ErrorKind::MasterDown
        | ErrorKind::ReadOnly
        | ErrorKind::Moved
        | ErrorKind::Ask
        | ErrorKind::ClusterConnectionNotFound => StoreErrorKind::Connection,
        ErrorKind::InvalidClientConfig => StoreErrorKind::Config,
        _ => StoreErrorKind::Script,
    }
}

/// Fail with `READONLY` when the server just connected to answers `ROLE` as a replica: a
/// demoted primary still behind the name or the proxy the URL gives. The background
/// reconnection retries (backing off) until the name leads to the new primary. A `ROLE` that
/// fails or is not understood (a proxy, an ACL without it) lets the connection through.
pub(super) async fn refuse_replica(conn: &Conn, what: &str) -> RedisResult<()> {
    match conn.query(&redis::cmd("ROLE")).await {
        Ok(role) if answers_as_replica(&role) => Err(RedisError::from((
            ErrorKind::ReadOnly,
            "not a primary",
            format!("{what} leads to a replica (ROLE answers slave); waiting for it to lead to the primary"),
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_errors_are_classified_by_what_failed() {
        let io = |kind| RedisError::from(std::io::Error::new(kind, "socket"));
        assert_eq!(
            classify(&io(std::io::ErrorKind::TimedOut)),
            StoreErrorKind::Timeout
        );
        assert_eq!(
            classify(&io(std::io::ErrorKind::ConnectionRefused)),
            StoreErrorKind::Connection
        );
        assert_eq!(
            classify(&io(std::io::ErrorKind::BrokenPipe)),
            StoreErrorKind::Connection
        );
        let answer = |kind, text| RedisError::from((kind, text));
        assert_eq!(
            classify(&answer(ErrorKind::ClusterDown, "CLUSTERDOWN")),
            StoreErrorKind::Connection
        );
        assert_eq!(
            classify(&answer(ErrorKind::BusyLoadingError, "LOADING")),
            StoreErrorKind::Connection
        );
        assert_eq!(
            classify(&answer(ErrorKind::InvalidClientConfig, "bad URL")),
            StoreErrorKind::Config
        );
        assert_eq!(
            classify(&answer(ErrorKind::ResponseError, "ERR in the script")),
            StoreErrorKind::Script
        );
        assert_eq!(
            classify(&answer(ErrorKind::TypeError, "unexpected answer")),
            StoreErrorKind::Script
        );
    }

    #[test]
    fn a_demoted_primary_is_told_by_readonly_and_by_role() {
        let e = RedisError::from((ErrorKind::ReadOnly, "READONLY"));
        assert!(is_readonly(&e));
        assert_eq!(classify(&e), StoreErrorKind::Connection);
        assert!(!is_readonly(&RedisError::from((
            ErrorKind::ResponseError,
            "ERR"
        ))));
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let replica = Value::Array(vec![bulk("slave"), bulk("10.0.0.1"), Value::Int(6379)]);
        assert!(answers_as_replica(&replica));
        assert!(answers_as_replica(&Value::Array(vec![bulk("replica")])));
        assert!(!answers_as_replica(&Value::Array(vec![
            bulk("master"),
            Value::Int(0)
        ])));
        // Whatever a proxy answers instead is taken as a primary.
        assert!(!answers_as_replica(&Value::Nil));
        assert!(!answers_as_replica(&Value::Array(vec![])));
        assert!(!answers_as_replica(&bulk("slave")));
    }
}

//! Where the listening sockets come from, so that a restart or an upgrade refuses no
//! connection:
//!
//! - **Handed over by the service manager** (systemd socket activation, `LISTEN_FDS`,
//!   `LISTEN_PID`, `LISTEN_FDNAMES`): the socket outlives every process that serves it.
//!   Connections that arrive while no process accepts wait in its queue, and a new process
//!   started beside a draining one accepts from the same queue.
//! - **Bound here**, with `SO_REUSEPORT` when `server.reuse_port` is set, so a new process can
//!   bind the same addresses while the old one drains (the kernel spreads new connections over
//!   both; the old one stops accepting when its drain ends).
//! - **Bound here**, as before, otherwise: an address already taken is a configuration error.
//!
//! The handed-over sockets are read once, by [`adopt_from_env`], before any thread starts (it
//! removes the variables, so that no child process inherits them).

use crate::config::Config;
use parking_lot::Mutex;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use std::io;
use std::net::{SocketAddr, TcpListener};

/// Which listener a socket is for. Named sockets (`FileDescriptorName=` in the `.socket`
/// unit) are matched by these names; unnamed ones are taken in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Traffic,
    Admin,
    Decision,
}

impl Role {
    const ALL: [Role; 3] = [Role::Traffic, Role::Admin, Role::Decision];

    fn name(self) -> &'static str {
        match self {
            Role::Traffic => "traffic",
            Role::Admin => "admin",
            Role::Decision => "decision",
        }
    }

    /// The setting whose address this socket replaces.
    fn setting(self) -> &'static str {
        match self {
            Role::Traffic => "server.listen",
            Role::Admin => "ops.admin_listen",
            Role::Decision => "decision.listen",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Sockets handed over at start, by role, until a listener takes them.
static HANDED: Mutex<[Option<TcpListener>; 3]> = Mutex::new([None, None, None]);

/// Take the sockets the service manager handed this process, if any, and say what was taken.
/// Call once, before any thread starts. An error names what is wrong with them: the process
/// should not start on sockets it cannot use.
pub(crate) fn adopt_from_env() -> Result<Vec<String>, String> {
    let names = std::env::var("LISTEN_FDNAMES").ok();
    if std::env::var_os("LISTEN_FDS").is_none() {
        return Ok(Vec::new());
    }
    // listenfd checks LISTEN_PID against this process and removes LISTEN_FDS and LISTEN_PID.
    let mut fds = listenfd::ListenFd::from_env();
    if names.is_some() {
        // SAFETY of the environment: called before any other thread exists (see above).
        std::env::remove_var("LISTEN_FDNAMES");
    }
    let names: Vec<String> = names
        .map(|n| n.split(':').map(str::to_owned).collect())
        .unwrap_or_default();
    let named = names
        .iter()
        .any(|n| Role::ALL.iter().any(|r| r.name() == n));
    let mut taken: [Option<TcpListener>; 3] = [None, None, None];
    let mut said = Vec::new();
    for i in 0..fds.len() {
        let role = if named {
            let name = names.get(i).map(String::as_str).unwrap_or("");
            match Role::ALL.iter().find(|r| r.name() == name) {
                Some(r) => *r,
                None => {
                    return Err(format!(
                        "LISTEN_FDNAMES: socket {} is named {name:?}; name each socket of the .socket unit traffic, admin or decision (FileDescriptorName=)",
                        i + 1
                    ))
                }
            }
        } else {
            match Role::ALL.get(i) {
                Some(r) => *r,
                None => {
                    return Err(format!(
                        "LISTEN_FDS: {} sockets were handed over; at most three are used (traffic, admin, decision, in that order, or named with FileDescriptorName=)",
                        fds.len()
                    ))
                }
            }
        };
        let listener = fds
            .take_tcp_listener(i)
            .map_err(|e| format!("LISTEN_FDS: the {} socket: {e}", role.name()))?
            .ok_or_else(|| format!("LISTEN_FDS: the {} socket was already taken", role.name()))?;
        if !SockRef::from(&listener).is_listener().unwrap_or(false) {
            return Err(format!(
                "LISTEN_FDS: the {} socket is not listening; hand over a listening TCP socket (ListenStream= in the .socket unit)",
                role.name()
            ));
        }
        if taken[role.index()].is_some() {
            return Err(format!(
                "LISTEN_FDNAMES: two sockets are named {}; name each one once",
                role.name()
            ));
        }
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("LISTEN_FDS: the {} socket: {e}", role.name()))?;
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "an unknown address".to_owned());
        said.push(format!(
            "{} listener: the socket on {addr} handed over by the service manager ({} is not bound)",
            role.name(),
            role.setting()
        ));
        taken[role.index()] = Some(listener);
    }
    *HANDED.lock() = taken;
    Ok(said)
}

/// The listening socket for `role`: the one handed over at start, or `addr` bound now (with
/// `SO_REUSEPORT` when `server.reuse_port` is set).
pub(crate) fn listener(cfg: &Config, role: Role, addr: SocketAddr) -> io::Result<TcpListener> {
    if let Some(handed) = HANDED.lock()[role.index()].take() {
        return Ok(handed);
    }
    bind(addr, cfg.server.reuse_port)
}

/// Why a `reuse_port` hand-over would reset connections on this machine, if it would: the
/// connections queued on a listener when it closes are reset unless the kernel moves them to
/// another listener of the same port (`net.ipv4.tcp_migrate_req`, Linux 5.14 and later).
pub(crate) fn reuse_port_warning() -> Option<String> {
    const SYSCTL: &str = "/proc/sys/net/ipv4/tcp_migrate_req";
    let value = std::fs::read_to_string(SYSCTL).ok();
    match value.as_deref().map(str::trim) {
        Some("1") => None,
        Some(_) => Some(
            "server.reuse_port: net.ipv4.tcp_migrate_req is 0, so the connections waiting on this process's listeners when they close are reset instead of handed to the new process; set it to 1 (sysctl -w net.ipv4.tcp_migrate_req=1, and in /etc/sysctl.d) for upgrades that lose no connection".to_owned(),
        ),
        None => Some(
            "server.reuse_port: this kernel has no net.ipv4.tcp_migrate_req (Linux 5.14 or later), so the connections waiting on this process's listeners when they close are reset instead of handed to the new process; hand the sockets over with systemd socket activation instead (deploy/systemd/fleet-limiter.socket)".to_owned(),
        ),
    }
}

/// Whether a socket for `role` was handed over and not yet taken.
pub(crate) fn handed(role: Role) -> bool {
    HANDED.lock()[role.index()].is_some()
}

/// `addr` bound as actix-web binds it (`SO_REUSEADDR`, a backlog of 2048), plus `SO_REUSEPORT`
/// when asked.
pub(crate) fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(2048)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_port_lets_a_second_socket_listen_beside_the_first() {
        let first = bind("127.0.0.1:0".parse().unwrap(), true).unwrap();
        let addr = first.local_addr().unwrap();
        let second = bind(addr, true).expect("SO_REUSEPORT on both");
        assert_eq!(second.local_addr().unwrap(), addr);
        drop(second);
        let plain = bind(addr, false);
        assert_eq!(
            plain.map(|_| ()).unwrap_err().kind(),
            io::ErrorKind::AddrInUse,
            "without SO_REUSEPORT the address stays taken"
        );
    }

    #[test]
    fn nothing_is_handed_over_without_listen_fds() {
        assert!(!handed(Role::Traffic));
        assert!(!handed(Role::Admin));
    }
}

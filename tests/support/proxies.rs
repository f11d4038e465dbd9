//! The real nginx (`auth_request`) and the real Caddy (`forward_auth`) in front of the decision
//! endpoint, each running its file in `docs/forward-auth/` as written: only the three addresses
//! the file tells operators to change are replaced (its own listener, the decision listener and
//! the upstream), and Caddy gets the global options a test run needs (no admin endpoint, no
//! automatic HTTPS, storage and binding kept in a temporary directory and on loopback). Shared
//! by `tests/forward_auth.rs` and the path corpus in `tests/paths.rs`
//! (`#[path = "support/proxies.rs"] mod proxies;`, beside `mod common;`).
//!
//! nginx (Debian's nginx-light) and caddy come from Debian (`.ci/run` installs them);
//! [`missing`] says why one cannot run here, for the caller to skip or, under `CI`, fail.
#![allow(dead_code)]

use crate::common::{free_port, manifest_dir, PATIENCE};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    Nginx,
    Caddy,
}

impl ProxyKind {
    pub const ALL: [ProxyKind; 2] = [ProxyKind::Nginx, ProxyKind::Caddy];

    pub fn name(self) -> &'static str {
        match self {
            ProxyKind::Nginx => "nginx",
            ProxyKind::Caddy => "caddy",
        }
    }
}

/// Where the configurations operators copy live; the tests run them as written.
pub fn doc(name: &str) -> PathBuf {
    manifest_dir().join("docs/forward-auth").join(name)
}

/// The proxy's program: where Debian puts it, or on `PATH`.
fn program(kind: ProxyKind) -> Option<PathBuf> {
    let (usual, name) = match kind {
        ProxyKind::Nginx => ("/usr/sbin/nginx", "nginx"),
        ProxyKind::Caddy => ("/usr/bin/caddy", "caddy"),
    };
    let usual = PathBuf::from(usual);
    if usual.is_file() {
        return Some(usual);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Why `kind` cannot run here, if it cannot.
pub fn missing(kind: ProxyKind) -> Option<String> {
    program(kind).is_none().then(|| match kind {
        ProxyKind::Nginx => "nginx is not installed (apt-get install nginx-light)".to_owned(),
        ProxyKind::Caddy => "caddy is not installed (apt-get install caddy)".to_owned(),
    })
}

/// A proxy process on a loopback port, stopped when dropped.
pub struct Proxy {
    pub kind: ProxyKind,
    pub addr: SocketAddr,
    child: Child,
    log: PathBuf,
    /// Holds the configuration, the log and the proxy's temporary files.
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// `kind` with its documented configuration, asking `decision` (the decision listener) and
    /// forwarding to `upstream` (`host:port`). Panics when the program is missing or does not
    /// start: check [`missing`] first.
    pub fn start(kind: ProxyKind, decision: SocketAddr, upstream: &str) -> Proxy {
        let bin = program(kind).unwrap_or_else(|| panic!("{} is not installed", kind.name()));
        let mut last = String::new();
        // The port is chosen before the proxy binds it: try again when another process took it.
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("fleet-limiter-proxy-")
                .tempdir()
                .expect("temp dir");
            let port = free_port();
            let (child, log) = match kind {
                ProxyKind::Nginx => nginx(&bin, dir.path(), port, decision, upstream),
                ProxyKind::Caddy => caddy(&bin, dir.path(), port, decision, upstream),
            };
            let mut proxy = Proxy {
                kind,
                addr: ([127, 0, 0, 1], port).into(),
                child,
                log,
                _dir: dir,
            };
            match proxy.wait_listening() {
                Ok(()) => return proxy,
                Err(e) => last = e,
            }
        }
        panic!("{} did not start: {last}", kind.name());
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// What the proxy logged (its error log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited with {status}: {}", self.log()));
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("not listening after {PATIENCE:?}: {}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx with `docs/forward-auth/nginx.conf` included in an `http { }` of its own.
fn nginx(
    bin: &Path,
    dir: &Path,
    port: u16,
    decision: SocketAddr,
    upstream: &str,
) -> (Child, PathBuf) {
    let site = std::fs::read_to_string(doc("nginx.conf"))
        .expect("docs/forward-auth/nginx.conf")
        .replace("127.0.0.1:7392", &decision.to_string())
        .replace("listen 80;", &format!("listen 127.0.0.1:{port};"))
        .replace("http://127.0.0.1:3000", &format!("http://{upstream}"));
    let d = dir.display();
    std::fs::write(dir.join("site.conf"), site).expect("write site");
    let main = format!(
        "worker_processes 1;\ndaemon off;\nerror_log {d}/error.log warn;\npid {d}/nginx.pid;\nevents {{}}\nhttp {{\n  access_log off;\n  client_body_temp_path {d}/t1;\n  proxy_temp_path {d}/t2;\n  fastcgi_temp_path {d}/t3;\n  uwsgi_temp_path {d}/t4;\n  scgi_temp_path {d}/t5;\n  include {d}/site.conf;\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), main).expect("write nginx.conf");
    let log = dir.join("error.log");
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-e")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    (child, log)
}

/// Caddy with `docs/forward-auth/Caddyfile`. The site keeps the file's any-host address (`:80`
/// becomes `http://:<port>`), so requests for any host, absolute-form targets included, reach it
/// as they would in production.
fn caddy(
    bin: &Path,
    dir: &Path,
    port: u16,
    decision: SocketAddr,
    upstream: &str,
) -> (Child, PathBuf) {
    let d = dir.display();
    let site = std::fs::read_to_string(doc("Caddyfile"))
        .expect("docs/forward-auth/Caddyfile")
        .replace(":80 {", &format!("http://:{port} {{"))
        .replace("127.0.0.1:7392", &decision.to_string())
        .replace("127.0.0.1:3000", upstream);
    let file = format!(
        "{{\n\tadmin off\n\tauto_https off\n\tdefault_bind 127.0.0.1\n\tstorage file_system {d}/data\n}}\n{site}"
    );
    std::fs::write(dir.join("Caddyfile"), file).expect("write Caddyfile");
    let log = dir.join("caddy.log");
    let out = std::fs::File::create(&log).expect("log file");
    let child = Command::new(bin)
        .arg("run")
        .arg("--config")
        .arg(dir.join("Caddyfile"))
        .arg("--adapter")
        .arg("caddyfile")
        .env("HOME", dir)
        .env("XDG_DATA_HOME", dir)
        .env("XDG_CONFIG_HOME", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .expect("start caddy");
    (child, log)
}

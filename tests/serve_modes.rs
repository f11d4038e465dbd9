//! What `serve` runs: the gateway (`--upstream`), the forward-auth decision endpoint
//! (`--decision-listen`) and Envoy's rate-limit service (`--rls-listen`), alone or together,
//! against the real binary. Every combination either serves what it asked for or exits with a
//! configuration error naming the setting to fix: start-up never panics.

mod common;

use common::{raw_request, Exited, Gateway, Launch};
use proptest::prelude::*;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The decision endpoint started as docs/forward-auth.md's "Start it" does, with no upstream
/// and no traffic listener, answers `/forward` as its curl example shows.
#[test]
fn decision_only_as_documented_answers() {
    let addr: SocketAddr = ([127, 0, 0, 1], common::free_port()).into();
    let gw = Launch::serve_waiting_on(addr)
        .unset("FLEET_LIMITER_ALLOW_UNSAFE_CALIBRATION")
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .args(["--decision-listen", &addr.to_string()])
        .spawn();
    let res = forward(addr);
    assert_eq!(res.status, 200, "{}", gw.stderr());
    assert!(
        res.header("ratelimit-policy").is_some(),
        "limit headers on the answer: {:?}",
        res.headers
    );
    assert!(!gw.stderr().contains("panicked"), "{}", gw.stderr());
}

/// `POST /api/agent/rotate-key` from 203.0.113.7, asked at `/forward`.
fn forward(addr: SocketAddr) -> common::RawResponse {
    let req = format!(
        "GET /forward HTTP/1.1\r\nHost: {addr}\r\nX-Forwarded-Method: POST\r\nX-Forwarded-Uri: /api/agent/rotate-key\r\nX-Forwarded-For: 203.0.113.7\r\nX-Agent-ID: agent-1\r\nConnection: close\r\n\r\n"
    );
    raw_request(addr, req.as_bytes())
}

/// One way to start `serve`: which listeners it is given and which of the settings that guard
/// them are set.
#[derive(Clone, Copy, Debug)]
struct Combination {
    upstream: bool,
    decision: bool,
    rls: bool,
    decision_allow_from: bool,
    rls_allow_from: bool,
    trust_proxy: bool,
}

impl Combination {
    /// The settings a start must name in its refusal; empty when it must serve.
    fn refusals(self) -> Vec<&'static str> {
        let mut why = Vec::new();
        if !self.upstream && !self.decision && !self.rls {
            why.push("nothing to serve");
        }
        if self.decision && !self.decision_allow_from {
            why.push("decision.allow_from");
        }
        if self.decision && self.decision_allow_from && !self.trust_proxy {
            why.push("client_ip.trust_proxy");
        }
        if self.rls && !self.rls_allow_from {
            why.push("rls.allow_from");
        }
        why
    }
}

fn free_addr() -> SocketAddr {
    ([127, 0, 0, 1], common::free_port()).into()
}

fn accepts(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(5)).is_ok()
}

/// Start `c`, and hold what happened to what it should do.
fn start(c: Combination) {
    let rls_yaml = common::manifest_dir().join("docs/envoy-rls/ratelimit.yaml");
    let (listen, decision, rls) = (free_addr(), free_addr(), free_addr());
    // Wait on the first listener asked for (with none, on an address nothing will bind).
    let wait = [(c.upstream, listen), (c.decision, decision), (c.rls, rls)]
        .into_iter()
        .find_map(|(on, a)| on.then_some(a))
        .unwrap_or_else(free_addr);
    let mut launch = Launch::serve_waiting_on(wait).admin();
    if c.upstream {
        let dead = common::dead_addr();
        launch = launch
            .args(["--listen", &listen.to_string()])
            .args(["--upstream", &format!("http://{dead}")]);
    }
    if c.decision {
        launch = launch.args(["--decision-listen", &decision.to_string()]);
    }
    if c.rls {
        launch = launch
            .args(["--rls-listen", &rls.to_string()])
            .args(["--rls-config", &rls_yaml.display().to_string()]);
    }
    if c.decision_allow_from {
        launch = launch.env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1");
    }
    if c.rls_allow_from {
        launch = launch.env("FLEET_LIMITER_RLS_ALLOW_FROM", "127.0.0.1");
    }
    if c.trust_proxy {
        launch = launch.env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1");
    }
    let refusals = c.refusals();
    match launch.try_spawn() {
        Ok(mut gw) => {
            assert!(
                refusals.is_empty(),
                "{c:?} served, but should have refused naming one of {refusals:?}; stderr:\n{}",
                gw.stderr()
            );
            if c.upstream {
                assert!(accepts(listen), "{c:?}: traffic listener");
            }
            if c.decision {
                assert_eq!(forward(decision).status, 200, "{c:?}: {}", gw.stderr());
            }
            if c.rls {
                assert!(accepts(rls), "{c:?}: rls listener");
            }
            assert!(
                !accepts(listen) || c.upstream,
                "{c:?}: a traffic listener with no upstream"
            );
            gw.signal("TERM");
            let code = stopped(&mut gw);
            assert_eq!(
                code,
                Some(0),
                "{c:?} stopped with {code:?}: {}",
                gw.stderr()
            );
            assert!(!gw.stderr().contains("panicked"), "{c:?}: {}", gw.stderr());
        }
        Err(Exited { code, stderr, .. }) => {
            assert!(!stderr.contains("panicked"), "{c:?} panicked:\n{stderr}");
            assert_eq!(code, Some(2), "{c:?} exited with {code:?}:\n{stderr}");
            assert!(
                stderr.contains("configuration error"),
                "{c:?}: not a configuration error:\n{stderr}"
            );
            assert!(
                refusals.iter().any(|r| stderr.contains(r)),
                "{c:?} refused, but should have {}:\n{stderr}",
                if refusals.is_empty() {
                    "served".to_owned()
                } else {
                    format!("named one of {refusals:?}")
                }
            );
        }
    }
}

/// The exit code of a gateway told to stop, waiting at most [`PATIENCE`].
fn stopped(gw: &mut Gateway) -> Option<i32> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(gw.wait_exit()).code()
}

proptest! {
    // Each case starts the binary: a few dozen cover the 64 combinations' kinds (no listener,
    // each listener alone and together, each guard missing) in a few seconds.
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_combination_serves_or_refuses_with_a_setting_named(
        upstream: bool, decision: bool, rls: bool,
        decision_allow_from: bool, rls_allow_from: bool, trust_proxy: bool,
    ) {
        start(Combination { upstream, decision, rls, decision_allow_from, rls_allow_from, trust_proxy });
    }
}

/// The combinations the property might not draw, started every time.
#[test]
fn each_listener_alone_and_none() {
    let all = Combination {
        upstream: false,
        decision: false,
        rls: false,
        decision_allow_from: true,
        rls_allow_from: true,
        trust_proxy: true,
    };
    for c in [
        all,
        Combination { rls: true, ..all },
        Combination {
            decision: true,
            ..all
        },
        Combination {
            upstream: true,
            ..all
        },
        Combination {
            rls: true,
            decision: true,
            ..all
        },
    ] {
        start(c);
    }
}

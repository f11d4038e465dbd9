//! `auth-ceilings`: the two attacks a per-address budget cannot stop, for one hour:
//!
//! - `recipient-spray`: one request a second to `POST /auth/forgot-password` for one inbox
//!   (`{"email": "victim@example.com"}`, spelled in turn as a client pleases), each from an
//!   address of its own: no address ever reaches its own budget; only a ceiling keyed on the
//!   recipient (`body:email`) holds the inbox to its budget;
//! - `patient-guesser`: one address guessing one account's password at `POST /auth/login`
//!   once a minute, every answer 401: far under any address budget; an attempt ceiling keyed on
//!   the account (`count = "failed"`) holds it, and a `lockout` refuses it for the whole lock
//!   instead of handing back a guess every refill;
//! - `owner`: the guessed account's owner signing in from an address of its own every ten
//!   minutes, every answer 200: the lock is per account and address, so the stranger's guesses
//!   never lock the owner out;
//! - `spread-guesser`: another account guessed every 10 seconds, each guess from an address of
//!   its own: no address is ever locked; the per-account ceiling (`body:email`, no lockout)
//!   holds the account to its budget of wrong answers.
//!
//! Each admitted request is answered at once, as the gateway would pass the upstream's answer
//! back. With `docs/examples/auth-ceilings.toml` the inbox gets the recipient budget (10 at
//! once, then one every 6 minutes) and the account's guesser is refused for ten minutes at a
//! time once its attempts run out; with the built-in calibration (no limiter on these routes)
//! both get everything they send.

use super::abuse::Attacker;
use super::{ip, Answer, Queue, Req, Series, Sim, NS};
use crate::config::Config;
use crate::decision::BodyValue;
use serde::Serialize;
use std::sync::Arc;

pub(crate) const DURATION_SECONDS: u64 = 60 * 60;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Client {
    pub name: &'static str,
    pub route: String,
    /// Seconds between two of its requests.
    pub every_seconds: u64,
    /// Source addresses it sends from.
    pub addresses: u64,
    /// The status the upstream answers every admitted request with.
    pub status: u16,
    pub requests: u64,
    pub admitted: u64,
    pub refused: u64,
    /// The longest run of refusals in a row, in seconds from the first to the last.
    pub longest_refused_seconds: u64,
    /// Admitted per minute over the run, as the plot's legend gives it.
    pub admitted_per_minute: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuthCeilingsReport {
    pub scenario: &'static str,
    pub duration_seconds: u64,
    pub clients: Vec<Client>,
    pub requests: u64,
    pub refused: u64,
    #[serde(skip)]
    pub plot_clients: Vec<Attacker>,
    #[serde(skip)]
    pub series: Series,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Ev(usize);

/// Name, method and path, seconds between requests, answer (each body names `email`).
type Scripted = (&'static str, (&'static str, &'static str), u64, u16);

const CLIENTS: [Scripted; 4] = [
    ("recipient-spray", ("POST", "/auth/forgot-password"), 1, 200),
    ("patient-guesser", ("POST", "/auth/login"), 60, 401),
    ("owner", ("POST", "/auth/login"), 600, 200),
    ("spread-guesser", ("POST", "/auth/login"), 10, 401),
];

/// Whether the client sends each request from an address of its own.
fn spreads(name: &str) -> bool {
    matches!(name, "recipient-spray" | "spread-guesser")
}

/// How the sprayer spells the one inbox, in turn (all normalise to one key).
const SPELLINGS: [&str; 4] = [
    "victim@example.com",
    " Victim@Example.COM ",
    "victim+reset@example.com",
    "VICTIM@example.com.",
];

pub(crate) async fn run(cfg: &Config, seed: u64) -> AuthCeilingsReport {
    let mut rng = super::Rng::new(seed);
    let mut sim = Sim::new(cfg);
    let mut q = Queue::default();
    let mut counts = [(0u64, 0u64); CLIENTS.len()];
    let mut runs = [(None::<u64>, 0u64); CLIENTS.len()];
    let mut per_client: Vec<Series> = vec![
        Series {
            bin_seconds: super::BIN_SECONDS,
            ..Series::default()
        };
        CLIENTS.len()
    ];
    for (k, c) in CLIENTS.iter().enumerate() {
        q.push(rng.within(c.2 as f64), Ev(k));
    }
    let field: Arc<str> = Arc::from("email");
    while let Some((t, Ev(k))) = q.pop_until(DURATION_SECONDS * NS) {
        let (name, route, every, status) = CLIENTS[k];
        let n = counts[k].0;
        let (peer, value) = match name {
            // A fresh address for every request: 198.18.0.0/15 has 131 072 of them.
            "recipient-spray" => (
                std::net::IpAddr::V4(std::net::Ipv4Addr::from(
                    u32::from(std::net::Ipv4Addr::new(198, 18, 0, 0)) + (n % 131_072) as u32,
                )),
                SPELLINGS[(n % SPELLINGS.len() as u64) as usize],
            ),
            // Fresh addresses from 198.20.0.0/16, apart from the sprayer's.
            "spread-guesser" => (
                std::net::IpAddr::V4(std::net::Ipv4Addr::from(
                    u32::from(std::net::Ipv4Addr::new(198, 20, 0, 0)) + (n % 65_536) as u32,
                )),
                "cfo@example.com",
            ),
            "owner" => (ip("192.0.2.10"), "ceo@example.com"),
            _ => (ip("203.0.113.66"), "ceo@example.com"),
        };
        let body = crate::keys::body::normalize(value)
            .map(|value| BodyValue {
                field: field.clone(),
                value,
            })
            .into_iter()
            .collect::<Vec<_>>();
        let req = Req {
            peer,
            route,
            agent_id: None,
            bearer: None,
        };
        counts[k].0 += 1;
        let answer = sim.send_with_body(t, &req, status, &body).await;
        per_client[k].record(t, answer == Answer::Admitted);
        let secs = t / NS;
        match answer {
            Answer::Refused { .. } => {
                counts[k].1 += 1;
                let start = *runs[k].0.get_or_insert(secs);
                runs[k].1 = runs[k].1.max(secs - start);
            }
            Answer::Admitted => runs[k].0 = None,
        }
        q.push(t + every * NS, Ev(k));
    }
    sim.series.pad_to(DURATION_SECONDS);
    let minutes = DURATION_SECONDS as f64 / 60.0;
    let clients: Vec<Client> = CLIENTS
        .iter()
        .zip(counts)
        .zip(runs)
        .map(
            |(((name, route, every, status), (requests, refused)), (_, longest))| Client {
                name,
                route: format!("{} {}", route.0, route.1),
                every_seconds: *every,
                addresses: if spreads(name) {
                    requests.min(65_536)
                } else {
                    1
                },
                status: *status,
                requests,
                admitted: requests - refused,
                refused,
                longest_refused_seconds: longest,
                admitted_per_minute: ((requests - refused) as f64 / minutes * 10.0).round() / 10.0,
            },
        )
        .collect();
    let plot_clients = clients
        .iter()
        .zip(per_client)
        .map(|(c, mut series)| {
            series.pad_to(DURATION_SECONDS);
            Attacker {
                name: c.name,
                route: c.route.clone(),
                requests: c.requests,
                refused: c.refused,
                admitted_per_minute: c.admitted_per_minute,
                series,
            }
        })
        .collect();
    AuthCeilingsReport {
        scenario: "auth-ceilings",
        duration_seconds: DURATION_SECONDS,
        clients,
        plot_clients,
        requests: sim.requests,
        refused: sim.refused,
        series: sim.series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Loader;

    fn by_name<'a>(r: &'a AuthCeilingsReport, name: &str) -> &'a Client {
        r.clients.iter().find(|c| c.name == name).expect("client")
    }

    #[test]
    fn the_example_holds_the_inbox_and_the_account_whatever_the_addresses() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let example = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/examples/auth-ceilings.toml"
        );
        let cfg = Loader::new()
            .file(example)
            .load()
            .expect("the example loads");
        let r = rt.block_on(run(&cfg, 1));
        let spray = by_name(&r, "recipient-spray");
        // 10 at once, then one every 6 minutes: at most 20 in the hour, from 3 600 addresses.
        assert!(spray.requests >= 3590, "{spray:?}");
        assert!(
            (19..=20).contains(&spray.admitted),
            "the inbox gets its budget: {spray:?}"
        );
        let guesser = by_name(&r, "patient-guesser").clone();
        // A guess a minute against 5 per 10 minutes: the bucket (one back every 2 minutes)
        // empties at the eighth guess, then a ten-minute lock; four rounds in the hour.
        assert_eq!(
            (guesser.requests, guesser.admitted),
            (60, 30),
            "{guesser:?}"
        );
        assert!(
            guesser.longest_refused_seconds >= 9 * 60,
            "refused for the whole lock: {guesser:?}"
        );
        // The same ceiling without its lockout hands back a guess every refill.
        let mut trickle = cfg.clone();
        for l in &mut trickle.limiters {
            if &*l.name == "login-account" {
                l.quota = l.quota.with_lockout(None);
            }
        }
        let t = rt.block_on(run(&trickle, 1));
        let trickled = by_name(&t, "patient-guesser");
        assert!(trickled.admitted > guesser.admitted, "{trickled:?}");
        assert!(trickled.longest_refused_seconds < 2 * 60, "{trickled:?}");

        // The owner, from an address of its own, is never refused while the stranger is locked.
        let owner = by_name(&r, "owner");
        assert_eq!((owner.requests, owner.refused), (6, 0), "{owner:?}");
        // A guesser with a fresh address per guess is never locked, and meets the per-account
        // ceiling: 50 at once, then one every 72 s, at most 100 of its 360 in the hour.
        let spread = by_name(&r, "spread-guesser");
        assert!(spread.requests >= 359, "{spread:?}");
        assert!(
            (50..=100).contains(&spread.admitted),
            "the account gets its ceiling: {spread:?}"
        );

        // The built-in calibration has no ceiling on these routes: both get all they send.
        let r = rt.block_on(run(&Config::default(), 1));
        assert_eq!(by_name(&r, "recipient-spray").refused, 0);
        assert_eq!(by_name(&r, "patient-guesser").refused, 0);
        assert_eq!(by_name(&r, "spread-guesser").refused, 0);
    }
}

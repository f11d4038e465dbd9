//! `failed-only`: what counting only failed answers buys, for two clients of the API, each from
//! its own address, for five minutes:
//!
//! - `valid-key-script`: a script with a valid API key polling the API 3 times a second, every
//!   answer 200;
//! - `key-guessing`: random `Authorization: Bearer pa_<random>` keys 20 times a second, every
//!   answer 401, ignoring `Retry-After`.
//!
//! Each admitted request's answer goes back to the limiter, as the gateway does, so a limiter
//! with `count = "failed"` gives back the script's requests and keeps the guesses. With the
//! built-in calibration (every limiter counts all) the script is refused like anyone over the
//! `api-key` budget; with `docs/examples/failed-only.toml` it is refused 0 times, and the guesser
//! is admitted at most the budget: `limit` at once, then `limit` per window.

use super::abuse::Attacker;
use super::{ip, Answer, Queue, Req, Series, Sim, NS};
use crate::calibration::traffic;
use crate::config::Config;
use serde::Serialize;

pub(crate) const DURATION_SECONDS: u64 = 5 * 60;

#[derive(Debug, Clone, Serialize)]
pub struct Client {
    pub name: &'static str,
    pub route: String,
    pub rate_per_second: u64,
    /// The status the upstream answers every admitted request with.
    pub status: u16,
    pub requests: u64,
    pub admitted: u64,
    pub refused: u64,
    /// Admitted per minute over the run, as the plot's legend gives it.
    pub admitted_per_minute: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailedOnlyReport {
    pub scenario: &'static str,
    pub duration_seconds: u64,
    /// The `api-key` limiter's budget over the run (`limit` at once, then `limit` per window),
    /// and how it counts; `None` when the configuration has no `api-key` limiter.
    pub api_key_budget: Option<u64>,
    pub api_key_count: Option<&'static str>,
    pub clients: Vec<Client>,
    pub requests: u64,
    pub refused: u64,
    /// Each client's admitted requests per bin, for the plot.
    #[serde(skip)]
    pub plot_clients: Vec<Attacker>,
    #[serde(skip)]
    pub series: Series,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Ev(usize);

/// Name, address, requests a second, answer.
const CLIENTS: [(&str, &str, u64, u16); 2] = [
    ("valid-key-script", "198.51.100.20", 3, 200),
    ("key-guessing", "198.51.100.21", 20, 401),
];

pub(crate) async fn run(cfg: &Config, seed: u64) -> FailedOnlyReport {
    let mut rng = super::Rng::new(seed);
    let mut sim = Sim::new(cfg);
    let mut q = Queue::default();
    let mut counts = [(0u64, 0u64); CLIENTS.len()];
    let mut per_client: Vec<Series> = vec![
        Series {
            bin_seconds: super::BIN_SECONDS,
            ..Series::default()
        };
        CLIENTS.len()
    ];
    for (k, c) in CLIENTS.iter().enumerate() {
        q.push(rng.within(1.0 / c.2 as f64), Ev(k));
    }
    let route = traffic::DASHBOARD;
    while let Some((t, Ev(k))) = q.pop_until(DURATION_SECONDS * NS) {
        let (name, addr, rate, status) = CLIENTS[k];
        let bearer = match name {
            "valid-key-script" => "pa_valid_script_key".to_owned(),
            _ => format!("pa_{:016x}{:016x}", rng.next_u64(), rng.next_u64()),
        };
        let req = Req {
            peer: ip(addr),
            route,
            agent_id: None,
            bearer: Some(&bearer),
        };
        counts[k].0 += 1;
        let answer = sim.send_answered(t, &req, status).await;
        per_client[k].record(t, answer == Answer::Admitted);
        if let Answer::Refused { .. } = answer {
            counts[k].1 += 1;
        }
        q.push(t + NS / rate, Ev(k));
    }
    let api_key = cfg.limiters.iter().find(|l| &*l.name == "api-key");
    let budget = api_key.map(|l| {
        let q = l.quota;
        let run = DURATION_SECONDS * NS;
        match q.algorithm {
            crate::limiter::Algorithm::Gcra => {
                u64::from(q.limit()) + run / q.emission_interval_ns()
            }
            crate::limiter::Algorithm::FixedWindow => {
                u64::from(q.limit()) * (1 + run / q.window_ns())
            }
        }
    });
    sim.series.pad_to(DURATION_SECONDS);
    let minutes = DURATION_SECONDS as f64 / 60.0;
    let per_min = |admitted: u64| (admitted as f64 / minutes * 10.0).round() / 10.0;
    let clients: Vec<Client> = CLIENTS
        .iter()
        .zip(counts)
        .map(|((name, _, rate, status), (requests, refused))| Client {
            name,
            route: format!("{} {}", route.0, route.1),
            rate_per_second: *rate,
            status: *status,
            requests,
            admitted: requests - refused,
            refused,
            admitted_per_minute: per_min(requests - refused),
        })
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
    FailedOnlyReport {
        scenario: "failed-only",
        duration_seconds: DURATION_SECONDS,
        api_key_budget: budget,
        api_key_count: api_key.map(|l| l.count.as_str()),
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

    fn by_name<'a>(r: &'a FailedOnlyReport, name: &str) -> &'a Client {
        r.clients.iter().find(|c| c.name == name).expect("client")
    }

    #[test]
    fn counting_failed_answers_spares_the_valid_script_and_holds_the_guesser_to_the_budget() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let example = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/examples/failed-only.toml"
        );
        let cfg = Loader::new()
            .file(example)
            .load()
            .expect("the example loads");
        let r = rt.block_on(run(&cfg, 1));
        let budget = r.api_key_budget.expect("api-key");
        assert_eq!(r.api_key_count, Some("failed"));
        assert_eq!(by_name(&r, "valid-key-script").refused, 0);
        assert!(by_name(&r, "valid-key-script").requests >= 3 * DURATION_SECONDS);
        let guesser = by_name(&r, "key-guessing");
        assert!(
            guesser.admitted <= budget,
            "{} > {budget}",
            guesser.admitted
        );
        assert!(guesser.refused > guesser.admitted);

        // Counting every answer, the same script runs out of budget like the guesser.
        let r = rt.block_on(run(&Config::default(), 1));
        assert!(by_name(&r, "valid-key-script").refused > 0);
        assert!(by_name(&r, "valid-key-script").admitted <= budget);
    }
}

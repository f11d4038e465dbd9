//! Limiters that count only failed (or only succeeded) answers, end to end: the real binary in
//! front of a real upstream, on the memory store and on Redis (standalone and Cluster).

mod common;
mod redis_support;

use common::{Gateway, Launch};
use wiremock::matchers::path;
use wiremock::{Mock, MockServer, ResponseTemplate};

/// `/login/ok` answers 200, `/login/bad` 401.
async fn login_upstream() -> MockServer {
    let upstream = common::upstream().await;
    Mock::given(path("/login/ok"))
        .respond_with(ResponseTemplate::new(200))
        .with_priority(1)
        .mount(&upstream)
        .await;
    Mock::given(path("/login/bad"))
        .respond_with(ResponseTemplate::new(401))
        .with_priority(1)
        .mount(&upstream)
        .await;
    upstream
}

/// A limiter name no earlier run on a shared Redis used.
fn unique() -> String {
    format!("login-{:08x}", rand::random::<u32>())
}

fn login_limiter(name: &str, mode: &str, store: &str) -> String {
    format!(
        "{store}\n[limiters.{name}]\nlimit = 3\nwindow = \"1h\"\nkey = \"ip\"\nroutes = [\"/login/**\"]\ncount = \"failed\"\nmode = \"{mode}\"\n"
    )
}

fn gateway(toml: &str, upstream: &str) -> Gateway {
    Launch::serve()
        .config_toml(toml)
        .upstream(upstream)
        .admin()
        .spawn()
}

fn done(name: &str) -> String {
    format!(r#"fleet_limiter_give_backs_total{{limiter="{name}",result="done"}}"#)
}

async fn status(gw: &Gateway, p: &str) -> u16 {
    common::client()
        .get(gw.url(p))
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

/// Ten successes all pass (each given back once answered), three failures use the budget, the
/// fourth request is refused whatever it would have been answered.
async fn failed_only_counts_failures(store: &str) {
    let upstream = login_upstream().await;
    let name = unique();
    let gw = gateway(&login_limiter(&name, "enforce", store), &upstream.uri());
    for i in 0..10 {
        assert_eq!(status(&gw, "/login/ok").await, 200, "success {i}");
        // Wait for the give-back so the run does not depend on its timing.
        gw.wait_metric(&done(&name), |v| v >= f64::from(i + 1))
            .await;
    }
    for i in 0..3 {
        assert_eq!(status(&gw, "/login/bad").await, 401, "failure {i}");
    }
    assert_eq!(status(&gw, "/login/bad").await, 429, "the fourth failure");
    assert_eq!(status(&gw, "/login/ok").await, 429, "the budget is spent");
    assert_eq!(
        gw.metric(&done(&name)).await,
        Some(10.0),
        "failures are not given back"
    );
    assert_eq!(
        common::received(&upstream).await,
        13,
        "refused requests never reach the upstream"
    );
}

/// The same in shadow mode: nothing is refused, the shadow refusal comes at the same request.
async fn shadow_counts_the_same(store: &str) {
    let upstream = login_upstream().await;
    let name = unique();
    let gw = gateway(&login_limiter(&name, "shadow", store), &upstream.uri());
    let shadow =
        format!(r#"fleet_limiter_decisions_total{{limiter="{name}",outcome="shadow_refused"}}"#);
    for i in 0..10 {
        assert_eq!(status(&gw, "/login/ok").await, 200, "success {i}");
        gw.wait_metric(&done(&name), |v| v >= f64::from(i + 1))
            .await;
    }
    for i in 0..3 {
        assert_eq!(status(&gw, "/login/bad").await, 401, "failure {i}");
    }
    assert_eq!(gw.metric(&shadow).await, Some(0.0));
    assert_eq!(status(&gw, "/login/bad").await, 401, "shadow mode forwards");
    assert_eq!(
        gw.metric(&shadow).await,
        Some(1.0),
        "the fourth is over budget"
    );
}

#[tokio::test]
async fn memory_failed_only_counts_failures() {
    failed_only_counts_failures("").await;
}

#[tokio::test]
async fn memory_shadow_counts_the_same() {
    shadow_counts_the_same("").await;
}

#[tokio::test]
async fn an_upstream_that_never_answers_is_a_failed_answer() {
    let dead = format!("http://{}", common::dead_addr());
    let name = unique();
    let gw = gateway(&login_limiter(&name, "enforce", ""), &dead);
    for i in 0..3 {
        assert_eq!(status(&gw, "/login/ok").await, 502, "unreachable {i}");
    }
    assert_eq!(status(&gw, "/login/ok").await, 429);
    assert_eq!(gw.metric(&done(&name)).await, Some(0.0));
}

#[tokio::test]
async fn succeeded_only_gives_back_failures() {
    let upstream = login_upstream().await;
    let name = unique();
    let toml = login_limiter(&name, "enforce", "").replace("\"failed\"", "\"succeeded\"")
        + "failed_statuses = [\"400-499\", 503]\n";
    let gw = gateway(&toml, &upstream.uri());
    for i in 0..6 {
        assert_eq!(status(&gw, "/login/bad").await, 401, "failure {i}");
        gw.wait_metric(&done(&name), |v| v >= f64::from(i + 1))
            .await;
    }
    for i in 0..3 {
        assert_eq!(status(&gw, "/login/ok").await, 200, "success {i}");
    }
    assert_eq!(status(&gw, "/login/ok").await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_failed_only_counts_failures() {
    let Some(redis) = redis_support::standalone() else {
        return;
    };
    let store = format!("[store]\nurl = \"{}\"\ntimeout = \"2s\"", redis.url());
    failed_only_counts_failures(&store).await;
    shadow_counts_the_same(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_failed_only_counts_failures() {
    let Some(cluster) = redis_support::cluster() else {
        return;
    };
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let store = format!(
        "[store]\nbackend = \"redis\"\ncluster = [{}]\ntimeout = \"2s\"",
        nodes.join(", ")
    );
    failed_only_counts_failures(&store).await;
    shadow_counts_the_same(&store).await;
}

/// A flood of requests that will all succeed: each holds its unit until answered, so at most
/// `limit` are in flight at once and the rest are refused; once answered and given back, the
/// budget is whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_successes_never_has_more_than_the_limit_in_flight() {
    let upstream = common::upstream().await;
    Mock::given(path("/login/slow"))
        .respond_with(ResponseTemplate::new(200).set_delay(std::time::Duration::from_secs(2)))
        .with_priority(1)
        .mount(&upstream)
        .await;
    let name = unique();
    let gw = gateway(&login_limiter(&name, "enforce", ""), &upstream.uri());
    let url = gw.url("/login/slow");
    let flood = (0..12).map(|_| {
        let url = url.clone();
        tokio::spawn(async move {
            common::client()
                .get(url)
                .send()
                .await
                .expect("request")
                .status()
                .as_u16()
        })
    });
    let mut statuses = Vec::new();
    for s in futures_util::future::join_all(flood).await {
        statuses.push(s.expect("task"));
    }
    let ok = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((ok, refused), (3, 9), "{statuses:?}");
    gw.wait_metric(&done(&name), |v| v >= 3.0).await;
    for i in 0..3 {
        assert_eq!(status(&gw, "/login/ok").await, 200, "after the flood, {i}");
        gw.wait_metric(&done(&name), |v| v >= f64::from(4 + i))
            .await;
    }
}

/// The decision endpoint never sees the answer: there a failed-only limiter counts every
/// request, and a gateway that only answers a proxy's questions says so when it starts.
#[tokio::test]
async fn the_decision_endpoint_counts_every_request_and_start_up_says_so() {
    let name = unique();
    let gw = Launch::serve()
        .config_toml(login_limiter(&name, "enforce", ""))
        .decision_only()
        .env("FLEET_LIMITER_TRUST_PROXY", "127.0.0.1")
        .env("FLEET_LIMITER_DECISION_ALLOW_FROM", "127.0.0.1")
        .spawn();
    let d = gw.decision_addr.expect("decision listener");
    let mut seen = Vec::new();
    for _ in 0..4 {
        let res = common::client()
            .get(format!("http://{d}/caddy"))
            .header("x-forwarded-method", "GET")
            .header("x-forwarded-uri", "/login/ok")
            .send()
            .await
            .expect("ask");
        seen.push(res.status().as_u16());
    }
    assert_eq!(seen, [200, 200, 200, 429]);
    let warning = format!("limiters.{name}.count: `failed` has no effect on the decision endpoint");
    assert!(gw.stderr().contains(&warning), "{}", gw.stderr());

    // `check` says the same.
    let toml = format!(
        "[decision]\nlisten = \"127.0.0.1:0\"\nallow_from = [\"127.0.0.1\"]\n[client_ip]\ntrust_proxy = [\"127.0.0.1\"]\n{}",
        login_limiter(&name, "enforce", "")
    );
    let out = Launch::command(["check"])
        .config_toml(toml)
        .run(common::PATIENCE);
    assert!(out.stderr.contains(&warning), "{}", out.stderr);
    // With the gateway in front, nothing to say.
    let out = Launch::command(["check"])
        .config_toml(login_limiter(&name, "enforce", ""))
        .run(common::PATIENCE);
    assert!(!out.stderr.contains("has no effect"), "{}", out.stderr);
}

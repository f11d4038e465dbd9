//! `fleet-limiter override …`, `reset …`, `explain …` and `top`: the admin listener's levers and
//! lists from a shell, against a running instance. Each prints the listener's JSON answer; the exit status is
//! 0 for a 2xx answer, 1 for a refusal (its error on stderr), 2 when the instance cannot be
//! reached or an argument cannot be used.

use std::process::ExitCode;
use std::time::Duration;

/// Which running instance, and the token its levers need.
#[derive(clap::Args, Clone, Debug)]
pub struct AdminTarget {
    /// The instance's admin listener.
    #[arg(
        long = "admin",
        env = "FLEET_LIMITER_ADMIN_URL",
        default_value = "http://127.0.0.1:7391",
        value_name = "URL"
    )]
    pub url: String,
    /// `ops.admin_token` of that instance (needed when it is set).
    #[arg(
        long = "token",
        env = "FLEET_LIMITER_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
}

/// `fleet-limiter override …`.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum OverrideCommand {
    /// The overrides in force: the configuration's and the run-time ones.
    List,
    /// Give one principal another limit on one limiter, at once, on every instance.
    Add {
        /// The limiter it applies to.
        #[arg(long)]
        limiter: String,
        /// Whom: `ip:<addr or CIDR>`, `agent:<id>`, `user:<subject>`, `claim:<name>=<value>`; a value may end in `*`.
        #[arg(long = "match", value_name = "MATCH")]
        matcher: String,
        /// Requests per window.
        #[arg(long)]
        limit: u64,
        /// The window: 30s, 15m, 1h, 1d.
        #[arg(long)]
        window: String,
        /// When it stops applying: a time from now on the instance's clock (30m, 2h, 7d, at most
        /// 366d) or an RFC 3339 instant (2026-12-01T18:00:00Z); none by default.
        #[arg(long)]
        expires: Option<String>,
        /// Who asks, for the instance's log.
        #[arg(long)]
        by: Option<String>,
        /// A stable id to remove it by (1-64 characters of a-z, 0-9 and `-`); one is made up
        /// when left out. An id already in use is replaced.
        #[arg(long)]
        id: Option<String>,
    },
    /// Remove a run-time override by its id.
    Remove {
        /// The id `override list` shows.
        id: String,
    },
}

/// A request, as `explain` and `reset` take it.
#[derive(clap::Args, Clone, Debug)]
pub struct AskedRequest {
    /// The client's address.
    #[arg(long)]
    pub ip: String,
    /// The peer it came through, when a trusted proxy passed it on.
    #[arg(long)]
    pub peer: Option<String>,
    /// A header the request carries, `Name: value` (repeatable).
    #[arg(long = "header", short = 'H', value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// A field of its body that a `body:<field>` limiter reads, `field=value` (repeatable),
    /// e.g. `--body email=victim@example.com`.
    #[arg(long = "body", value_name = "FIELD=VALUE")]
    pub body: Vec<String>,
}

fn body_of(req: &AskedRequest) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut headers = serde_json::Map::new();
    for h in &req.headers {
        let Some((name, value)) = h.split_once(':') else {
            return Err(format!("--header `{h}`: write it as `Name: value`"));
        };
        headers.insert(name.trim().to_owned(), value.trim().into());
    }
    let mut body = serde_json::Map::new();
    body.insert("ip".into(), req.ip.clone().into());
    if let Some(p) = &req.peer {
        body.insert("peer".into(), p.clone().into());
    }
    body.insert("headers".into(), headers.into());
    if !req.body.is_empty() {
        let mut fields = serde_json::Map::new();
        for f in &req.body {
            let Some((name, value)) = f.split_once('=') else {
                return Err(format!("--body `{f}`: write it as `field=value`"));
            };
            fields.insert(name.trim().to_owned(), value.into());
        }
        body.insert("body".into(), fields.into());
    }
    Ok(body)
}

/// Send one request to the admin listener: its status and body, or why it could not be sent.
fn fetch(
    target: &AdminTarget,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Result<(reqwest::StatusCode, String), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start: {e}"))?;
    let url = format!("{}{path}", target.url.trim_end_matches('/'));
    runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        let mut rb = client.request(method, &url);
        if let Some(t) = &target.token {
            rb = rb.bearer_auth(t);
        }
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let res = rb.send().await.map_err(|e| e.to_string())?;
        let status = res.status();
        let text = res.text().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((status, text))
    })
}

/// Print an answer: a 2xx's JSON on stdout (exit 0), a refusal's error on stderr (exit 1), or
/// why the listener could not be reached (exit 2).
fn report(target: &AdminTarget, answer: Result<(reqwest::StatusCode, String), String>) -> ExitCode {
    match answer {
        Ok((status, text)) if status.is_success() => {
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or(text)),
                Err(_) => println!("{text}"),
            }
            ExitCode::SUCCESS
        }
        Ok((status, text)) => {
            let why = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or(text);
            eprintln!(
                "fleet-limiter: {} answered {status}: {why}",
                crate::redact::url(&target.url)
            );
            if status == reqwest::StatusCode::UNAUTHORIZED {
                let hint = if target.token.is_some() {
                    "the token given is not this instance's ops.admin_token"
                } else {
                    "this instance sets ops.admin_token: pass it with --token TOKEN or FLEET_LIMITER_ADMIN_TOKEN"
                };
                eprintln!("fleet-limiter: {hint}");
            }
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!(
                "fleet-limiter: cannot reach the admin listener at {}: {}",
                crate::redact::url(&target.url),
                crate::redact::urls_in(&e)
            );
            ExitCode::from(2)
        }
    }
}

/// Send one lever request and print its answer.
fn call(
    target: &AdminTarget,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> ExitCode {
    report(target, fetch(target, method, path, body))
}

/// `fleet-limiter override …`.
pub fn run_override(target: &AdminTarget, cmd: &OverrideCommand) -> ExitCode {
    match cmd {
        OverrideCommand::List => call(target, reqwest::Method::GET, "/overrides", None),
        OverrideCommand::Add {
            limiter,
            matcher,
            limit,
            window,
            expires,
            by,
            id,
        } => {
            let mut body = serde_json::json!({
                "limiter": limiter, "match": matcher, "limit": limit, "window": window,
            });
            if let Some(e) = expires {
                body["expires"] = e.clone().into();
            }
            if let Some(b) = by {
                body["by"] = b.clone().into();
            }
            if let Some(i) = id {
                body["id"] = i.clone().into();
            }
            call(target, reqwest::Method::POST, "/overrides", Some(body))
        }
        OverrideCommand::Remove { id } => {
            let ok = !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if !ok {
                eprintln!("fleet-limiter: `{id}` is not an override id");
                return ExitCode::from(2);
            }
            call(
                target,
                reqwest::Method::DELETE,
                &format!("/overrides/{id}"),
                None,
            )
        }
    }
}

/// `fleet-limiter reset --limiter L --ip A [-H 'X-Agent-ID: a']`.
pub fn run_reset(
    target: &AdminTarget,
    limiter: &str,
    req: &AskedRequest,
    by: Option<&str>,
) -> ExitCode {
    let mut body = match body_of(req) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("fleet-limiter: {e}");
            return ExitCode::from(2);
        }
    };
    body.insert("limiter".into(), limiter.into());
    if let Some(b) = by {
        body.insert("by".into(), b.into());
    }
    call(target, reqwest::Method::POST, "/reset", Some(body.into()))
}

/// `fleet-limiter explain --method GET --path /p --ip A [-H ...]`.
pub fn run_explain(target: &AdminTarget, method: &str, path: &str, req: &AskedRequest) -> ExitCode {
    let mut body = match body_of(req) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("fleet-limiter: {e}");
            return ExitCode::from(2);
        }
    };
    body.insert("method".into(), method.into());
    body.insert("path".into(), path.into());
    call(target, reqwest::Method::POST, "/explain", Some(body.into()))
}

/// `fleet-limiter top`: what the instance's `GET /top` lists, as a table.
#[derive(clap::Args, Clone, Debug)]
pub struct TopArgs {
    /// The window: 1m, 5m or 15m.
    #[arg(long, default_value = "5m")]
    pub window: String,
    /// Rows per list.
    #[arg(short = 'n', long = "rows", default_value_t = 10)]
    pub rows: usize,
    /// One limiter only.
    #[arg(long)]
    pub limiter: Option<String>,
    /// Print once and exit (the default when the output is not a terminal).
    #[arg(long)]
    pub once: bool,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 2)]
    pub every: u64,
}

/// The table of one `/top` answer.
fn top_table(v: &serde_json::Value) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let num = |x: &serde_json::Value, k: &str| x.get(k).and_then(|n| n.as_u64()).unwrap_or(0);
    let text = |x: &serde_json::Value, k: &str| {
        x.get(k)
            .and_then(|n| n.as_str())
            .map(|s| crate::redact::printable(s, 64))
            .unwrap_or_default()
    };
    let _ = writeln!(
        o,
        "fleet-limiter top: last {} min, {} instance(s), at {}",
        num(v, "window_seconds") / 60,
        num(v, "instances"),
        text(v, "generated_at")
    );
    let _ = writeln!(
        o,
        "{:<20} {:<8} {:>8} {:>6}  {:<44} ADDRESS",
        "LIMITER", "LIST", "COUNT", "±", "PRINCIPAL"
    );
    let mut any = false;
    for l in v
        .get("limiters")
        .and_then(|l| l.as_array())
        .into_iter()
        .flatten()
    {
        for (list, name) in [("refused", "refused"), ("requests", "asked")] {
            for r in l.get(list).and_then(|r| r.as_array()).into_iter().flatten() {
                any = true;
                let err = num(r, "error");
                let _ = writeln!(
                    o,
                    "{:<20} {:<8} {:>8} {:>6}  {:<44} {}",
                    text(l, "limiter"),
                    name,
                    num(r, "count"),
                    if err > 0 {
                        err.to_string()
                    } else {
                        String::new()
                    },
                    crate::top::shown(&text(r, "principal")),
                    crate::top::shown(&text(r, "address"))
                );
            }
        }
    }
    if !any {
        let _ = writeln!(o, "(no request metered in this window)");
    }
    o
}

/// `fleet-limiter top [--window 5m] [-n 10] [--limiter L] [--once]`.
pub fn run_top(target: &AdminTarget, args: &TopArgs) -> ExitCode {
    use std::io::IsTerminal;
    let rows = args.rows.to_string();
    let mut pairs = vec![
        ("format", "json"),
        ("window", args.window.as_str()),
        ("n", rows.as_str()),
    ];
    if let Some(l) = &args.limiter {
        pairs.push(("limiter", l.as_str()));
    }
    let path = match reqwest::Url::parse_with_params("http://admin/top", &pairs) {
        Ok(u) => format!("/top?{}", u.query().unwrap_or_default()),
        Err(e) => {
            eprintln!("fleet-limiter: {e}");
            return ExitCode::from(2);
        }
    };
    let once = args.once || !std::io::stdout().is_terminal();
    loop {
        let answer = fetch(target, reqwest::Method::GET, &path, None);
        match answer {
            Ok((status, text)) if status.is_success() => {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                if !once {
                    print!("\x1b[H\x1b[2J");
                }
                print!("{}", top_table(&v));
            }
            other => return report(target, other),
        }
        if once {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(Duration::from_secs(args.every.max(1)));
    }
}

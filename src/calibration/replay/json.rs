//! JSON-lines access logs (nginx `log_format ... escape=json`, pino, bunyan, a log pipeline's
//! export): one object per line, its top-level fields named by a mapping.
//!
//! `--log-format json` reads the usual names; `json:addr=client,time=@timestamp,...` names others.
//! Mapped keys: `addr`, `time` (a timestamp string, or seconds since the epoch as a number),
//! `request` (`"METHOD /path HTTP/1.1"`) or `method` and `uri`, `forwarded`, `agent_id`, `user`.

use super::line::{Fields, Malformed};
use super::time;
use serde_json::{Map, Value};

/// The mapping keys, each with the field names tried in order.
const KEYS: [(&str, &[&str]); 8] = [
    ("addr", &["remote_addr", "client_ip", "remote_ip", "ip"]),
    (
        "time",
        &[
            "time_iso8601",
            "time_local",
            "time",
            "timestamp",
            "@timestamp",
            "msec",
        ],
    ),
    ("request", &["request"]),
    ("method", &["request_method", "method"]),
    ("uri", &["request_uri", "uri", "url", "path"]),
    (
        "forwarded",
        &["http_x_forwarded_for", "x_forwarded_for", "x-forwarded-for"],
    ),
    (
        "agent_id",
        &["http_x_agent_id", "x_agent_id", "x-agent-id", "agent_id"],
    ),
    ("user", &["remote_user", "user"]),
];

/// Which JSON field holds each thing a replay reads.
#[derive(Debug, Clone)]
pub(crate) struct Mapping {
    /// For each of [`KEYS`], the field names to try.
    names: Vec<Vec<String>>,
}

impl Mapping {
    /// `json` (the usual names) or `json:key=field,key=field` (those keys named, the rest usual).
    pub(crate) fn parse(spec: &str) -> Result<Self, String> {
        let mut names: Vec<Vec<String>> = KEYS
            .iter()
            .map(|(_, n)| n.iter().map(|s| (*s).to_owned()).collect())
            .collect();
        let rest = match spec.strip_prefix("json") {
            Some("") => return Ok(Self { names }),
            Some(r) => r
                .strip_prefix(':')
                .ok_or("write `json` or `json:key=field,...`")?,
            None => return Err("not a json format".into()),
        };
        for pair in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, field) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not key=field"))?;
            let i = KEYS
                .iter()
                .position(|(name, _)| *name == k.trim())
                .ok_or_else(|| {
                    format!(
                        "`{}` is not a key; use addr, time, request, method, uri, forwarded, agent_id or user",
                        k.trim()
                    )
                })?;
            let field = field.trim();
            if field.is_empty() {
                return Err(format!("`{pair}` names no field"));
            }
            names[i] = vec![field.to_owned()];
        }
        Ok(Self { names })
    }

    fn get<'a>(&self, obj: &'a Map<String, Value>, key: usize) -> Option<&'a Value> {
        self.names[key]
            .iter()
            .find_map(|n| obj.get(n))
            .filter(|v| !v.is_null())
    }

    /// Read one line; its decoded object is kept in `scratch`, which the fields borrow.
    pub(crate) fn read<'a>(
        &self,
        line: &[u8],
        scratch: &'a mut Map<String, Value>,
    ) -> Result<Fields<'a>, Malformed> {
        *scratch = serde_json::from_slice(line).map_err(|_| Malformed::Layout)?;
        let obj: &'a Map<String, Value> = scratch;
        let text = |key: usize| -> Result<Option<&'a [u8]>, Malformed> {
            match self.get(obj, key) {
                None => Ok(None),
                Some(Value::String(s)) if s.is_empty() || s == "-" => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.as_bytes())),
                Some(_) => Err(Malformed::Layout),
            }
        };
        let when = match self.get(obj, 1) {
            Some(Value::String(s)) => time::any(s.as_bytes()),
            Some(Value::Number(n)) => time::epoch(n.to_string().as_bytes()),
            _ => None,
        };
        let mut f = Fields {
            addr: text(0)?.ok_or(Malformed::Address)?,
            time: Some(when.ok_or(Malformed::Time)?),
            forwarded: text(5)?,
            agent_id: text(6)?,
            user: text(7)?,
            ..Fields::default()
        };
        match (text(2)?, text(3)?, text(4)?) {
            (_, Some(m), Some(u)) => {
                f.method = m;
                f.target = u;
            }
            (Some(r), _, _) => {
                let mut words = r.split(|&c| c == b' ').filter(|w| !w.is_empty());
                let (Some(m), Some(u)) = (words.next(), words.next()) else {
                    return Err(Malformed::Request);
                };
                f.method = m;
                f.target = u;
            }
            _ => return Err(Malformed::Request),
        }
        f.check()?;
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(
        m: &Mapping,
        line: &str,
    ) -> Result<(String, String, String, Option<String>), Malformed> {
        let mut s = Map::new();
        let f = m.read(line.as_bytes(), &mut s)?;
        let t = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ok((t(f.addr), t(f.method), t(f.target), f.agent_id.map(t)))
    }

    #[test]
    fn the_usual_names_and_a_mapping() {
        let m = Mapping::parse("json").unwrap();
        let got = read(
            &m,
            r#"{"remote_addr":"203.0.113.7","time_iso8601":"2026-11-24T10:00:01+00:00","request":"POST /api/agent/heartbeat HTTP/1.1","status":200,"http_x_agent_id":"agent-1"}"#,
        )
        .unwrap();
        assert_eq!(
            got,
            (
                "203.0.113.7".into(),
                "POST".into(),
                "/api/agent/heartbeat".into(),
                Some("agent-1".into())
            )
        );
        let m = Mapping::parse("json:addr=client,time=ts,method=verb,uri=route,agent_id=agent")
            .unwrap();
        let got = read(
            &m,
            r#"{"client":"198.51.100.4","ts":1795996801.25,"verb":"GET","route":"/api\/reports?x=1","agent":"-"}"#,
        )
        .unwrap();
        assert_eq!(
            got,
            (
                "198.51.100.4".into(),
                "GET".into(),
                "/api/reports?x=1".into(),
                None
            )
        );
    }

    #[test]
    fn bad_mappings_say_why() {
        assert!(Mapping::parse("json:nope=x")
            .unwrap_err()
            .contains("not a key"));
        assert!(Mapping::parse("json:addr")
            .unwrap_err()
            .contains("key=field"));
        assert!(Mapping::parse("json:addr=")
            .unwrap_err()
            .contains("names no field"));
        assert!(Mapping::parse("jsonx").is_err());
    }

    #[test]
    fn hostile_lines_are_malformed_not_panics() {
        let m = Mapping::parse("json").unwrap();
        for bad in [
            "",
            "not json",
            "[1,2]",
            r#"{"remote_addr":"1.2.3.4"}"#,
            r#"{"remote_addr":7,"time":"2026-11-24T10:00:01Z","request":"GET / HTTP/1.1"}"#,
            r#"{"remote_addr":"1.2.3.4","time":"year 9999","request":"GET / HTTP/1.1"}"#,
            r#"{"remote_addr":"1.2.3.4","time":1e300,"request":"GET / HTTP/1.1"}"#,
            r#"{"remote_addr":"1.2.3.4","time":-5,"request":"GET / HTTP/1.1"}"#,
            r#"{"remote_addr":"1.2.3.4","time":"2026-11-24T10:00:01Z","request":"GET"}"#,
            r#"{"remote_addr":"1.2.3.4","time":"2026-11-24T10:00:01Z","request":"GET /a\u0000b HTTP/1.1"}"#,
            r#"{"remote_addr":"1.2.3.4","time":"2026-11-24T10:00:01Z","request":"get / HTTP/1.1"}"#,
        ] {
            assert!(read(&m, bad).is_err(), "{bad}");
        }
    }
}

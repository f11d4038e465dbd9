//! nginx access logs: `combined`, or any `log_format` string, read byte by byte.
//!
//! A format is compiled once into literals and variables; a line is matched by taking each
//! variable's value up to the literal that follows it. Express `morgan` `combined` lines have
//! the same layout as nginx `combined` and are read by the same format.

use super::line::{Fields, Malformed};
use super::time;

/// nginx's predefined `combined` format.
pub(crate) const COMBINED: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent""#;

/// The variables a replay reads; every other variable is matched and ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Var {
    RemoteAddr,
    RemoteUser,
    TimeLocal,
    TimeIso,
    Msec,
    Request,
    Method,
    Uri,
    Forwarded,
    AgentId,
    Authorization,
    Other,
}

impl Var {
    fn of(name: &str) -> Self {
        match name {
            "remote_addr" | "realip_remote_addr" => Var::RemoteAddr,
            "remote_user" => Var::RemoteUser,
            "time_local" => Var::TimeLocal,
            "time_iso8601" => Var::TimeIso,
            "msec" => Var::Msec,
            "request" => Var::Request,
            "request_method" => Var::Method,
            "request_uri" | "uri" => Var::Uri,
            "http_x_forwarded_for" => Var::Forwarded,
            "http_x_agent_id" => Var::AgentId,
            "http_authorization" => Var::Authorization,
            _ => Var::Other,
        }
    }
}

#[cfg(feature = "fuzzing")]
impl Var {
    fn name(self) -> &'static str {
        match self {
            Var::RemoteAddr => "remote_addr",
            Var::RemoteUser => "remote_user",
            Var::TimeLocal => "time_local",
            Var::TimeIso => "time_iso8601",
            Var::Msec => "msec",
            Var::Request => "request",
            Var::Method => "request_method",
            Var::Uri => "request_uri",
            Var::Forwarded => "http_x_forwarded_for",
            Var::AgentId => "http_x_agent_id",
            Var::Authorization => "http_authorization",
            Var::Other => "other",
        }
    }
}

#[derive(Debug, Clone)]
enum Part {
    Lit(Vec<u8>),
    Var(Var),
}

/// A compiled `log_format`.
#[derive(Debug, Clone)]
pub struct Format {
    parts: Vec<Part>,
}

impl Format {
    /// Compile a `log_format` string (`$name` or `${name}` variables, everything else literal).
    pub fn compile(spec: &str) -> Result<Self, String> {
        let b = spec.as_bytes();
        let mut parts = Vec::new();
        let mut lit = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'$' {
                lit.push(b[i]);
                i += 1;
                continue;
            }
            let (name, next) = if b.get(i + 1) == Some(&b'{') {
                let end = b[i + 2..]
                    .iter()
                    .position(|&c| c == b'}')
                    .ok_or_else(|| format!("unclosed `${{` at byte {i}"))?;
                (&spec[i + 2..i + 2 + end], i + 3 + end)
            } else {
                let n = b[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                    .count();
                (&spec[i + 1..i + 1 + n], i + 1 + n)
            };
            if name.is_empty() {
                return Err(format!("a `$` without a variable name at byte {i}"));
            }
            if !lit.is_empty() {
                parts.push(Part::Lit(std::mem::take(&mut lit)));
            } else if matches!(parts.last(), Some(Part::Var(_))) {
                return Err(format!(
                    "`${name}` follows another variable with nothing between them; lines could not be split"
                ));
            }
            parts.push(Part::Var(Var::of(name)));
            i = next;
        }
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        let has = |v: Var| parts.iter().any(|p| matches!(p, Part::Var(x) if *x == v));
        if !has(Var::RemoteAddr) {
            return Err("the format has no `$remote_addr`".into());
        }
        if !(has(Var::TimeLocal) || has(Var::TimeIso) || has(Var::Msec)) {
            return Err("the format has no `$time_local`, `$time_iso8601` or `$msec`".into());
        }
        if !(has(Var::Request) || (has(Var::Method) && has(Var::Uri))) {
            return Err(
                "the format has no `$request` (or `$request_method` and `$request_uri`)".into(),
            );
        }
        Ok(Self { parts })
    }

    /// Whether the format logs `$http_x_agent_id`.
    pub fn logs_agent_ids(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p, Part::Var(Var::AgentId)))
    }

    pub fn combined() -> Self {
        Self::compile(COMBINED).unwrap_or(Self { parts: Vec::new() })
    }

    /// Read one line.
    pub fn parse<'a>(&self, line: &'a [u8]) -> Result<Fields<'a>, Malformed> {
        let mut f = Fields::default();
        self.walk(line, |v, value| f.set(v, value))?;
        f.check()?;
        Ok(f)
    }

    /// Match `line` against the format, handing each variable's value to `each` in order.
    fn walk<'a>(
        &self,
        line: &'a [u8],
        mut each: impl FnMut(Var, &'a [u8]) -> Result<(), Malformed>,
    ) -> Result<(), Malformed> {
        let mut rest = line;
        let mut parts = self.parts.iter().peekable();
        while let Some(part) = parts.next() {
            match part {
                Part::Lit(l) => {
                    rest = rest.strip_prefix(l.as_slice()).ok_or(Malformed::Layout)?;
                }
                Part::Var(v) => {
                    let value = match parts.peek() {
                        Some(Part::Lit(l)) => {
                            let end = find(rest, l).ok_or(Malformed::Layout)?;
                            &rest[..end]
                        }
                        _ => rest,
                    };
                    rest = &rest[value.len()..];
                    each(*v, value)?;
                }
            }
        }
        if !rest.is_empty() {
            return Err(Malformed::Layout);
        }
        Ok(())
    }

    /// The format's pieces in order, a literal as `Ok`, a variable as `Err` with the name of
    /// what a replay reads from it (`other` for the variables it ignores).
    #[cfg(feature = "fuzzing")]
    pub(crate) fn pieces(&self) -> Vec<Result<&[u8], &'static str>> {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Lit(l) => Ok(l.as_slice()),
                Part::Var(v) => Err(v.name()),
            })
            .collect()
    }

    /// Each variable's value in `line`, in the format's order, with the name [`Format::pieces`]
    /// gives it.
    #[cfg(feature = "fuzzing")]
    pub(crate) fn values<'a>(
        &self,
        line: &'a [u8],
    ) -> Result<Vec<(&'static str, &'a [u8])>, Malformed> {
        let mut out = Vec::new();
        self.walk(line, |v, value| {
            out.push((v.name(), value));
            Ok(())
        })?;
        Ok(out)
    }
}

/// The first place `needle` occurs in `hay`, skipping `\"` escapes when it starts with a quote.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let first = *needle.first()?;
    let mut from = 0;
    while let Some(p) = hay[from..].iter().position(|&c| c == first) {
        let at = from + p;
        let escaped = first == b'"' && at > 0 && hay[at - 1] == b'\\';
        if !escaped && hay[at..].starts_with(needle) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

impl<'a> Fields<'a> {
    fn set(&mut self, v: Var, value: &'a [u8]) -> Result<(), Malformed> {
        let present = |b: &'a [u8]| (!b.is_empty() && b != b"-").then_some(b);
        match v {
            Var::RemoteAddr => self.addr = value,
            Var::RemoteUser => self.user = present(value),
            Var::TimeLocal => self.time = Some(time::clf(value).ok_or(Malformed::Time)?),
            Var::TimeIso => self.time = Some(time::iso8601(value).ok_or(Malformed::Time)?),
            Var::Msec => self.time = Some(time::epoch(value).ok_or(Malformed::Time)?),
            Var::Request => {
                let sp = value
                    .iter()
                    .position(|&c| c == b' ')
                    .ok_or(Malformed::Request)?;
                let target = &value[sp + 1..];
                let end = target
                    .iter()
                    .position(|&c| c == b' ')
                    .unwrap_or(target.len());
                self.method = &value[..sp];
                self.target = &target[..end];
            }
            Var::Method => self.method = value,
            Var::Uri => self.target = value,
            Var::Forwarded => self.forwarded = present(value),
            Var::AgentId => self.agent_id = present(value),
            Var::Authorization => self.authorization = present(value).is_some(),
            Var::Other => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_line() {
        let f = Format::combined();
        let line = br#"203.0.113.10 - alice [10/Oct/2000:13:55:36 -0700] "GET /api/tasks?x=1 HTTP/1.1" 200 2326 "-" "curl/8 \"q\"""#;
        let got = f.parse(line).unwrap();
        assert_eq!(got.addr, b"203.0.113.10");
        assert_eq!(got.user, Some(&b"alice"[..]));
        assert_eq!(got.method, b"GET");
        assert_eq!(got.target, b"/api/tasks?x=1");
        assert_eq!(got.time, Some(971_211_336_000_000_000));
    }

    #[test]
    fn custom_format_captures_headers() {
        let f = Format::compile(
            r#"$remote_addr [$time_iso8601] "$request" $status "$http_x_forwarded_for" "$http_x_agent_id" auth=$http_authorization"#,
        )
        .unwrap();
        let line = br#"10.0.0.2 [2000-10-10T20:55:36Z] "POST /api/agent/heartbeat HTTP/1.1" 200 "198.51.100.7, 10.0.0.1" "agent-7" auth=Bearer x"#;
        let got = f.parse(line).unwrap();
        assert_eq!(got.forwarded, Some(&b"198.51.100.7, 10.0.0.1"[..]));
        assert_eq!(got.agent_id, Some(&b"agent-7"[..]));
        assert!(got.authorization);
    }

    #[test]
    fn bad_lines_and_formats() {
        let f = Format::combined();
        assert_eq!(f.parse(b"").unwrap_err(), Malformed::Layout);
        assert_eq!(
            f.parse(br#"1.2.3.4 - - [10/Oct/9999:13:55:36 -0700] "GET / HTTP/1.1" 200 1 "-" "-""#)
                .unwrap_err(),
            Malformed::Time
        );
        assert_eq!(
            f.parse(br#"1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GARBAGE" 200 1 "-" "-""#)
                .unwrap_err(),
            Malformed::Request
        );
        assert!(Format::compile("$remote_addr$remote_user").is_err());
        assert!(Format::compile("$remote_addr \"$request\"").is_err());
        assert!(Format::compile("${remote_addr").is_err());
    }
}

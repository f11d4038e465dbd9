//! What a replay reads from one access-log line, whatever its format, and why a line is refused.

use super::time::UnixNanos;

/// The fields of one line, borrowed from it.
#[derive(Debug, Default, Clone)]
pub struct Fields<'a> {
    pub addr: &'a [u8],
    pub time: Option<UnixNanos>,
    pub method: &'a [u8],
    /// The request target as logged (path and query).
    pub target: &'a [u8],
    pub forwarded: Option<&'a [u8]>,
    pub agent_id: Option<&'a [u8]>,
    /// The user the log names (`$remote_user`), never verified.
    pub user: Option<&'a [u8]>,
    /// Whether the request carried an `Authorization` header (its value never is replayed).
    pub authorization: bool,
}

/// Why a line was not replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    /// The line does not have the format's layout.
    Layout,
    /// The timestamp is missing, unreadable, or outside the years a log can be from.
    Time,
    /// The request line is not `METHOD TARGET [PROTOCOL]`.
    Request,
    /// The client address is not an IP address.
    Address,
    /// The line holds a NUL byte or invalid UTF-8 where text is read.
    Bytes,
    /// The line is longer than the replay reads.
    TooLong,
}

impl Malformed {
    pub fn describe(self) -> &'static str {
        match self {
            Malformed::Layout => "does not match the log format",
            Malformed::Time => "timestamp unreadable or absurd",
            Malformed::Request => "request line unreadable",
            Malformed::Address => "client address is not an IP",
            Malformed::Bytes => "NUL byte or invalid UTF-8",
            Malformed::TooLong => "line too long",
        }
    }
}

impl Fields<'_> {
    /// The checks every format shares once its fields are taken.
    pub fn check(&self) -> Result<(), Malformed> {
        if self.time.is_none() {
            return Err(Malformed::Time);
        }
        if self.method.is_empty()
            || !self.method.iter().all(u8::is_ascii_uppercase)
            || !self.target.starts_with(b"/")
        {
            return Err(Malformed::Request);
        }
        let texts = [Some(self.target), self.agent_id, self.user, self.forwarded];
        if texts
            .iter()
            .flatten()
            .any(|t| t.contains(&0) || std::str::from_utf8(t).is_err())
        {
            return Err(Malformed::Bytes);
        }
        Ok(())
    }
}

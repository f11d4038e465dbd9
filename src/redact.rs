//! Credentials inside URLs are never printed: every URL that reaches a message, a log line or
//! an HTTP answer goes through [`url`] (one URL) or [`urls_in`] (any text that may hold some).
//!
//! `redis://default:hunter2@host:6379/0` prints as `redis://default:***@host:6379/0`; userinfo
//! without a password (`http://token@host`) is taken as a credential too and prints as
//! `http://***@host`.

use std::borrow::Cow;

/// What stands in for a hidden credential.
pub const MASK: &str = "***";

/// `u` with the password of its userinfo (`scheme://user:password@host`) replaced by `***`.
///
/// Conservative on malformed input: everything between the scheme and the last `@` before any
/// `?` or `#` counts as userinfo, so a password holding an unescaped `/` or `@` is hidden too.
pub fn url(u: &str) -> Cow<'_, str> {
    let start = match u.find("://") {
        Some(i) => i + 3,
        // `scheme:user:pass@host` and other shapes that are not URLs: hide from the first `:`.
        None => match u.find(':') {
            Some(i) => i + 1,
            None => 0,
        },
    };
    let end = u[start..].find(['?', '#']).map_or(u.len(), |i| start + i);
    let Some(at) = u[start..end].rfind('@').map(|i| start + i) else {
        return Cow::Borrowed(u);
    };
    let userinfo = &u[start..at];
    let shown = match userinfo.find(':') {
        Some(colon) => format!("{}:{MASK}", &userinfo[..colon]),
        None => MASK.to_owned(),
    };
    Cow::Owned(format!("{}{shown}{}", &u[..start], &u[at..]))
}

/// `text` with every URL in it passed through [`url`]. A URL ends at whitespace, a quote, a
/// backtick, `<`, `>`, `,`, `;` or a closing bracket.
pub fn urls_in(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let is_end =
        |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>' | ',' | ';' | ')');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(sep) = rest.find("://") {
        // The scheme: the letters, digits, `+`, `-` and `.` just before `://`.
        let scheme_start = rest[..sep]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let token_end = rest[sep + 3..]
            .find(is_end)
            .map_or(rest.len(), |i| sep + 3 + i);
        out.push_str(&rest[..scheme_start]);
        out.push_str(&url(&rest[scheme_start..token_end]));
        rest = &rest[token_end..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_masked() {
        assert_eq!(
            url("redis://default:S3cret@127.0.0.1:6379/0"),
            "redis://default:***@127.0.0.1:6379/0"
        );
        assert_eq!(url("redis://:S3cret@host:6379"), "redis://:***@host:6379");
        assert_eq!(url("http://token@host/x"), "http://***@host/x");
        assert_eq!(url("redis://u:p@ss/w@rd@host"), "redis://u:***@host");
        assert_eq!(url("redis:u:S3cret@host"), "redis:u:***@host");
        for plain in [
            "redis://127.0.0.1:6379",
            "http://127.0.0.1:3000/api?x=a@b",
            "memory",
            "",
        ] {
            assert_eq!(url(plain), plain);
        }
    }

    #[test]
    fn every_url_in_a_text_is_masked() {
        assert_eq!(
            urls_in("redis URL `redis://default:S3cret@h:1/`: refused; also rediss://a:b@c, done"),
            "redis URL `redis://default:***@h:1/`: refused; also rediss://a:***@c, done"
        );
        assert_eq!(
            urls_in("Cluster([\"redis://a:S3cret@h:1\", \"redis://h:2\"])"),
            "Cluster([\"redis://a:***@h:1\", \"redis://h:2\"])"
        );
        assert_eq!(urls_in("no url here: a@b"), "no url here: a@b");
        assert_eq!(urls_in("x://"), "x://");
    }
}

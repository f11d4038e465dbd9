//! Credentials inside URLs are never printed: every URL that reaches a message, a log line or
//! an HTTP answer goes through [`url`] (one URL) or [`urls_in`] (any text that may hold some).
//!
//! Two places in a URL hold credentials:
//!
//! - **userinfo**: `redis://default:hunter2@host:6379/0` prints as
//!   `redis://default:***@host:6379/0`; userinfo without a password (`http://token@host`) is
//!   taken as a credential too and prints as `http://***@host`.
//! - **the query and the fragment**: everything after the first `?` or `#` prints as `***`
//!   (`https://issuer/jwks?api_key=k1` as `https://issuer/jwks?***`), whatever the parameters
//!   are called. A list of secret-looking names (`key`, `token`, `sig`, ...) misses the next
//!   spelling (`k`, `code`, a percent-encoded `X-Amz-Signature`), a bare token has no name at
//!   all, and a token holding `=` looks like a name and a value; an operator reading a log
//!   needs the host and the path, and rarely the query, which is in the configuration anyway.
//! - **an `@` after the first `?` or `#`** may be a query's (`?email=a@b`) or a password's that
//!   holds an unescaped `?` or `#` (`redis://u:pa?ss@host`); no reading is safe for both, so
//!   the URL prints as `scheme://***`.
//!
//! The path is printed as it is: a secret belongs in userinfo, a query or a header, never in a
//! path.

use std::borrow::Cow;

/// `s` cut to `max` characters with control characters dropped: text a client sent, safe to
/// echo in a log line or an answer.
pub(crate) fn printable(s: &str, max: usize) -> String {
    let mut out: String = s.chars().filter(|c| !c.is_control()).take(max).collect();
    if s.chars().filter(|c| !c.is_control()).count() > max {
        out.push('…');
    }
    out
}

/// What stands in for a hidden credential.
pub(crate) const MASK: &str = "***";

/// `u` with the password of its userinfo (`scheme://user:password@host`), and everything after
/// its first `?` or `#`, replaced by `***`.
///
/// Conservative on malformed input: everything between the scheme and the last `@` before any
/// `?` or `#` counts as userinfo, so a password holding an unescaped `/` or `@` is hidden too.
/// An `@` after the first `?` or `#` could be a query's (`?email=a@b`) or a password's that
/// holds a `?` or `#` (`redis://u:pa?ss@host`); no reading is safe for both, so such a URL
/// prints as `scheme://***`.
pub(crate) fn url(u: &str) -> Cow<'_, str> {
    let start = match u.find("://") {
        Some(i) => i + 3,
        // `scheme:user:pass@host` and other shapes that are not URLs: hide from the first `:`.
        None => match u.find(':') {
            Some(i) => i + 1,
            None => 0,
        },
    };
    let rest = &u[start..];
    let query = rest.find(['?', '#']);
    if query.is_some_and(|q| rest[q..].contains('@')) {
        return Cow::Owned(format!("{}{MASK}", &u[..start]));
    }
    let before_query = &rest[..query.unwrap_or(rest.len())];
    let at = before_query.rfind('@');
    if at.is_none() && query.is_none() {
        return Cow::Borrowed(u);
    }
    let mut out = String::with_capacity(u.len() + 8);
    out.push_str(&u[..start]);
    let host_and_path = match at {
        Some(a) => {
            let userinfo = &rest[..a];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..colon]);
                    out.push(':');
                    out.push_str(MASK);
                }
                None => out.push_str(MASK),
            }
            &before_query[a..]
        }
        None => before_query,
    };
    out.push_str(host_and_path);
    if let Some(q) = query {
        // The `?` or `#` itself says a query or a fragment was there.
        out.push_str(&rest[q..=q]);
        if rest.len() > q + 1 {
            out.push_str(MASK);
        }
    }
    Cow::Owned(out)
}

/// `text` with every URL in it (`scheme://...`) passed through [`url`].
///
/// A URL ends at whitespace, a quote, a backtick, `<` or `>`, or where the next `scheme://`
/// begins; a `,`, `;`, `.`, `:`, `!` or closing bracket at its very end is taken as the
/// sentence's, not the URL's. Inside it, `;` and `,` belong to the URL, so a password holding
/// them stays hidden.
pub(crate) fn urls_in(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let is_end = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>');
    let scheme_start = |s: &str, sep: usize| {
        // The scheme: the letters, digits, `+`, `-` and `.` just before `://`.
        // By bytes: a character outside ASCII ends the scheme after its last byte, where a
        // `str` may be sliced (its first byte, plus one, is inside it).
        s.as_bytes()[..sep]
            .iter()
            .rposition(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')))
            .map_or(0, |i| i + 1)
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(sep) = rest.find("://") {
        let from = scheme_start(rest, sep);
        let mut end = rest[sep + 3..]
            .find(is_end)
            .map_or(rest.len(), |i| sep + 3 + i);
        if let Some(next) = rest[sep + 3..end].find("://") {
            let next = sep + 3 + next;
            end = scheme_start(rest, next).max(sep + 3);
        }
        let token = rest[from..end].trim_end_matches([',', ';', '.', ':', '!', ')', ']', '}']);
        out.push_str(&rest[..from]);
        out.push_str(&url(token));
        rest = &rest[from + token.len()..];
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
            "http://127.0.0.1:3000/api/v1",
            "https://[::1]:8443/jwks.json",
            "memory",
            "",
        ] {
            assert_eq!(url(plain), plain);
        }
    }

    #[test]
    fn an_at_sign_after_the_query_hides_everything_after_the_scheme() {
        // A password holding `?` or `#`, or a query holding `@`: the two cannot be told apart.
        for (u, shown) in [
            ("redis://u:pa?ss@host:6379", "redis://***"),
            ("redis://u:pa#ss@host:6379/0", "redis://***"),
            ("redis://u:pa/b?c=d@host", "redis://***"),
            ("redis://u:p@ss/w?x@h", "redis://***"),
            ("redis://:S3c?ret@host", "redis://***"),
            ("http://tok?en@host", "http://***"),
            ("https://h?abcdef@ghij", "https://***"),
            ("http://127.0.0.1:3000/api?x=a@b", "http://***"),
            ("https://h/p#a@b", "https://***"),
            ("127.0.0.1:3000/?key=a@b", "127.0.0.1:***"),
        ] {
            assert_eq!(url(u), shown, "{u}");
        }
    }

    #[test]
    fn everything_after_the_query_or_fragment_mark_is_masked() {
        for (u, shown) in [
            (
                "http://127.0.0.1:9/base?key=K1&region=eu",
                "http://127.0.0.1:9/base?***",
            ),
            (
                "redis://127.0.0.1:6379/0?password=P1",
                "redis://127.0.0.1:6379/0?***",
            ),
            ("https://h/p?api_key=A&API_KEY=B", "https://h/p?***"),
            ("https://h/p?a=1;token=T2", "https://h/p?***"),
            ("https://h/p?sig=1&sig=2&&x", "https://h/p?***"),
            ("https://h/p?dG9rZW4==", "https://h/p?***"),
            ("https://h/p?%6Bey=K3", "https://h/p?***"),
            ("https://h/p?tok=en=K4", "https://h/p?***"),
            (
                "https://h/cb#access_token=T5&token_type=bearer",
                "https://h/cb#***",
            ),
            ("https://h/p#T6", "https://h/p#***"),
            ("https://h/p?a=1#b=2", "https://h/p?***"),
            ("https://h/p?", "https://h/p?"),
            ("https://h/p#", "https://h/p#"),
            // Without a path, and without a scheme.
            ("https://issuer?token=T7", "https://issuer?***"),
            ("127.0.0.1:3000/?key=K8", "127.0.0.1:3000/?***"),
            (
                "https://u:P9@h/p?X-Amz-Credential=C&X-Amz-Signature=S",
                "https://u:***@h/p?***",
            ),
            (
                "redis://u:p@ss/w@rd@h:1/0#insecure",
                "redis://u:***@h:1/0#***",
            ),
        ] {
            assert_eq!(url(u), shown, "{u}");
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
        assert_eq!(
            urls_in("error sending request for url (https://h:1/jwks?token=T1)"),
            "error sending request for url (https://h:1/jwks?***)"
        );
        assert_eq!(
            urls_in("see http://h/p?a=1;key=K2, then retry."),
            "see http://h/p?***, then retry."
        );
        assert_eq!(
            urls_in("nodes redis://a:P3@h:1,redis://b:P4@h:2;redis://h:3?password=P5."),
            "nodes redis://a:***@h:1,redis://b:***@h:2;redis://h:3?***."
        );
        assert_eq!(urls_in("`redis://u:pa;ss@host`"), "`redis://u:***@host`");
        assert_eq!(urls_in("(redis://u:pa,ss@h)"), "(redis://u:***@h)");
        assert_eq!(urls_in("http://h/p?k=v\u{e9}"), "http://h/p?***");
        // A character outside ASCII right before the scheme ends the text before the URL.
        assert_eq!(
            urls_in("x\u{d4}edis://:P6@h \u{e9}\u{e9}redis://:P7@h"),
            "x\u{d4}edis://:***@h \u{e9}\u{e9}redis://:***@h"
        );
        assert_eq!(urls_in("\u{d4}://:P8@h"), "\u{d4}://:***@h");
    }

    proptest! {
        /// Any text at all, URLs or not, in any script: masking never panics.
        #[test]
        fn any_text_is_masked_without_a_panic(text in "\\PC{0,40}(://\\PC{0,20}){0,3}") {
            let _ = urls_in(&text);
            let _ = url(&text);
        }
    }

    use proptest::prelude::*;

    /// Where a secret can sit in a URL, with `{s}` for it and `{n}` for a parameter name.
    const SHAPES: &[&str] = &[
        "redis://user:{s}@h:6379/0",
        "redis://:{s}@h:6379?protocol=resp3",
        "http://{s}@h/x?y=1",
        "https://h/p?a=1&{n}={s}",
        "https://h/p?a=1;{n}={s}",
        "https://h/p?{n}={s}&b=2#frag",
        "https://h/p?{n}={s}&{n}={s}",
        "https://h/p#{n}={s}",
        "https://h/p?x#{s}",
        "https://h?{s}",
        "https://h/p?{s}=",
        "redis://h:1/0?{n}={s}#insecure",
        "https://u:{s}@h/p?{n}={s}",
    ];

    proptest! {
        /// Whatever the secret holds (within what a URL token in a sentence can hold) and wherever
        /// it sits, neither half of it survives, in the URL alone or inside a sentence.
        #[test]
        fn no_part_of_a_secret_is_printed(
            head in "[A-Za-z0-9]{8,16}",
            tail in "[A-Za-z0-9]{8,16}",
            middle in prop::sample::select(vec![
                "", "/", "?", "#", "@", ";", ",", ":", "!", ")", "?x=", "#y&", "&", "=", "==",
                "%3F", "%40", "@h/", "].",
            ]),
            shape in prop::sample::select(SHAPES.to_vec()),
            name in prop::sample::select(vec![
                "key", "api_key", "API_KEY", "token", "access_token", "password", "pwd",
                "secret", "sig", "X-Amz-Signature", "X-Amz-Credential", "auth", "k", "code",
                "%6Bey", "a[b]", "",
            ]),
            before in prop::sample::select(vec!["", "url `", "(", "\"", "see ", "x,"]),
            after in prop::sample::select(vec!["", "`", ")", "\"", ", then", ".", ";", "\n"]),
        ) {
            let secret = format!("{head}{middle}{tail}");
            let u = shape.replace("{n}", name).replace("{s}", &secret);
            let text = format!("{before}{u}{after}");
            // Userinfo made of the whole secret and holding a `:` is `user:password`: the user
            // is shown by design.
            let user_shown = shape.starts_with("http://{s}@") && middle.starts_with(':');
            for shown in [url(&u).into_owned(), urls_in(&text).into_owned()] {
                prop_assert!(user_shown || !shown.contains(&head), "{u} -> {shown}");
                prop_assert!(!shown.contains(&tail), "{u} -> {shown}");
            }
        }
    }
}

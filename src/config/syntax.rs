//! A TOML syntax error, told without echoing a secret.
//!
//! The parser's own message quotes the offending line. When that line holds a secret — the
//! value of a secret field (its own line, the lines of a multi-line string or array that belongs
//! to it, an inline table naming it) or a URL with userinfo, a query or a fragment — only the file, the line, the
//! column and the parser's description are printed, never the text.

use super::ConfigError;
use std::path::Path;

/// Fields whose value is, or may hold, a secret: the last key of their TOML path.
const SECRET_KEYS: &[&str] = &[
    "jwt_hs256_secret",
    "url",
    "cluster",
    "jwks_url",
    "upstream",
    "admin_token",
];

/// Whether the setting at this TOML path (`identity.jwt_hs256_secret`) may hold a secret.
pub(super) fn is_secret_path(path: &str) -> bool {
    let last = path.rsplit('.').next().unwrap_or(path);
    SECRET_KEYS.contains(&last)
}

/// The configuration error for a file that does not parse.
pub(super) fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let description = e
        .message()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let Some(span) = e.span() else {
        return ConfigError(format!(
            "{}: TOML parse error: {}",
            path.display(),
            crate::redact::urls_in(&description)
        ));
    };
    let at = span.start.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..at].matches('\n').count() + 1;
    let column = text[line_start..at].chars().count() + 1;
    match secret_lines(text).into_iter().nth(line - 1).flatten() {
        Some(key) => ConfigError(format!(
            "{}: TOML parse error at line {line}, column {column}: {description} (the line is not shown because it holds the value of `{key}`, which may be a secret; fix the value at that position in the file)",
            path.display(),
        )),
        None => ConfigError(format!(
            "{}: {}",
            path.display(),
            crate::redact::urls_in(e.to_string().trim())
        )),
    }
}

/// For each line of `text`, the secret field whose value it holds part of, if any.
fn secret_lines(text: &str) -> Vec<Option<String>> {
    // The field that owns the multi-line string or the open array the scan is inside.
    let mut owner: Option<String> = None;
    let mut in_string: Option<&'static str> = None;
    let mut depth = 0usize;
    let mut out = Vec::new();
    for line in text.split('\n') {
        let mut secret = match (&owner, in_string.is_some() || depth > 0) {
            (Some(k), true) if is_secret_path(k) => Some(k.clone()),
            _ => None,
        };
        // The key being assigned on this line: the text since the last `{`, `,` or the start.
        let mut key_from = 0;
        let mut key: Option<String> = None;
        let mut i = 0;
        let bytes = line.as_bytes();
        while i < bytes.len() {
            if let Some(delim) = in_string {
                // Bytes, not `str`: stepping over a string's bytes (and an escape's) lands
                // inside a multi-byte character, where a `str` cannot be sliced.
                if bytes[i..].starts_with(delim.as_bytes()) {
                    in_string = None;
                    i += delim.len();
                    if depth == 0 {
                        owner = None;
                    }
                    continue;
                }
                if delim.starts_with('"') && bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
                continue;
            }
            match bytes[i] {
                b'#' => break,
                b'"' | b'\'' => {
                    let q = if bytes[i] == b'"' { "\"" } else { "'" };
                    let triple = if q == "\"" { "\"\"\"" } else { "'''" };
                    let delim = if line[i..].starts_with(triple) {
                        triple
                    } else {
                        q
                    };
                    in_string = Some(delim);
                    if owner.is_none() || depth == 0 {
                        owner = key.clone();
                    }
                    i += delim.len();
                    continue;
                }
                b'=' => {
                    let k = line[key_from..i]
                        .trim()
                        .trim_matches(|c| c == '"' || c == '\'')
                        .trim();
                    let k = k.rsplit('.').next().unwrap_or(k).trim();
                    let k = k.trim_matches(|c| c == '"' || c == '\'').to_owned();
                    if is_secret_path(&k) && secret.is_none() {
                        secret = Some(k.clone());
                    }
                    key = Some(k);
                }
                b'[' | b'{' => {
                    if depth == 0 {
                        owner = key.clone();
                    }
                    depth += 1;
                    key_from = i + 1;
                }
                b']' | b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 && in_string.is_none() {
                        owner = None;
                    }
                }
                b',' => key_from = i + 1,
                _ => {}
            }
            i += 1;
        }
        // A one-line string left open ends with its line (the parser reports it there).
        if in_string.is_some_and(|d| d.len() == 1) {
            in_string = None;
            if depth == 0 {
                owner = None;
            }
        }
        if secret.is_none() && has_credentials(line) {
            secret = Some(owner.clone().or(key).unwrap_or_else(|| "a URL".to_owned()));
        }
        out.push(secret);
    }
    out
}

/// Whether `line` holds something shaped like a URL with userinfo (`scheme://…@`), a query
/// (`scheme://…?`) or a fragment (`scheme://…#`): any of them may carry a credential.
fn has_credentials(line: &str) -> bool {
    line.find("://")
        .is_some_and(|i| line[i + 3..].contains(['@', '?', '#']))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(text: &str) -> Vec<Option<&'static str>> {
        secret_lines(text)
            .into_iter()
            .map(|k| k.map(|k| &*k.leak()))
            .collect()
    }

    #[test]
    fn secret_lines_are_found_in_every_shape() {
        let text = "[identity]\n\
                    jwt_hs256_secret = \"abc\\qdef\"\n\
                    jwt_issuer = \"x\"\n\
                    identity.jwt_hs256_secret = 'x'\n\
                    identity = { jwt_hs256_secret = \"x\" }\n\
                    \"jwt_hs256_secret\" = \"x\"\n\
                    jwt_hs256_secret = \"\"\"\n\
                    line one = \"\n\
                    line two\n\
                    \"\"\"\n\
                    session_cookie = \"sid\" # url = x\n\
                    cluster = [\n\
                    \x20 \"redis://a:pw@h:1\",\n\
                    \x20 \"redis://h:2\",\n\
                    ]\n\
                    after = 1\n\
                    note = \"see http://user:pw@host\"\n";
        let s = secrets(text);
        assert_eq!(s[0], None);
        assert_eq!(s[1], Some("jwt_hs256_secret"));
        assert_eq!(s[2], None);
        assert_eq!(s[3], Some("jwt_hs256_secret"));
        assert_eq!(s[4], Some("jwt_hs256_secret"));
        assert_eq!(s[5], Some("jwt_hs256_secret"));
        assert_eq!(s[6], Some("jwt_hs256_secret"));
        assert_eq!(
            s[7],
            Some("jwt_hs256_secret"),
            "inside the multi-line string"
        );
        assert_eq!(s[8], Some("jwt_hs256_secret"));
        assert_eq!(s[9], Some("jwt_hs256_secret"), "its closing line");
        assert_eq!(s[10], None, "a comment is not a key");
        assert_eq!(s[11], Some("cluster"));
        assert_eq!(s[12], Some("cluster"));
        assert_eq!(s[13], Some("cluster"));
        assert_eq!(s[14], Some("cluster"));
        assert_eq!(s[15], None);
        assert_eq!(s[16], Some("note"), "a URL with credentials anywhere");
    }

    fn error_for(text: &str) -> String {
        let e = text.parse::<toml::Table>().unwrap_err();
        parse_error(Path::new("f.toml"), text, &e).0
    }

    #[test]
    fn a_secret_line_is_located_but_not_shown() {
        let e = error_for("[identity]\njwt_hs256_secret = \"Zr8vQm2L\\qB6yHc3Jf\"\n");
        // The parser's own position for the same error on a line of the same shape.
        let told = error_for("[identity]\njwt_hs256_secreX = \"Zr8vQm2L\\qB6yHc3Jf\"\n");
        assert!(
            told.contains("TOML parse error at line 2, column 31"),
            "{told}"
        );
        assert!(
            e.starts_with("f.toml: TOML parse error at line 2, column 31: invalid escape sequence"),
            "{e}"
        );
        assert!(e.contains("`jwt_hs256_secret`"), "{e}");
        assert!(!e.contains("Zr8vQm2L") && !e.contains("B6yHc3Jf"), "{e}");
        let e = error_for("[identity]\njwt_hs256_secret = \"\"\"\nZr8vQm2L\nB6yH\\qc3Jf\n\"\"\"\n");
        assert!(e.contains("line 4, column 7"), "{e}");
        assert!(!e.contains("Zr8vQm2L") && !e.contains("c3Jf"), "{e}");
        let e = error_for("[store]\nurl = \"redis://default:S3cret\\q@h:1\"\n");
        assert!(e.contains("line 2") && !e.contains("S3cret"), "{e}");
        // A URL with a query or a fragment, on a line of any field.
        for text in [
            "note = \"see https://h/p?api_key=S3cret\\q\"\n",
            "note = \"see https://h/p;x=1#access_token=S3cret\\q\"\n",
        ] {
            let e = error_for(text);
            assert!(e.contains("line 1") && e.contains("not shown"), "{e}");
            assert!(!e.contains("S3cret"), "{e}");
        }
    }

    #[test]
    fn strings_holding_non_ascii_are_scanned() {
        // Found by fuzz/fuzz_targets/config.rs: a string holding a multi-byte character
        // anywhere in a file that does not parse made the scan slice inside the character.
        let e = error_for("[limiters.x]\nwindow = \"\u{3cf}\"\nlimit = \n");
        assert!(e.contains("line 3"), "{e}");
        // An escape of a multi-byte character (not an escape TOML has) steps into it.
        let e = error_for("note = \"\\\u{e9}t\u{e9}\"\n");
        assert!(e.contains("line 1"), "{e}");
        assert_eq!(
            secrets("a = \"\u{e9}\u{1F600}\"\nurl = '\u{e9}'\n"),
            [None, Some("url"), None]
        );
    }

    #[test]
    fn other_lines_are_shown_as_the_parser_tells_them() {
        let e = error_for("[identity]\njwt_issuer = \"a\\qb\"\n");
        assert!(e.contains("jwt_issuer = \"a\\qb\""), "{e}");
        assert!(!e.contains("not shown"), "{e}");
    }
}

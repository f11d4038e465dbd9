//! The merged document read into its raw form, and a value of the wrong type told in an
//! operator's words.
//!
//! The field a deserialisation error belongs to comes from `serde_path_to_error`. What the
//! field takes comes from the table of settings (a setting's [`Kind`], a limiter's or an
//! admission group's field, a section being a table); what was found comes from the document
//! itself. The deserialiser's own message is shown only where the value has the right type
//! and the table has nothing more to say (a field no table knows, a number out of a type's
//! range): it is never parsed.

use super::settings::{self, Kind, GROUP_FIELDS, LIMITER_FIELDS, SETTINGS};
use super::{ConfigError, Ctx, RawConfig};
use serde_path_to_error::Segment;
use toml::Value;

/// What the value at a TOML path must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expected {
    /// A setting's value.
    Value(Kind),
    /// A table; the words to say when it is not one (`None`: "expected a table").
    Table(Option<&'static str>),
}

/// What the table of settings says the value at `keys` must be; `None` for a field it does
/// not know.
fn expected_at(keys: &[&str]) -> Option<Expected> {
    let field = |fields: &[(&str, Kind)], f: &str| {
        fields
            .iter()
            .find(|(name, _)| *name == f)
            .map(|(_, k)| Expected::Value(*k))
    };
    match keys {
        [] | ["limiters"] | ["admission", "groups"] => Some(Expected::Table(None)),
        ["limiters", _] => Some(Expected::Table(Some("must be a table of limiter fields"))),
        ["limiters", _, f] => field(LIMITER_FIELDS, f),
        ["roles"] => Some(Expected::Table(Some(
            "must be a table of roles, each a list of routes, e.g. agent = [\"/v1/agents/**\"]",
        ))),
        ["roles", _] => Some(Expected::Value(Kind::List)),
        ["admission", "groups", _] => Some(Expected::Table(Some(
            "must be a table of routes, max_in_flight, queue and body_hold",
        ))),
        ["admission", "groups", _, f] => field(GROUP_FIELDS, f),
        [section]
            if SETTINGS
                .iter()
                .any(|s| s.section() == *section && s.path != *section) =>
        {
            Some(Expected::Table(None))
        }
        _ => settings::setting(&keys.join("."))
            .filter(|s| s.kind != Kind::Store)
            .map(|s| Expected::Value(s.kind)),
    }
}

/// Whether `v` has a type `kind` takes (whatever its content).
fn fits(kind: Kind, v: &Value) -> bool {
    let strings = |a: &[Value]| a.iter().all(Value::is_str);
    match (kind, v) {
        (Kind::Rate, _) => true,
        (Kind::Str | Kind::Choice(_) | Kind::Store, Value::String(_)) => true,
        (Kind::Int, Value::Integer(_)) => true,
        (Kind::Bool, Value::Boolean(_)) => true,
        (Kind::Duration, Value::Integer(_) | Value::String(_)) => true,
        (Kind::List, Value::Array(a)) => strings(a),
        (Kind::StrOrList, Value::String(_)) => true,
        (Kind::StrOrList, Value::Array(a)) => strings(a),
        (Kind::Statuses, Value::Array(a)) => a
            .iter()
            .all(|x| matches!(x, Value::Integer(_) | Value::String(_))),
        _ => false,
    }
}

/// What was found, as the operator wrote it.
fn found(v: &Value) -> String {
    match v {
        Value::String(s) => format!("string {s:?}"),
        Value::Integer(i) => format!("integer `{i}`"),
        Value::Float(f) => format!("floating point `{f:?}`"),
        Value::Boolean(b) => format!("boolean `{b}`"),
        Value::Datetime(d) => format!("date-time `{d}`"),
        Value::Array(_) => "a list".to_owned(),
        Value::Table(_) => "a table".to_owned(),
    }
}

/// `a`, `a` or `b`, one of `a`, `b`, `c`.
fn one_of(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
    match quoted.as_slice() {
        [one] => one.clone(),
        [a, b] => format!("{a} or {b}"),
        many => format!("one of {}", many.join(", ")),
    }
}

/// What a value of `kind` is, in an operator's words.
fn expected(kind: Kind) -> String {
    match kind {
        Kind::Str => "a string in quotes".to_owned(),
        Kind::Int => "a whole number (no quotes)".to_owned(),
        Kind::Bool => "true or false (no quotes)".to_owned(),
        Kind::List => "a list, e.g. [\"a\", \"b\"]".to_owned(),
        Kind::StrOrList => "a string or a list of strings".to_owned(),
        Kind::Duration => {
            "a duration such as \"30s\", \"15m\" or a whole number of seconds".to_owned()
        }
        Kind::Rate => "a rate in bytes per second such as 240, \"1KiB\" or \"off\"".to_owned(),
        Kind::Choice(words) => format!("{} in quotes", one_of(words)),
        Kind::Statuses => {
            "a list of status codes (503) and ranges in quotes (\"400-499\")".to_owned()
        }
        Kind::Store => "`memory` or a redis:// (or redis+sentinel://) URL in quotes".to_owned(),
    }
}

/// What one entry of a list of `kind` is.
fn expected_entry(kind: Kind) -> &'static str {
    match kind {
        Kind::Statuses => "a status code (503) or a range in quotes (\"400-499\")",
        _ => "a string in quotes",
    }
}

/// The value at `keys` in `doc`.
fn value_at<'a>(doc: &'a toml::Table, keys: &[&str]) -> Option<&'a Value> {
    let (first, rest) = keys.split_first()?;
    let mut v = doc.get(*first)?;
    for k in rest {
        v = v.as_table()?.get(*k)?;
    }
    Some(v)
}

/// `doc` read into its raw form; a value of the wrong type is an error naming its field.
pub(super) fn read(doc: &toml::Table, ctx: &Ctx) -> Result<RawConfig, ConfigError> {
    serde_path_to_error::deserialize(Value::Table(doc.clone())).map_err(|e| {
        let mut keys: Vec<&str> = Vec::new();
        let mut entry: Option<usize> = None;
        for segment in e.path() {
            match segment {
                Segment::Map { key } if entry.is_none() => keys.push(key),
                Segment::Seq { index } => {
                    entry.get_or_insert(*index);
                }
                _ => {}
            }
        }
        let library = e.inner().message().trim().to_owned();
        describe(doc, &keys, entry, &library, ctx)
    })
}

fn describe(
    doc: &toml::Table,
    keys: &[&str],
    entry: Option<usize>,
    library: &str,
    ctx: &Ctx,
) -> ConfigError {
    let path = keys.join(".");
    let (Some(expected_here), Some(v)) = (expected_at(keys), value_at(doc, keys)) else {
        return match keys {
            [] => ConfigError(format!(
                "{}: {library}",
                ctx.file.as_deref().unwrap_or("the configuration")
            )),
            _ => ctx.err(&path, library),
        };
    };
    if super::syntax::is_secret_path(&path) {
        let words = match expected_here {
            Expected::Value(kind) => format!(" (expected {})", expected(kind)),
            Expected::Table(_) => " (expected a table)".to_owned(),
        };
        return ctx.err(
            &path,
            format!("has the wrong type{words}; the value is not shown"),
        );
    }
    let msg = match expected_here {
        Expected::Table(_) if v.is_table() => library.to_owned(),
        Expected::Table(Some(words)) => words.to_owned(),
        Expected::Table(None) => format!("got {}; expected a table", found(v)),
        Expected::Value(kind) => match (kind, v, entry) {
            (Kind::Choice(words), Value::String(s), _) => {
                format!("unknown variant `{s}`; expected {}", one_of(words))
            }
            (Kind::List | Kind::Statuses, Value::Array(a), Some(i)) => match a.get(i) {
                Some(x) => format!(
                    "got {} in the list; expected {}",
                    found(x),
                    expected_entry(kind)
                ),
                None => library.to_owned(),
            },
            _ if fits(kind, v) => library.to_owned(),
            (Kind::Duration, ..) => {
                "is not a duration; write one such as \"30s\", \"15m\" or a whole number of seconds"
                    .to_owned()
            }
            (Kind::StrOrList, ..) => "is not a string or a list of strings".to_owned(),
            _ => format!("got {}; expected {}", found(v), expected(kind)),
        },
    };
    ctx.err(&path, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Loader;

    fn file_error(toml: &str) -> String {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).expect("write");
        let e = Loader::new()
            .file(&path)
            .load()
            .expect_err("must be refused")
            .to_string();
        e.replace(&*path.to_string_lossy(), "c.toml")
    }

    /// A TOML value of a type `kind` does not take.
    fn wrong(kind: Kind) -> &'static str {
        match kind {
            Kind::Int => "\"seven\"",
            Kind::Rate => unreachable!("a rate takes any type and says what it could not read"),
            _ => "1.5",
        }
    }

    /// A TOML value of the type `kind` takes.
    fn right(kind: Kind) -> &'static str {
        match kind {
            Kind::Int => "7",
            Kind::Bool => "true",
            Kind::List | Kind::StrOrList => "[\"a\"]",
            Kind::Statuses => "[503]",
            Kind::Duration => "\"3s\"",
            _ => "\"x\"",
        }
    }

    fn toml_at(path: &str, value: &str) -> String {
        match path.rsplit_once('.') {
            Some((table, key)) => format!("[{table}]\n{key} = {value}\n"),
            None => format!("{path} = {value}\n"),
        }
    }

    #[test]
    fn each_setting_of_the_wrong_type_is_named_with_what_its_kind_takes() {
        for s in SETTINGS {
            if matches!(s.kind, Kind::Rate | Kind::Store) {
                continue;
            }
            let e = file_error(&toml_at(s.path, wrong(s.kind)));
            assert!(
                e.starts_with(&format!("c.toml: {}: ", s.path)),
                "{}: {e}",
                s.path
            );
            let said = match s.kind {
                Kind::Duration => "is not a duration",
                Kind::StrOrList => "is not a string or a list of strings",
                _ => "expected",
            };
            assert!(e.contains(said), "{}: {e}", s.path);
        }
    }

    #[test]
    fn each_setting_of_its_own_type_is_never_a_type_error() {
        for s in SETTINGS {
            if s.kind == Kind::Store {
                continue;
            }
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("c.toml");
            std::fs::write(&path, toml_at(s.path, right(s.kind))).expect("write");
            if let Err(e) = Loader::new().file(&path).load() {
                let e = e.to_string();
                assert!(
                    !e.contains("got ") && !e.contains("has the wrong type"),
                    "{}: the table's kind is not what its raw form reads: {e}",
                    s.path
                );
            }
        }
    }

    #[test]
    fn limiter_and_group_fields_of_the_wrong_type_are_named() {
        for (field, kind) in LIMITER_FIELDS {
            let e = file_error(&format!("[limiters.ui]\n{field} = {}\n", wrong(*kind)));
            assert!(
                e.starts_with(&format!("c.toml: limiters.ui.{field}: ")),
                "{field}: {e}"
            );
        }
        for (field, kind) in GROUP_FIELDS {
            let others: String = [("routes", "[\"/a\"]"), ("max_in_flight", "1")]
                .iter()
                .filter(|(f, _)| f != field)
                .map(|(f, v)| format!("{f} = {v}\n"))
                .collect();
            let e = file_error(&format!(
                "[admission]\nmax_in_flight = 8\n[admission.groups.a]\n{others}{field} = {}\n",
                wrong(*kind)
            ));
            assert!(
                e.starts_with(&format!("c.toml: admission.groups.a.{field}: ")),
                "{field}: {e}"
            );
        }
    }

    #[test]
    fn entries_choices_tables_and_secrets() {
        assert_eq!(
            file_error("[client_ip]\ntrust_proxy = [\"10.0.0.1\", 7]\n"),
            "c.toml: client_ip.trust_proxy: got integer `7` in the list; expected a string in quotes"
        );
        assert_eq!(
            file_error("[limiters.ui]\nfailed_statuses = [503, true]\n"),
            "c.toml: limiters.ui.failed_statuses: got boolean `true` in the list; expected a status code (503) or a range in quotes (\"400-499\")"
        );
        assert_eq!(
            file_error("[limiters.ui]\nmode = \"loud\"\n"),
            "c.toml: limiters.ui.mode: unknown variant `loud`; expected one of `enforce`, `shadow`, `off`"
        );
        assert_eq!(
            file_error("[limiters.ui]\nalgorithm = 3\n"),
            "c.toml: limiters.ui.algorithm: got integer `3`; expected `gcra` or `fixed-window` in quotes"
        );
        assert_eq!(
            file_error("server = 5\n"),
            "c.toml: server: got integer `5`; expected a table"
        );
        assert_eq!(
            file_error("[admission]\nmax_in_flight = 4\n[admission.groups]\na = 1\n"),
            "c.toml: admission.groups.a: must be a table of routes, max_in_flight, queue and body_hold"
        );
        assert_eq!(
            file_error("[identity]\njwt_hs256_secret = 12345\n"),
            "c.toml: identity.jwt_hs256_secret: has the wrong type (expected a string in quotes); the value is not shown"
        );
        assert_eq!(
            file_error("[store]\ncluster = \"redis://u:p@h:1\"\n"),
            "c.toml: store.cluster: has the wrong type (expected a list, e.g. [\"a\", \"b\"]); the value is not shown"
        );
    }

    #[test]
    fn the_choices_of_the_table_are_the_words_the_raw_form_takes() {
        let load = |toml: String| {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("c.toml");
            std::fs::write(&path, &toml).expect("write");
            Loader::new().file(&path).load().map_err(|e| e.to_string())
        };
        let choices = SETTINGS.iter().map(|s| (s.path.to_owned(), s.kind)).chain(
            LIMITER_FIELDS
                .iter()
                .map(|(f, k)| (format!("limiters.ui.{f}"), *k)),
        );
        for (path, kind) in choices {
            let Kind::Choice(words) = kind else { continue };
            for w in words {
                if let Err(e) = load(toml_at(&path, &format!("\"{w}\""))) {
                    assert!(!e.contains(&format!("`{w}`")), "{path} = {w}: {e}");
                }
            }
            let e = load(toml_at(&path, "\"not-a-choice\"")).expect_err(&path);
            assert!(
                e.contains(&format!("{path}: ")) && e.contains("not-a-choice"),
                "{path}: {e}"
            );
        }
    }
}

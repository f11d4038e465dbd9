//! The layering engine: built-in defaults, then the TOML file, then `FLEET_LIMITER_*`
//! variables, then flags, merged into one TOML document whose every value remembers where it
//! came from; type errors named by field in an operator's words.

use super::settings::LIMITER_FIELDS;
use super::*;

/// Builds a [`Config`] from its layers.
#[derive(Debug, Clone, Default)]
pub struct Loader {
    file: Option<PathBuf>,
    env: Vec<(String, String)>,
    /// `(toml path, value, flag name)`
    flags: Vec<(String, String, String)>,
}

impl Loader {
    pub fn new() -> Self {
        Self::default()
    }

    /// Read this TOML file (the `--config` flag).
    pub fn file(mut self, path: impl Into<PathBuf>) -> Self {
        self.file = Some(path.into());
        self
    }

    /// Take `FLEET_LIMITER_*` variables from this process's environment.
    pub fn process_env(self) -> Self {
        self.env(std::env::vars())
    }

    /// Take `FLEET_LIMITER_*` variables from these pairs.
    pub fn env(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        self.env.extend(
            vars.into_iter()
                .filter(|(k, _)| k.starts_with("FLEET_LIMITER_")),
        );
        self
    }

    /// A command-line flag's value for the setting at `path`.
    pub fn flag(mut self, path: &str, value: impl Into<String>, flag: &str) -> Self {
        self.flags
            .push((path.to_owned(), value.into(), flag.to_owned()));
        self
    }

    /// One line per `FLEET_LIMITER_*` variable that names no setting (it is ignored), with the
    /// nearest known name when one is close. Names only: a value may be a secret.
    pub fn warnings(&self) -> Vec<String> {
        self.env
            .iter()
            .map(|(var, _)| var.as_str())
            .filter(|var| !is_known_variable(var))
            .map(|var| match nearest_variable(var) {
                Some(near) => format!(
                    "environment variable {var} is not a setting and is ignored; did you mean {near}?"
                ),
                None => format!(
                    "environment variable {var} is not a setting and is ignored (docs/configuration.md lists them)"
                ),
            })
            .collect()
    }

    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut origins: HashMap<String, String> = HashMap::new();
        let file_name = self.file.as_ref().map(|p| p.display().to_string());
        let mut doc = match &self.file {
            Some(path) => read_file(path)?,
            None => toml::Table::new(),
        };
        if let Some(name) = &file_name {
            record_origins(&doc, "", name, &mut origins);
        }
        for (var, raw) in &self.env {
            apply_env(&mut doc, var, raw, &mut origins)?;
        }
        for (path, raw, flag) in &self.flags {
            apply_flag(&mut doc, path, raw, flag, &mut origins)?;
        }
        let ctx = Ctx {
            origins,
            file: file_name,
        };
        let raw = type_error::read(&doc, &ctx)?;
        build(raw, &ctx, self.file.clone())
    }
}

pub(super) fn read_file(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError(format!(
            "{}: cannot read the configuration file: {e}; check the --config path",
            path.display()
        ))
    })?;
    text.parse::<toml::Table>()
        .map_err(|e| syntax::parse_error(path, &text, &e))
}

pub(super) fn record_origins(
    t: &toml::Table,
    prefix: &str,
    origin: &str,
    out: &mut HashMap<String, String>,
) {
    for (k, v) in t {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if let Value::Table(inner) = v {
            record_origins(inner, &path, origin, out);
        }
        out.insert(path, origin.to_owned());
    }
}

pub(super) fn parse_kind(
    raw: &str,
    kind: Kind,
    origin: &str,
    path: &str,
) -> Result<Value, ConfigError> {
    Ok(match kind {
        Kind::Str | Kind::Duration | Kind::Rate | Kind::Choice(_) | Kind::Store => {
            Value::String(raw.to_owned())
        }
        Kind::Int => Value::Integer(raw.trim().parse::<i64>().map_err(|_| {
            ConfigError(format!("{origin}: {path}: `{raw}` is not a whole number"))
        })?),
        Kind::Bool => match raw.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Value::Boolean(true),
            "false" | "0" | "no" | "off" => Value::Boolean(false),
            _ => {
                return Err(ConfigError(format!(
                    "{origin}: {path}: `{raw}` is not a boolean; use true or false"
                )))
            }
        },
        Kind::List | Kind::StrOrList | Kind::Statuses => Value::Array(
            raw.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| Value::String(s.to_owned()))
                .collect(),
        ),
    })
}

pub(super) fn set_path(doc: &mut toml::Table, path: &str, v: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut t = doc;
    for p in parts {
        let entry = t
            .entry(p.to_owned())
            .or_insert_with(|| Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(toml::Table::new());
        }
        match entry {
            Value::Table(inner) => t = inner,
            _ => return,
        }
    }
    t.insert(last.to_owned(), v);
}

pub(super) fn apply_env(
    doc: &mut toml::Table,
    var: &str,
    raw: &str,
    origins: &mut HashMap<String, String>,
) -> Result<(), ConfigError> {
    let origin = format!("environment variable {var}");
    if let Some(s) = settings::by_variable(var) {
        if s.kind == Kind::Store {
            return apply_store_shorthand(doc, raw, &origin, origins);
        }
        let v = parse_kind(raw, s.kind, &origin, s.path)?;
        set_path(doc, s.path, v);
        origins.insert(s.path.to_owned(), origin);
        return Ok(());
    }
    if let Some(rest) = var.strip_prefix("FLEET_LIMITER_LIMITER_") {
        for (field, kind) in LIMITER_FIELDS {
            let suffix = format!("_{}", field.to_ascii_uppercase());
            if let Some(name) = rest.strip_suffix(&suffix) {
                let name = name.to_ascii_lowercase().replace('_', "-");
                let path = format!("limiters.{name}.{field}");
                let v = parse_kind(raw, *kind, &origin, &path)?;
                set_path(doc, &path, v);
                origins.insert(path, origin);
                return Ok(());
            }
        }
        let fields: Vec<String> = LIMITER_FIELDS
            .iter()
            .map(|(f, _)| f.to_ascii_uppercase())
            .collect();
        return Err(ConfigError(format!(
            "{origin}: not a limiter setting; use FLEET_LIMITER_LIMITER_<NAME>_<FIELD> with FIELD one of {}",
            fields.join(", ")
        )));
    }
    // Variables the configuration does not own (FLEET_LIMITER_CONFIG names the file;
    // others belong to other parts of the program) are left alone.
    Ok(())
}

/// Every variable the program reads: the settings' and the commands' own.
fn known_variables() -> impl Iterator<Item = &'static str> {
    SETTINGS
        .iter()
        .map(|s| s.variable)
        .chain(settings::COMMAND_SETTINGS.iter().map(|c| c.variable))
}

/// Whether some part of the program reads this variable. `FLEET_LIMITER_LIMITER_*` counts as
/// known: a wrong field there is already a configuration error.
pub(super) fn is_known_variable(var: &str) -> bool {
    var.starts_with("FLEET_LIMITER_LIMITER_") || known_variables().any(|k| k == var)
}

/// The known variable nearest to `var` by edit distance, when it is close (at most a third of
/// the name after the prefix, and at most 3 edits).
pub(super) fn nearest_variable(var: &str) -> Option<&'static str> {
    let tail = var.strip_prefix("FLEET_LIMITER_").unwrap_or(var);
    let (distance, best) = known_variables()
        .map(|k| {
            let k_tail = k.strip_prefix("FLEET_LIMITER_").unwrap_or(k);
            (edit_distance(tail, k_tail), k)
        })
        .min_by_key(|(d, _)| *d)?;
    (distance <= 3 && distance * 3 <= tail.len().max(1)).then_some(best)
}

/// Levenshtein distance (insertions, deletions, substitutions) between two ASCII names.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `--store memory` or `--store redis://host:6379`.
pub(super) fn apply_store_shorthand(
    doc: &mut toml::Table,
    raw: &str,
    origin: &str,
    origins: &mut HashMap<String, String>,
) -> Result<(), ConfigError> {
    let raw = raw.trim();
    if raw.eq_ignore_ascii_case("memory") {
        // The shorthand chooses the store whole: a URL or cluster from a lower layer is set aside.
        set_path(doc, "store.backend", Value::String("memory".into()));
        if let Some(Value::Table(t)) = doc.get_mut("store") {
            t.remove("url");
            t.remove("cluster");
        }
        origins.remove("store.url");
        origins.remove("store.cluster");
    } else if raw.starts_with("redis://")
        || raw.starts_with("rediss://")
        || crate::store::redis::is_sentinel_url(raw)
    {
        set_path(doc, "store.backend", Value::String("redis".into()));
        set_path(doc, "store.url", Value::String(raw.to_owned()));
        origins.insert("store.url".into(), origin.to_owned());
    } else {
        return Err(ConfigError(format!(
            "{origin}: store: `{}` is neither `memory` nor a redis://, rediss:// or redis+sentinel:// URL",
            crate::redact::url(raw)
        )));
    }
    origins.insert("store.backend".into(), origin.to_owned());
    Ok(())
}

pub(super) fn apply_flag(
    doc: &mut toml::Table,
    path: &str,
    raw: &str,
    flag: &str,
    origins: &mut HashMap<String, String>,
) -> Result<(), ConfigError> {
    let origin = format!("flag {flag}");
    let kind = settings::setting(path)
        .map(|s| s.kind)
        .ok_or_else(|| ConfigError(format!("{origin}: `{path}` is not a setting")))?;
    if kind == Kind::Store {
        return apply_store_shorthand(doc, raw, &origin, origins);
    }
    let v = match (kind, doc_get(doc, path)) {
        // A repeatable flag adds to what the flag already gave.
        (Kind::List, Some(Value::Array(prev))) if origins.get(path) == Some(&origin) => {
            let mut prev = prev.clone();
            if let Value::Array(more) = parse_kind(raw, kind, &origin, path)? {
                prev.extend(more);
            }
            Value::Array(prev)
        }
        _ => parse_kind(raw, kind, &origin, path)?,
    };
    set_path(doc, path, v);
    origins.insert(path.to_owned(), origin);
    Ok(())
}

pub(super) fn doc_get<'a>(doc: &'a toml::Table, path: &str) -> Option<&'a Value> {
    let mut parts = path.split('.');
    let mut v = doc.get(parts.next()?)?;
    for p in parts {
        v = v.as_table()?.get(p)?;
    }
    Some(v)
}

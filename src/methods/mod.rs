//! Which methods a request may use, and which other methods it names by override.
//!
//! Many frameworks let a request say it is "really" another method, and route it as that one:
//!
//! | framework | header | query parameter | form body |
//! |---|---|---|---|
//! | Express `method-override` | `X-HTTP-Method-Override` (or any header it is given) | the name it is given | the name it is given |
//! | Rails (`Rack::MethodOverride`) | `X-HTTP-Method-Override` | | `_method` |
//! | Laravel, Symfony (`Request::getMethod`) | `X-HTTP-Method-Override` | `_method` | `_method` |
//! | Spring (`HiddenHttpMethodFilter`), Go gorilla/handlers | gorilla: `X-HTTP-Method-Override` | `_method` | `_method` |
//! | ASP.NET Core (`UseHttpMethodOverride`) | `X-HTTP-Method-Override` | | a form field it is given |
//! | Google APIs | `X-HTTP-Method-Override` | | |
//! | OData, SharePoint | `X-HTTP-Method` | | |
//! | others (ArangoDB, Restlet) | `X-HTTP-Method`, `X-Method-Override` | | |
//!
//! A limiter that reads only the request line meters such a request as a method the upstream
//! never routes it as. [`MethodRules::judge`] reads the override headers and query parameters
//! the way the most permissive of these frameworks would:
//!
//! - header names without regard to case, `_` read as `-` (CGI-style servers, PHP and WSGI
//!   among them, map `X_HTTP_Method_Override` to the same variable as `X-HTTP-Method-Override`);
//!   every header line, and every comma-separated element of each (`method-override` takes the
//!   first element of what Node joined; ASP.NET Core and Rack take the whole value), trimmed and
//!   upper-cased;
//! - query parameters split on `&` and `;`, names and values percent-decoded (`+` is a space),
//!   names without regard to case, leading spaces dropped, ` ` and `.` read as `_` and anything
//!   from `[` or a NUL on ignored (PHP's rules), every repetition (Express takes the first, PHP
//!   the last).
//!
//! Each value named must be a method in `methods.allowed`: a value that is not an HTTP method
//! token, names a method outside the list, or comes with more than a handful of others is
//! refused rather than guessed. A form body's `_method` is not read: the gateway never buffers
//! a body (docs/security.md says what to do about it).
//!
//! `methods.allowed` itself: a request whose own method is not in it (CONNECT, TRACE, WebDAV
//! methods, made-up tokens, lower-case spellings) is answered by the gateway and never forwarded.

mod judge;
mod spelling;
#[cfg(test)]
mod tests;

use smallvec::SmallVec;

pub(crate) use spelling::{is_token, param_name};

/// What the gateway does with a request that names a method override (`methods.override`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverrideMode {
    /// Meter it by every limiter its own method picks and every limiter each named method
    /// picks, and forward it unchanged.
    #[default]
    Meter,
    /// Remove the override headers and parameters before the upstream sees them, and meter its
    /// own method. (The decision endpoint cannot remove anything: there it is refused.)
    Strip,
    /// Refuse it with 400.
    Refuse,
}

impl OverrideMode {
    pub const ALL: [OverrideMode; 3] = [
        OverrideMode::Meter,
        OverrideMode::Strip,
        OverrideMode::Refuse,
    ];

    /// The name configuration uses: `meter`, `strip`, `refuse`.
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideMode::Meter => "meter",
            OverrideMode::Strip => "strip",
            OverrideMode::Refuse => "refuse",
        }
    }
}

/// The override headers read by default.
pub(crate) const DEFAULT_OVERRIDE_HEADERS: [&str; 3] = [
    "X-HTTP-Method-Override",
    "X-HTTP-Method",
    "X-Method-Override",
];
/// The override query parameters read by default.
pub(crate) const DEFAULT_OVERRIDE_PARAMS: [&str; 1] = ["_method"];
/// The methods forwarded by default.
pub(crate) const DEFAULT_ALLOWED: [&str; 7] =
    ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
/// Methods `methods.allowed` may not list: the gateway opens no tunnels (CONNECT), and TRACE
/// echoes a request's credentials back.
pub(crate) const NEVER_ALLOWED: [&str; 2] = ["CONNECT", "TRACE"];
/// Most methods `methods.allowed` may list (the methods named by one request are a bit set).
pub(crate) const MAX_ALLOWED: usize = 32;
/// Longest method `methods.allowed` may list, and longest override value read as one.
pub(crate) const MAX_METHOD_LEN: usize = 32;
/// Most names `override_headers` and `override_params` may each list.
pub(crate) const MAX_NAMES: usize = 16;
/// Longest name `override_headers` and `override_params` may list.
pub(crate) const MAX_NAME_LEN: usize = 64;
/// Most override values (comma-separated elements, over every header and parameter) one request
/// may carry.
pub(crate) const MAX_OVERRIDE_VALUES: usize = 16;
/// Most different methods one request may name by override.
pub(crate) const MAX_OVERRIDE_METHODS: usize = 4;

/// `methods`, validated: the override mode, the names read, the methods forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodRules {
    mode: OverrideMode,
    /// Override header names, lower-case, `_` written `-`.
    headers: Box<[Box<str>]>,
    /// Bit `n` set: some override header name is `n` bytes long (a header of another length is
    /// passed over with one test).
    header_lengths: u128,
    /// Override parameter names, read by [`param_name`] (lower-case, `_` for ` ` and `.`).
    params: Box<[Box<str>]>,
    /// The methods forwarded, upper-case, in configuration order.
    allowed: Box<[Box<str>]>,
    /// The `Allow` value: the allowed methods, comma-separated.
    allow: Box<str>,
}

impl Default for MethodRules {
    fn default() -> Self {
        Self::new(
            OverrideMode::default(),
            &DEFAULT_OVERRIDE_HEADERS,
            &DEFAULT_OVERRIDE_PARAMS,
            &DEFAULT_ALLOWED,
        )
    }
}

/// Where a request names an override.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A header, by the name the request used (lower-case).
    Header(Box<str>),
    /// A query parameter, by the configured name it was read as.
    Param(Box<str>),
}

impl Source {
    /// `the `x-http-method-override` header`, `The …` at the start of a sentence.
    fn describe(&self, capital: bool) -> String {
        let the = if capital { "The" } else { "the" };
        match self {
            Source::Header(h) => format!("{the} `{h}` header"),
            Source::Param(p) => format!("{the} `{p}` query parameter"),
        }
    }
}

/// Why a request was refused for its method: the `reason` label of
/// `fleet_limiter_method_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// Its own method is not in `methods.allowed` (501).
    Method,
    /// It names an override and `methods.override = "refuse"`.
    Override,
    /// It names an override, `methods.override = "strip"`, and it came to the decision
    /// endpoint, which cannot remove it.
    OverrideUnstrippable,
    /// An override value that is not an HTTP method.
    OverrideNotAMethod,
    /// An override naming a method outside `methods.allowed`.
    OverrideNotAllowed,
    /// More override values, or different methods, than one request may name.
    OverrideTooMany,
}

impl RefusalReason {
    pub const ALL: [RefusalReason; 6] = [
        RefusalReason::Method,
        RefusalReason::Override,
        RefusalReason::OverrideUnstrippable,
        RefusalReason::OverrideNotAMethod,
        RefusalReason::OverrideNotAllowed,
        RefusalReason::OverrideTooMany,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::Method => "method_not_allowed",
            RefusalReason::Override => "override_refused",
            RefusalReason::OverrideUnstrippable => "override_unstrippable",
            RefusalReason::OverrideNotAMethod => "override_not_a_method",
            RefusalReason::OverrideNotAllowed => "override_not_allowed",
            RefusalReason::OverrideTooMany => "override_too_many",
        }
    }
}

/// Why a request's method override was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `methods.override = "refuse"`, and the request names one.
    Refused(Source),
    /// `methods.override = "strip"` at the decision endpoint, which cannot remove it.
    Unstrippable(Source),
    /// A value that is not an HTTP method token.
    NotAMethod(Source),
    /// A method outside `methods.allowed` (upper-case, at most [`MAX_METHOD_LEN`] bytes).
    NotAllowed(Source, Box<str>),
    /// More than [`MAX_OVERRIDE_VALUES`] values or [`MAX_OVERRIDE_METHODS`] methods.
    TooMany,
}

impl Refusal {
    pub fn reason(&self) -> RefusalReason {
        match self {
            Refusal::Refused(_) => RefusalReason::Override,
            Refusal::Unstrippable(_) => RefusalReason::OverrideUnstrippable,
            Refusal::NotAMethod(_) => RefusalReason::OverrideNotAMethod,
            Refusal::NotAllowed(..) => RefusalReason::OverrideNotAllowed,
            Refusal::TooMany => RefusalReason::OverrideTooMany,
        }
    }

    /// What the client is told (a problem document's `detail`).
    pub fn detail(&self, rules: &MethodRules) -> String {
        match self {
            Refusal::Refused(s) => format!(
                "This gateway refuses method overrides (methods.override = \"refuse\"), and the request names one in {}. Send the request with the method it means in its request line.",
                s.describe(false)
            ),
            Refusal::Unstrippable(s) => format!(
                "Method overrides are removed before the upstream sees them (methods.override = \"strip\"), but {} cannot be removed here (a proxy that asks the decision endpoint forwards the request as it is), so the request is refused. Send the request with the method it means in its request line.",
                s.describe(false)
            ),
            Refusal::NotAMethod(s) => format!(
                "{} does not name an HTTP method; a method override is refused rather than guessed.",
                s.describe(true)
            ),
            Refusal::NotAllowed(s, m) => format!(
                "{} names `{m}`, which this gateway does not forward (it forwards {}).",
                s.describe(true),
                rules.allow()
            ),
            Refusal::TooMany => format!(
                "The request names more than {MAX_OVERRIDE_VALUES} method overrides, or more than {MAX_OVERRIDE_METHODS} different methods; name one."
            ),
        }
    }
}

/// The methods a request names by override: a set over `methods.allowed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Named(u32);

impl Named {
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The methods, in `methods.allowed` order.
    pub fn methods(self, rules: &MethodRules) -> SmallVec<[&str; 4]> {
        if self.0 == 0 {
            return SmallVec::new();
        }
        rules
            .allowed
            .iter()
            .enumerate()
            .filter(|(i, _)| self.0 & (1 << i) != 0)
            .map(|(_, m)| &**m)
            .collect()
    }
}

/// Where the request is being judged: only the gateway (or the middleware) can remove an
/// override from what the upstream sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Gateway,
    DecisionEndpoint,
}

/// What to do about a request's method overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Overrides {
    /// It names none.
    None,
    /// Meter it as these methods too (empty when every override it carries is empty).
    Meter(Named),
    /// Remove every override header and parameter, then meter its own method.
    Strip,
    /// Refuse it (400).
    Refuse(Refusal),
}

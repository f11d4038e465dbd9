//! Which limiters meter a request: a pure function of method, path and credential kind.
//!
//! The guarded set is an allow-list: a request no route names passes unmetered. Limiters in one
//! `group` are alternatives (the most specific matching route wins); limiters in different
//! groups stack (all must allow).
//!
//! The picker lives here; `spec.rs` holds the limiter specs and `routes.rs` the route patterns.

mod reach;
mod routes;
mod spec;
#[cfg(test)]
mod tests;

pub(crate) use reach::{static_method, Sample};
pub(crate) use routes::{
    ambiguous_pair, most_specific, valid_param_name, RoutePattern, Specificity,
};
use routes::{fresh_segment, METHODS};
pub use spec::Mode;
pub(crate) use spec::{
    Cost, Count, CredentialMatch, LimiterSpec, Meter, OnStoreError, Plans, Remember, StatusRanges,
};

use crate::identity::Credential;
use crate::path::CanonicalPath;
use smallvec::SmallVec;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

/// The configured limiters.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    limiters: Vec<Arc<LimiterSpec>>,
    memo: RouteMemo<Picked>,
    /// Whether any limiter that is not off is keyed on a body field: when none is, no request
    /// is asked which fields to read.
    reads_bodies: bool,
    /// [`Policy::body_fields`] of requests that name no other method, by (method, path).
    fields: RouteMemo<BodyFields>,
    /// The headers a limiter that is not off keys on (`header:` and `client-header:` keys),
    /// lower case, each once.
    key_headers: Vec<Arc<str>>,
}

/// The body fields a request's limiters read (see [`Policy::body_fields`]).
pub(crate) type BodyFields = SmallVec<[Arc<str>; 2]>;

/// The limiters one request picked, by index into the policy (most requests pick one to three).
pub(crate) type Picked = SmallVec<[usize; 4]>;

impl Policy {
    pub fn new(limiters: Vec<LimiterSpec>) -> Self {
        let reads_bodies = limiters
            .iter()
            .any(|l| l.key.body_field().is_some() && l.mode != Mode::Off);
        let mut key_headers: Vec<Arc<str>> = Vec::new();
        for l in limiters.iter().filter(|l| l.mode != Mode::Off) {
            if let Some(name) = l.key.header() {
                if !key_headers.iter().any(|h| &**h == name) {
                    key_headers.push(Arc::from(name));
                }
            }
        }
        Self {
            limiters: limiters.into_iter().map(Arc::new).collect(),
            memo: RouteMemo::default(),
            reads_bodies,
            fields: RouteMemo::default(),
            key_headers,
        }
    }

    /// The headers a limiter keys on (lower case): a request that sends one of them more
    /// than once is refused, never keyed on its address.
    pub(crate) fn key_headers(&self) -> &[Arc<str>] {
        &self.key_headers
    }

    /// Every configured limiter, in configuration order.
    pub fn limiters(&self) -> &[Arc<LimiterSpec>] {
        &self.limiters
    }

    pub fn get(&self, name: &str) -> Option<&Arc<LimiterSpec>> {
        self.limiters.iter().find(|l| &*l.name == name)
    }

    /// The limiters that meter this request, in configuration order. The path is the one
    /// canonical path (see `crate::path`): the gateway forwards exactly this path, so there is
    /// no other reading of it to meter.
    pub fn applicable(
        &self,
        method: &str,
        path: &CanonicalPath<'_>,
        cred: Credential,
    ) -> SmallVec<[Arc<LimiterSpec>; 4]> {
        self.picked(method, path, cred)
            .into_iter()
            .map(|i| self.limiters[i].clone())
            .collect()
    }

    /// [`Policy::applicable`] as indices into [`Policy::limiters`].
    pub fn picked(&self, method: &str, path: &CanonicalPath<'_>, cred: Credential) -> Picked {
        let path = path.as_str();
        self.memo.get_or_insert(method, path, cred as u8, || {
            self.applicable_to(method, path, cred)
        })
    }

    /// The first request, if any, on which a limiter that `needs_ceiling` applies with no
    /// limiter beside it that `is_ceiling` for it: its index, and the request as `METHOD /path`
    /// with the credential kind. Asked of the real route picker (precedence, exceptions and
    /// credential kinds exactly as requests meet them) over sample requests: every route and
    /// exception of every limiter, its wildcards filled with a segment no route names (`*` with
    /// one, `**` with none, one and two), under every method and every credential kind. A
    /// start-up check, never on a request's path.
    pub(crate) fn first_unguarded(
        &self,
        needs_ceiling: impl Fn(&LimiterSpec) -> bool,
        is_ceiling: impl Fn(&LimiterSpec, &LimiterSpec) -> bool,
    ) -> Option<(usize, String, Credential)> {
        let patterns: Vec<&RoutePattern> = self
            .limiters
            .iter()
            .flat_map(|l| l.routes.iter().chain(&l.except))
            .collect();
        let fresh = fresh_segment(&patterns);
        let mut paths: Vec<String> = patterns
            .iter()
            .flat_map(|p| p.sample_paths(&fresh))
            .collect();
        paths.sort();
        paths.dedup();
        for path in &paths {
            for method in METHODS {
                for cred in Credential::ALL {
                    let picked = self.applicable_to(method, path, cred);
                    for &i in &picked {
                        let l = &self.limiters[i];
                        if !needs_ceiling(l) {
                            continue;
                        }
                        let guarded = picked
                            .iter()
                            .any(|&j| j != i && is_ceiling(&self.limiters[j], l));
                        if !guarded {
                            return Some((i, format!("{method} {path}"), cred));
                        }
                    }
                }
            }
        }
        None
    }

    /// The body fields the `body:<field>` limiters that could meter a request of `method` (and
    /// the methods `also` names by override) on `path` read, whatever credential it carries:
    /// the fields whose values the request's body must be read for. Empty at once when no
    /// limiter is keyed on the body: such requests stream.
    pub fn body_fields(&self, method: &str, also: &[&str], path: &CanonicalPath<'_>) -> BodyFields {
        if !self.reads_bodies {
            return BodyFields::new();
        }
        // Matched once per distinct path, like the limiters themselves: a request that names
        // no other method (nearly all) reads the remembered answer.
        if also.is_empty() {
            return self.fields.get_or_insert(method, path.as_str(), 0, || {
                self.fields_read(method, &[], path)
            });
        }
        self.fields_read(method, also, path)
    }

    /// [`Policy::body_fields`], matched now.
    fn fields_read(&self, method: &str, also: &[&str], path: &CanonicalPath<'_>) -> BodyFields {
        let mut out = BodyFields::new();
        for cred in Credential::ALL {
            for i in self.picked_any(method, also, path, cred) {
                if let crate::keys::KeyKind::Body(field) | crate::keys::KeyKind::BodyIp(field) =
                    &self.limiters[i].key
                {
                    if !out.contains(field) {
                        out.push(field.clone());
                    }
                }
            }
        }
        out
    }

    /// The limiters that meter a request of `method` on `path` that names the methods in
    /// `also` by override: the union of what each method picks, each limiter once, in
    /// configuration order. Within a group each method still picks its most specific route, so
    /// a `POST` named `GET` is metered by the `POST` route's limiter and the `GET` route's.
    pub fn picked_any(
        &self,
        method: &str,
        also: &[&str],
        path: &CanonicalPath<'_>,
        cred: Credential,
    ) -> Picked {
        let mut all = self.picked(method, path, cred);
        for m in also {
            for i in self.picked(m, path, cred) {
                if !all.contains(&i) {
                    all.push(i);
                }
            }
        }
        all.sort_unstable();
        all
    }

    /// Indices of the limiters that meter `path`.
    fn applicable_to(&self, method: &str, path: &str, cred: Credential) -> Picked {
        let segs: SmallVec<[&str; 16]> = path.split('/').filter(|s| !s.is_empty()).collect();
        let mut best: SmallVec<[(usize, Specificity); 4]> = SmallVec::new();
        for (i, l) in self.limiters.iter().enumerate() {
            let Some(spec) = l.matches(method, &segs, cred) else {
                continue;
            };
            match best
                .iter_mut()
                .find(|(j, _)| self.limiters[*j].group == l.group)
            {
                Some(slot) if spec > slot.1 => *slot = (i, spec),
                Some(_) => {}
                None => best.push((i, spec)),
            }
        }
        best.into_iter().map(|(i, _)| i).collect()
    }
}

/// Slots of a memo: at most this many distinct (method, path, tag) answers are remembered.
/// Paths are chosen by clients, so the memo is bounded: each answer has one slot, chosen by
/// its hash, and a new answer takes its slot's place. A client that sends endless new paths
/// evicts answers at random and only makes their next request match the routes again.
const ROUTE_MEMO_CAP: usize = 4096;

/// Remembered answers of a match of routes against (method, path, tag): [`Policy::applicable_to`]
/// (the tag is the credential), or the shaped route of a request (`crate::shaping`). Routes are
/// matched once per distinct path instead of once per request. A memo lives inside what it
/// answers for, so a reload starts with an empty one.
///
/// Reading a remembered answer takes no lock and writes nothing other workers read (an
/// [`arc_swap`] load), so workers on every core read one hot path's answer at once without
/// bouncing a lock's cache line between them.
pub(crate) struct RouteMemo<V> {
    /// Seeded at random per process: clients cannot aim paths at one slot (and two paths that
    /// do share one only evict each other, never answer for each other).
    hasher: foldhash::fast::RandomState,
    slots: Box<[arc_swap::ArcSwapOption<MemoEntry<V>>]>,
}

impl<V> Default for RouteMemo<V> {
    fn default() -> Self {
        Self {
            hasher: foldhash::fast::RandomState::default(),
            slots: (0..ROUTE_MEMO_CAP)
                .map(|_| arc_swap::ArcSwapOption::empty())
                .collect(),
        }
    }
}

struct MemoEntry<V> {
    method: Box<str>,
    path: Box<str>,
    tag: u8,
    value: V,
}

impl<V: Clone> RouteMemo<V> {
    /// The answer for (`method`, `path`, `tag`): remembered, or `compute`d (and remembered).
    pub(crate) fn get_or_insert(
        &self,
        method: &str,
        path: &str,
        tag: u8,
        compute: impl FnOnce() -> V,
    ) -> V {
        let hash = self.hasher.hash_one((method, path, tag));
        let Some(slot) = self.slots.get(hash as usize % ROUTE_MEMO_CAP) else {
            return compute();
        };
        if let Some(e) = &*slot.load() {
            if e.tag == tag && *e.method == *method && *e.path == *path {
                return e.value.clone();
            }
        }
        let value = compute();
        slot.store(Some(Arc::new(MemoEntry {
            method: method.into(),
            path: path.into(),
            tag,
            value: value.clone(),
        })));
        value
    }
}

impl<V> RouteMemo<V> {
    /// Answers remembered now.
    fn held(&self) -> usize {
        self.slots.iter().filter(|s| s.load().is_some()).count()
    }
}

impl<V> Clone for RouteMemo<V> {
    /// A copy starts with an empty memo.
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl<V> fmt::Debug for RouteMemo<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RouteMemo({} paths)", self.held())
    }
}

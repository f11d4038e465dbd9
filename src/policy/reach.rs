//! What a limiter's routes reach: sample requests of one route (its wildcards filled with a
//! segment no route names, `*` with one, `**` with none, one and two) asked of the real route
//! picker, so precedence, exceptions and credential kinds count as they do for requests.
//! Start-up and `check`/`routes` questions, never on a request's path.

use super::routes::{fresh_segment, METHODS};
use super::{Policy, RoutePattern};
use crate::identity::Credential;

/// A request a route reaches: its method and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) method: &'static str,
    pub(crate) path: String,
}

impl Policy {
    /// A segment no route or exception of any limiter names.
    pub(crate) fn fresh_segment(&self) -> String {
        let patterns: Vec<&RoutePattern> = self
            .limiters()
            .iter()
            .flat_map(|l| l.routes.iter().chain(&l.except))
            .collect();
        fresh_segment(&patterns)
    }

    /// The sample requests of `route`: its sample paths under its own method, or, when it
    /// names none, under each of `methods` (the methods the gateway forwards). A route whose
    /// method is not among `methods` has none.
    pub(crate) fn samples(&self, route: &RoutePattern, methods: &[&str]) -> Vec<Sample> {
        let fresh = self.fresh_segment();
        let paths = route.sample_paths(&fresh);
        let methods: Vec<&'static str> = match route.method() {
            Some(m) => METHODS
                .iter()
                .copied()
                .filter(|k| *k == m && methods.iter().any(|a| a.eq_ignore_ascii_case(k)))
                .collect(),
            None => METHODS
                .iter()
                .copied()
                .filter(|k| methods.iter().any(|a| a.eq_ignore_ascii_case(k)))
                .collect(),
        };
        methods
            .iter()
            .flat_map(|m| {
                paths.iter().map(move |p| Sample {
                    method: m,
                    path: p.clone(),
                })
            })
            .collect()
    }

    /// The limiters that meter one sample, under any credential kind, each with the kinds
    /// under which it does (indices into [`Policy::limiters`], in configuration order).
    pub(crate) fn metering(&self, s: &Sample) -> Vec<(usize, Vec<Credential>)> {
        let mut out: Vec<(usize, Vec<Credential>)> = Vec::new();
        for cred in Credential::ALL {
            for i in self.applicable_to(s.method, &s.path, cred) {
                match out.iter_mut().find(|(j, _)| *j == i) {
                    Some((_, creds)) => creds.push(cred),
                    None => out.push((i, vec![cred])),
                }
            }
        }
        out.sort_by_key(|(i, _)| *i);
        out
    }

    /// The first sample of `route` that limiter `i` meters, methods tried in the order given.
    pub(crate) fn first_reached(
        &self,
        i: usize,
        route: &RoutePattern,
        methods: &[&str],
    ) -> Option<Sample> {
        // The caller's methods in its order; of a `**`, a path that fills it with one
        // segment first (`/v1/agents/x` reads as a request where `/v1/agents` reads as a list).
        let tail = format!("/{}", self.fresh_segment());
        let mut samples = self.samples(route, methods);
        samples.sort_by_key(|s| {
            let at = methods
                .iter()
                .position(|m| m.eq_ignore_ascii_case(s.method))
                .unwrap_or(usize::MAX);
            (at, !s.path.ends_with(&tail))
        });
        samples
            .into_iter()
            .find(|s| self.metering(s).iter().any(|(j, _)| *j == i))
    }
}

/// `method` as the route table spells it (upper case), `GET` for one it does not know.
pub(crate) fn static_method(method: &str) -> &'static str {
    METHODS
        .iter()
        .copied()
        .find(|m| m.eq_ignore_ascii_case(method))
        .unwrap_or("GET")
}

//! `fleet-limiter routes` as a table: each route pattern with its roles and the limiters that
//! meter it, then each request of the declared fleet with the limiters it meets.

use super::format::{pad, source};
use crate::config::check::routes::{Metered, RouteMap};
use std::fmt::Write as _;
use std::path::PathBuf;

/// One limiter as a cell: `agent-device (ip+agent)`, `agent-ip (ip, new agent ids)`,
/// `cli-bearer (ip, cli-token only)`, `ui (user-or-ip, shadow)`.
fn limiter_cell(m: &Metered) -> String {
    let mut notes = vec![m.key.clone()];
    if let Some(c) = m.credential {
        notes.push(format!("{c} only"));
    }
    if m.new_agents {
        notes.push("new agent ids".to_owned());
    }
    if m.shadow {
        notes.push("shadow".to_owned());
    }
    format!("{} ({})", m.limiter, notes.join(", "))
}

fn limiters_cell(ms: &[Metered]) -> String {
    if ms.is_empty() {
        return "none: no limiter meters its requests".to_owned();
    }
    ms.iter().map(limiter_cell).collect::<Vec<_>>().join(", ")
}

/// A column as wide as its longest cell or its header, and two spaces.
fn width<'a>(header: &str, cells: impl Iterator<Item = &'a str>) -> usize {
    cells.map(str::len).fold(header.len(), usize::max) + 2
}

/// The map as a table, its columns as wide as their longest cell.
pub(crate) fn routes_table(config: &Option<PathBuf>, map: &RouteMap) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Routes: {}", source(config));
    let _ = writeln!(o);
    let route_w = width("ROUTE", map.routes.iter().map(|r| r.route.as_str()));
    let role_cells: Vec<String> = map
        .routes
        .iter()
        .map(|r| match r.roles.as_slice() {
            [] => "-".to_owned(),
            roles => roles.join(", "),
        })
        .collect();
    let role_w = width("ROLE", role_cells.iter().map(String::as_str));
    let _ = writeln!(
        o,
        "{}{}LIMITERS (KEY)",
        pad("ROUTE", route_w),
        pad("ROLE", role_w)
    );
    for (r, role) in map.routes.iter().zip(&role_cells) {
        let _ = writeln!(
            o,
            "{}{}{}",
            pad(&r.route, route_w),
            pad(role, role_w),
            limiters_cell(&r.limiters)
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "The fleet's requests, as `check` models them:");
    let cells: Vec<String> = map
        .requests
        .iter()
        .map(|q| format!("{} {}", q.method, q.path))
        .collect();
    let name_w = width("REQUEST", map.requests.iter().map(|q| q.request));
    let req_w = width("SENT AS", cells.iter().map(String::as_str));
    let _ = writeln!(
        o,
        "{}{}LIMITERS (KEY)",
        pad("REQUEST", name_w),
        pad("SENT AS", req_w)
    );
    for (q, cell) in map.requests.iter().zip(&cells) {
        let _ = writeln!(
            o,
            "{}{}{}",
            pad(q.request, name_w),
            pad(cell, req_w),
            limiters_cell(&q.limiters)
        );
    }
    o
}

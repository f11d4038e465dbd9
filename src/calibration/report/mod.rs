//! Rendering `check` and `simulate` reports: a table for a terminal, or JSON. `check.rs`,
//! `limiters.rs` and `findings.rs` hold the check's table; `simulate.rs`, `guards.rs` and
//! `herd.rs` the simulation's; `format.rs` what both share.

mod check;
mod findings;
mod format;
mod guards;
mod herd;
mod limiters;
mod routes;
mod simulate;

pub(crate) use check::check_table;
pub use format::{json, Format};
pub(crate) use routes::routes_table;
pub use simulate::simulate_table;

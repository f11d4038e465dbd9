//! Test macros shared by the unit tests (declared first in `src/lib.rs`) and the integration
//! tests (`#[macro_use] #[path = "support/macros.rs"] mod macros;`): one definition of where
//! snapshots and key fixtures live.

/// Snapshot `value` as `name` under the top-level `snapshots/` folder.
#[allow(unused_macros)]
macro_rules! snap {
    ($name:expr, $value:expr) => {
        insta::with_settings!({
            snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"),
            prepend_module_to_snapshot => false,
        }, {
            insta::assert_snapshot!($name, $value);
        })
    };
}

/// A test key or key set from `tests/fixtures/keys/`, as text.
#[allow(unused_macros)]
macro_rules! fixture {
    ($name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/keys/",
            $name
        ))
    };
}

//! The document itself: unknown fields, values of the wrong type in operator words, TOML
//! syntax, a missing file, and secrets that never reach an error message.

use super::*;

#[test]
fn error_unknown_field() {
    snap!(
        "config_error_unknown_field",
        file_error("[server]\nlisten_addr = \"127.0.0.1:1\"\n", &[])
    );
    snap!(
        "config_error_unknown_limiter_field",
        file_error("[limiters.agent-device]\nburst = 5\n", &[])
    );
    snap!(
        "config_error_unknown_section",
        file_error("[serverr]\nlisten = \"127.0.0.1:1\"\n", &[])
    );
}

#[test]
fn error_wrong_type() {
    snap!(
        "config_error_wrong_type",
        file_error("[limiters.ui]\nlimit = \"lots\"\n", &[])
    );
    snap!(
        "config_error_limiter_not_table",
        file_error("[limiters]\nui = 5\n", &[])
    );
}

#[test]
fn every_section_names_the_field_of_a_wrong_type_in_operator_words() {
    let cases = [
        "[ops]\nnear_limit_percent = \"lots\"\n",
        "[ops]\nadmin_listen = 7391\n",
        "[identity]\nleeway = [1, 2]\n",
        "[identity]\naudiences = \"app\"\n",
        "[cors]\nallow_credentials = \"yes\"\n",
        "[cors]\nallowed_origins = \"https://dash.example.com\"\n",
        "[server]\nlisten = 8080\n",
        "[store]\nmax_keys = 1.5\n",
        "[path]\nbackslash = true\n",
        "[decision]\nallow_from = \"10.0.0.5\"\n",
        "enabled = \"yes\"\n",
    ];
    let shown: Vec<String> = cases
        .iter()
        .map(|toml| format!("{}=> {}", toml.replace('\n', " "), file_error(toml, &[])))
        .collect();
    for line in &shown {
        for rust in [
            " i64",
            " u64",
            " u8",
            " usize",
            " f64",
            "a sequence",
            "struct ",
        ] {
            assert!(!line.contains(rust), "a Rust type name in {line}");
        }
    }
    snap!("config_error_section_types", shown.join("\n"));
}

#[test]
fn error_invalid_toml() {
    snap!(
        "config_error_toml_syntax",
        file_error("[server\nlisten = 1\n", &[])
    );
}

#[test]
fn error_missing_file() {
    let err = Loader::new()
        .file("/nonexistent/fleet-limiter.toml")
        .load()
        .unwrap_err();
    snap!("config_error_missing_file", err.to_string());
}

#[test]
fn error_toml_syntax_in_a_secret() {
    let e = file_error(
        "[identity]\njwt_hs256_secret = \"Zr8vQm2LwX4kT9pN\\qB6yHc3JfD1sGa7UeKo5RtW\"\n",
        &[],
    );
    assert!(!e.contains("Zr8vQm2L") && !e.contains("B6yHc3Jf"), "{e}");
    snap!("config_error_toml_syntax_secret", e);
}

#[test]
fn error_secret_of_the_wrong_type() {
    let e = file_error(
        "[store]\ncluster = \"redis://default:S3cretPassw0rd@127.0.0.1:1\"\n",
        &[],
    );
    assert!(!e.contains("S3cretPassw0rd"), "{e}");
    assert!(e.contains("store.cluster: has the wrong type"), "{e}");
}

#[test]
fn error_toml_syntax_below_a_cluster_password() {
    // The config fuzz target's find: a cluster node's password, then a line that does not parse.
    let e = file_error(
        "store.cluster = [\"redis://:Mk5ecretPassw0rd77@127.0.0.1:7000\"]\nstore.backend = \"redis\"\n[limiterLEET_LIMITEB_STORE_]CLUSTEUSTER\u{d4}edis://:MITER_S",
        &[],
    );
    assert!(!e.contains("Mk5ecretPassw0rd77"), "{e}");
}

//! `[headers]`: the limit-header profile from every layer, and its errors.

use super::*;

#[test]
fn headers_profile_from_every_layer() {
    use crate::config::headers::{HeaderProfile, LegacyReset, Standard};
    assert_eq!(
        Config::default().headers,
        HeaderProfile {
            standard: Standard::Draft6,
            legacy: true,
            legacy_reset: LegacyReset::Unix,
        }
    );
    let f = file("[headers]\nstandard = \"draft-10\"\nlegacy = false\n");
    let cfg = Loader::new().file(&f.path).load().expect("file");
    assert_eq!(cfg.headers.standard, Standard::Draft10);
    assert!(!cfg.headers.legacy);
    // The environment over the file, a flag over both; whitespace around a value is dropped.
    let cfg = Loader::new()
        .file(&f.path)
        .env([
            (
                "FLEET_LIMITER_HEADERS_STANDARD".to_owned(),
                "draft-7".to_owned(),
            ),
            ("FLEET_LIMITER_HEADERS_LEGACY".to_owned(), "yes".to_owned()),
            (
                "FLEET_LIMITER_HEADERS_LEGACY_RESET".to_owned(),
                " delta ".to_owned(),
            ),
        ])
        .flag("headers.standard", "off", "--headers-standard")
        .load()
        .expect("layers");
    assert_eq!(
        cfg.headers,
        HeaderProfile {
            standard: Standard::Off,
            legacy: true,
            legacy_reset: LegacyReset::Delta,
        }
    );
    assert_eq!(cfg.origin("headers.standard"), "flag --headers-standard");
    for s in Standard::ALL {
        let cfg = Loader::new()
            .env([(
                "FLEET_LIMITER_HEADERS_STANDARD".to_owned(),
                s.as_str().to_owned(),
            )])
            .load()
            .expect("every standard");
        assert_eq!(cfg.headers.standard, s);
    }
}

#[test]
fn error_headers() {
    let lines = [
        env_error(&[("FLEET_LIMITER_HEADERS_STANDARD", "Draft-7")]),
        env_error(&[("FLEET_LIMITER_HEADERS_STANDARD", "true")]),
        env_error(&[("FLEET_LIMITER_HEADERS_STANDARD", "false")]),
        env_error(&[("FLEET_LIMITER_HEADERS_STANDARD", &"draft-".repeat(50))]),
        env_error(&[("FLEET_LIMITER_HEADERS_LEGACY", "maybe")]),
        env_error(&[("FLEET_LIMITER_HEADERS_LEGACY_RESET", "epoch")]),
        file_error("[headers]\nstandard = true\n", &[]),
        file_error("[headers]\nstandard = 7\n", &[]),
        file_error("[headers]\nlegacy = \"true\"\n", &[]),
        file_error("[headers]\nlegacy_reset = 0\n", &[]),
        file_error("[headers]\nreset = \"unix\"\n", &[]),
    ];
    snap!("config_error_headers", lines.join("\n"));
}

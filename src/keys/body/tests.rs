//! The body keys' pure functions: formats, fields, normalisation, refusals.

use super::*;

fn one(format: Format, body: &[u8]) -> Result<Option<String>, Unreadable> {
    values(format, body, &["email"]).map(|mut v| v.remove(0))
}

#[test]
fn only_json_and_form_bodies_in_utf8_without_an_encoding_are_read() {
    let f = |ct: &str| format_of(Some(ct.as_bytes()), None);
    assert_eq!(f("application/json"), Ok(Format::Json));
    assert_eq!(f("Application/JSON; charset=utf-8"), Ok(Format::Json));
    assert_eq!(f("application/json;charset=\"UTF-8\""), Ok(Format::Json));
    assert_eq!(f("application/x-www-form-urlencoded"), Ok(Format::Form));
    for other in [
        "text/plain",
        "application/json-patch+json",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "",
    ] {
        assert_eq!(f(other), Err(Unreadable::MediaType), "{other}");
    }
    for charset in [
        "application/json; charset=utf-16",
        "application/json; charset=latin1",
        "application/x-www-form-urlencoded; charset=iso-8859-1",
    ] {
        assert_eq!(f(charset), Err(Unreadable::Charset), "{charset}");
    }
    assert_eq!(format_of(None, None), Err(Unreadable::MediaType));
    for enc in ["gzip", "deflate", "br", "identity, gzip", ""] {
        assert_eq!(
            format_of(Some(b"application/json"), Some(enc.as_bytes())),
            Err(Unreadable::Encoding),
            "{enc}: a compressed body is not unpacked"
        );
    }
    assert_eq!(
        format_of(Some(b"application/json"), Some(b"identity")),
        Ok(Format::Json)
    );
}

#[test]
fn a_json_field_is_read_from_the_top_level_object_the_last_duplicate_winning() {
    let j = |b: &str| one(Format::Json, b.as_bytes());
    assert_eq!(j(r#"{"email":"a@x.io"}"#), Ok(Some("a@x.io".into())));
    assert_eq!(
        j(r#"{"password":"p","email":"A@X.io","nested":{"email":"b@y"}}"#),
        Ok(Some("a@x.io".into()))
    );
    // Escapes in the name and the value read as any JSON parser reads them.
    assert_eq!(
        j(r#"{"em\u0061il":"a\u0040x.io"}"#),
        Ok(Some("a@x.io".into()))
    );
    assert_eq!(j(r#"{"code":12345,"email":42}"#), Ok(Some("42".into())));
    // JSON.parse keeps the last of duplicate names: so does the key.
    assert_eq!(
        j(r#"{"email":"decoy@x.test","email":"victim@example.com"}"#),
        Ok(Some("victim@example.com".into()))
    );
    assert_eq!(
        j(r#"{"email":["a@x.io"],"email":"victim@example.com"}"#),
        Ok(Some("victim@example.com".into()))
    );
    assert_eq!(
        j(r#"{"email":"decoy@x.test","email":["victim@example.com"]}"#),
        Err(Unreadable::Ambiguous)
    );
    // No field: the upstream reads no target either.
    assert_eq!(j("{}"), Ok(None));
    assert_eq!(j(r#"{"Email":"a@x.io"}"#), Ok(None));
    for ambiguous in [
        r#"{"email":["a@x.io"]}"#,
        r#"{"email":{"v":"a@x.io"}}"#,
        r#"{"email":null}"#,
        r#"{"email":true}"#,
        r#"{"email":1.5}"#,
    ] {
        assert_eq!(j(ambiguous), Err(Unreadable::Ambiguous), "{ambiguous}");
    }
    for value in [r#"{"email":""}"#, r#"{"email":"   "}"#] {
        assert_eq!(j(value), Err(Unreadable::Value), "{value}");
    }
    for malformed in [
        r#"["a@x.io"]"#,
        r#""a@x.io""#,
        r#"{"email":"a@x.io""#,
        r#"{"email":"a@x.io"} {}"#,
        r#"{"email":"a@x.io"}x"#,
        r#"{"email":"\ud800@x.io"}"#,
        "",
    ] {
        assert_eq!(j(malformed), Err(Unreadable::Malformed), "{malformed}");
    }
    let nest = |n: usize| {
        format!(
            r#"{{"email":"a@x.io","d":{}1{}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    assert_eq!(
        j(&nest(MAX_DEPTH - 1)),
        Ok(Some("a@x.io".into())),
        "as deep as allowed"
    );
    assert_eq!(j(&nest(MAX_DEPTH)), Err(Unreadable::TooDeep), "one deeper");
    assert_eq!(j(&nest(100_000)), Err(Unreadable::TooDeep), "far deeper");
    let objects = format!(
        r#"{{"email":"a@x.io","d":{}1{}}}"#,
        r#"{"a":"#.repeat(40),
        "}".repeat(40)
    );
    assert_eq!(j(&objects), Err(Unreadable::TooDeep), "objects count too");
    let mut bad_utf8 = br#"{"email":"a@x.io","n":""#.to_vec();
    bad_utf8.extend_from_slice(&[0xff, 0xfe]);
    bad_utf8.extend_from_slice(br#""}"#);
    assert_eq!(
        one(Format::Json, &bad_utf8),
        Err(Unreadable::Malformed),
        "bad UTF-8 anywhere"
    );
    assert_eq!(
        one(Format::Json, b"\xef\xbb\xbf{\"email\":\"a@x.io\"}"),
        Ok(Some("a@x.io".into())),
        "a byte-order mark is skipped, as Node's parsers skip it"
    );
    let long = format!(r#"{{"email":"{}@x.io"}}"#, "a".repeat(300));
    assert_eq!(j(&long), Err(Unreadable::Value), "too long to key");
    assert_eq!(
        j("{\"email\":\"a\\u0000@x.io\"}"),
        Err(Unreadable::Value),
        "a control character"
    );
}

#[test]
fn a_form_field_is_decoded_strictly_and_must_be_named_once() {
    let f = |b: &str| one(Format::Form, b.as_bytes());
    assert_eq!(f("email=a%40x.io&password=p"), Ok(Some("a@x.io".into())));
    assert_eq!(f("x=1&email=+A%40X.io+"), Ok(Some("a@x.io".into())));
    assert_eq!(f("em%61il=a@x.io"), Ok(Some("a@x.io".into())));
    assert_eq!(f("&&email=a@x.io&"), Ok(Some("a@x.io".into())));
    assert_eq!(f("other=a@x.io"), Ok(None));
    assert_eq!(f(""), Ok(None));
    assert_eq!(f("emails=a@x.io"), Ok(None));
    for ambiguous in [
        "email=a@x.io&email=b@x.io",
        "email=a@x.io&email=a@x.io",
        "email=a@x.io&email",
        "email[]=victim@example.com",
        "email%5B%5D=victim@example.com",
        "email[0]=victim@example.com",
        "email=decoy@x.test&email[]=victim@example.com",
    ] {
        assert_eq!(f(ambiguous), Err(Unreadable::Ambiguous), "{ambiguous}");
    }
    for malformed in [
        "email=%zz@x.io",
        "email=a%4@x.io",
        "email=a%",
        "email=a@x.io&other=%ff%fe",
        "email=a@x.io&other=%zz",
        "email=%C3%28",
    ] {
        assert_eq!(f(malformed), Err(Unreadable::Malformed), "{malformed}");
    }
    for value in ["email=", "email"] {
        assert_eq!(f(value), Err(Unreadable::Value), "{value}");
    }
    assert_eq!(
        one(Format::Form, b"email=a@x.io&n=\xff"),
        Err(Unreadable::Malformed),
        "raw bytes that are not UTF-8"
    );
}

#[test]
fn several_fields_at_once_each_on_its_own() {
    let v = values(
        Format::Json,
        br#"{"email":"a@x.io","code_id":"c-1"}"#,
        &["email", "code_id", "none"],
    );
    assert_eq!(
        v,
        Ok(vec![
            Some("a@x.io".to_owned()),
            Some("c-1".to_owned()),
            None
        ])
    );
    assert_eq!(
        values(
            Format::Json,
            br#"{"email":"a@x.io","user":["x"]}"#,
            &["email", "user"]
        ),
        Err(Unreadable::Ambiguous),
        "one field unreadable refuses the body"
    );
}

#[test]
fn every_spelling_of_one_inbox_is_one_key() {
    for (raw, key) in [
        (" Alice@Example.COM ", "alice@example.com"),
        ("alice+promo@example.com", "alice@example.com"),
        ("alice@example.com.", "alice@example.com"),
        ("\tBob\n", "bob"),
        ("Code-7F", "code-7f"),
        // Format characters: zero-width space, joiner, soft hyphen, a byte-order mark.
        ("vic\u{200b}tim@example.com", "victim@example.com"),
        ("victim\u{200d}@exa\u{00ad}mple.com", "victim@example.com"),
        ("\u{feff}victim@example.com", "victim@example.com"),
        // NFKC: fullwidth at sign and letters, a ligature.
        ("victim\u{ff20}example.com", "victim@example.com"),
        (
            "\u{ff56}\u{ff49}\u{ff43}\u{ff54}\u{ff49}\u{ff4d}@example.com",
            "victim@example.com",
        ),
        ("\u{fb01}nance@example.com", "finance@example.com"),
        // A quoted local part reaches the unquoted one's inbox.
        ("\"victim\"@example.com", "victim@example.com"),
        ("\"vic\\tim\"@example.com", "victim@example.com"),
        // IDNA: the Unicode and punycode forms of one domain.
        ("victim@b\u{fc}cher.example", "victim@xn--bcher-kva.example"),
        (
            "victim@xn--bcher-kva.example",
            "victim@xn--bcher-kva.example",
        ),
        ("victim@B\u{dc}CHER.example", "victim@xn--bcher-kva.example"),
        ("\u{c9}lodie@exemple.fr", "\u{e9}lodie@exemple.fr"),
        ("+tag@example.com", "+tag@example.com"),
        // The mail providers' own rules: Gmail ignores dots, googlemail.com is gmail.com.
        ("v.i.c.t.i.m@gmail.com", "victim@gmail.com"),
        ("Vic.Tim+reset@GMail.com.", "victim@gmail.com"),
        ("victim@googlemail.com", "victim@gmail.com"),
        ("v.ictim+x@googlemail.com", "victim@gmail.com"),
        ("\"v.i.ctim\"@gmail.com", "victim@gmail.com"),
        // Elsewhere a dot is part of the inbox's name.
        ("v.ictim@example.com", "v.ictim@example.com"),
        ("victim@gmail.com.example", "victim@gmail.com.example"),
    ] {
        assert_eq!(normalize(raw).as_deref(), Some(key), "{raw:?}");
    }
    // Lists, display forms, two at signs, empty parts: never one inbox.
    for refused in [
        "...@gmail.com",
        "victim@example.com,decoy@x.test",
        "victim@example.com;decoy@x.test",
        "Victim <victim@example.com>",
        "victim@example.com decoy@x.test",
        "a@b@c",
        "\"a@b\"@example.com",
        "\"victim\"x@example.com",
        "\"victim@example.com",
        "@example.com",
        "user@",
        "user@.",
        "victim@exa_mple.com",
        "victim@(comment)example.com",
        "victim\u{ff0c}decoy@x.test",
        "",
        "  ",
        "\u{200b}",
        "a\u{0}b",
        "a\u{7f}",
        &"x".repeat(257),
    ] {
        assert_eq!(normalize(refused), None, "{refused:?}");
    }
    assert_eq!(normalize(&"x".repeat(256)).map(|s| s.len()), Some(256));
}

#[test]
fn each_reason_names_its_status_and_never_a_value() {
    for r in Unreadable::ALL {
        assert!(matches!(r.status(), 400 | 408 | 413 | 415), "{r:?}");
        let d = r.detail("email", 16384);
        assert!(d.contains("`email`"), "{d}");
    }
    assert!(Unreadable::TooLarge
        .detail("email", 16384)
        .contains("server.body_key_max_bytes"));
}

#[test]
fn field_names() {
    assert!(valid_field("email") && valid_field("codeId") && valid_field("user.name"));
    for bad in ["", "a b", "é", "a/b", &"x".repeat(65)] {
        assert!(!valid_field(bad), "{bad}");
    }
}

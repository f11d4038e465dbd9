//! Every spelling the frameworks read, and every refusal with its source and reason.

use super::*;

fn rules(mode: OverrideMode) -> MethodRules {
    MethodRules::new(
        mode,
        &DEFAULT_OVERRIDE_HEADERS,
        &DEFAULT_OVERRIDE_PARAMS,
        &DEFAULT_ALLOWED,
    )
}

/// `judge` at the gateway over `(name, value)` headers and a query.
fn judge(r: &MethodRules, headers: &[(&str, &str)], query: Option<&str>) -> Overrides {
    r.judge(
        headers.iter().map(|(n, v)| (*n, v.as_bytes())),
        query,
        At::Gateway,
    )
}

/// The methods a request names, or the refusal's reason.
fn metered(headers: &[(&str, &str)], query: Option<&str>) -> Result<Vec<String>, String> {
    let r = rules(OverrideMode::Meter);
    match judge(&r, headers, query) {
        Overrides::None => Ok(vec!["-".to_owned()]),
        Overrides::Meter(n) => Ok(n.methods(&r).iter().map(|m| m.to_string()).collect()),
        Overrides::Refuse(why) => Err(why.reason().as_str().to_owned()),
        Overrides::Strip => Err("strip".to_owned()),
    }
}

fn ok(methods: &[&str]) -> Result<Vec<String>, String> {
    Ok(methods.iter().map(|m| m.to_string()).collect())
}

fn refused(reason: RefusalReason) -> Result<Vec<String>, String> {
    Err(reason.as_str().to_owned())
}

#[test]
fn header_spellings_are_read_as_every_framework_reads_them() {
    let h = "x-http-method-override";
    for (headers, want) in [
        (vec![], ok(&["-"])),
        (vec![("x-agent-id", "GET")], ok(&["-"])),
        (vec![(h, "GET")], ok(&["GET"])),
        (vec![(h, "get")], ok(&["GET"])),
        (vec![(h, "gEt")], ok(&["GET"])),
        (vec![(h, " GET\t")], ok(&["GET"])),
        // method-override takes the first element, ASP.NET Core the whole: meter both.
        (vec![(h, "GET, PUT")], ok(&["GET", "PUT"])),
        (vec![(h, "GET,,PUT,")], ok(&["GET", "PUT"])),
        // Two lines (Node joins them; Rack and ASP.NET Core read one or the other).
        (vec![(h, "PUT"), (h, "GET")], ok(&["GET", "PUT"])),
        (vec![(h, "GET"), (h, "GET")], ok(&["GET"])),
        // Every configured name, and the CGI spellings of each.
        (vec![("x-http-method", "DELETE")], ok(&["DELETE"])),
        (vec![("x-method-override", "PATCH")], ok(&["PATCH"])),
        (vec![("x_http_method_override", "GET")], ok(&["GET"])),
        (vec![("x-http_method-override", "GET")], ok(&["GET"])),
        (
            vec![("x-http-method", "PUT"), ("x-method-override", "GET")],
            ok(&["GET", "PUT"]),
        ),
        // Empty: carried, names nothing.
        (vec![(h, "")], ok(&[])),
        (vec![(h, " , ")], ok(&[])),
        // Not a method, not an allowed one, too many.
        (
            vec![(h, "G ET")],
            refused(RefusalReason::OverrideNotAMethod),
        ),
        (
            vec![(h, "GET;")],
            refused(RefusalReason::OverrideNotAMethod),
        ),
        (
            vec![(h, "G\u{c9}T")],
            refused(RefusalReason::OverrideNotAMethod),
        ),
        (
            vec![(h, "PROPFIND")],
            refused(RefusalReason::OverrideNotAllowed),
        ),
        (
            vec![(h, "connect")],
            refused(RefusalReason::OverrideNotAllowed),
        ),
        (
            vec![(h, "TRACE")],
            refused(RefusalReason::OverrideNotAllowed),
        ),
        (
            vec![(h, "GET, PROPFIND")],
            refused(RefusalReason::OverrideNotAllowed),
        ),
        (
            vec![(h, &"A".repeat(33))],
            refused(RefusalReason::OverrideNotAMethod),
        ),
        (
            vec![(h, "GET,PUT,POST,PATCH,DELETE")],
            refused(RefusalReason::OverrideTooMany),
        ),
    ] {
        assert_eq!(metered(&headers, None), want, "{headers:?}");
    }
    let flood: Vec<(&str, &str)> = (0..17).map(|_| (h, "GET")).collect();
    assert_eq!(
        metered(&flood, None),
        refused(RefusalReason::OverrideTooMany)
    );
    let sixteen: Vec<(&str, &str)> = (0..16).map(|_| (h, "GET")).collect();
    assert_eq!(metered(&sixteen, None), ok(&["GET"]));
}

#[test]
fn query_spellings_are_read_as_every_framework_reads_them() {
    for (query, want) in [
        ("", ok(&["-"])),
        ("method=GET", ok(&["-"])),
        ("x_method=GET", ok(&["-"])),
        ("_methods=GET", ok(&["-"])),
        ("_method=GET", ok(&["GET"])),
        ("_method=get", ok(&["GET"])),
        ("a=1&_method=PUT", ok(&["PUT"])),
        ("a=1;_method=PUT", ok(&["PUT"])),
        // Express takes the first, PHP the last: meter both.
        ("_method=PUT&_method=GET", ok(&["GET", "PUT"])),
        // Percent-encoding and `+` in the name and the value (querystring, PHP, servlets).
        ("%5Fmethod=GET", ok(&["GET"])),
        ("%5fMETHOD=GET", ok(&["GET"])),
        ("_method=G%45T", ok(&["GET"])),
        ("_method=%47%45%54", ok(&["GET"])),
        ("_method=+GET+", ok(&["GET"])),
        ("_method=GET%2CPUT", ok(&["GET", "PUT"])),
        // Case of the name; PHP's ` `/`.` as `_`, leading spaces, arrays, NUL.
        ("_METHOD=GET", ok(&["GET"])),
        (".method=GET", ok(&["GET"])),
        ("%2Emethod=GET", ok(&["GET"])),
        ("+method=GET", ok(&["-"])),
        ("+_method=GET", ok(&["GET"])),
        ("++_method=GET", ok(&["GET"])),
        ("_method[]=GET", ok(&["GET"])),
        ("_method%00x=GET", ok(&["GET"])),
        // Carried but empty.
        ("_method", ok(&[])),
        ("_method=", ok(&[])),
        // Refused.
        ("_method=G%20ET", refused(RefusalReason::OverrideNotAMethod)),
        ("_method=GET%00", refused(RefusalReason::OverrideNotAMethod)),
        ("_method=%0AGET", refused(RefusalReason::OverrideNotAMethod)),
        // The Kelvin sign, which JavaScript lower-cases to `k`: not a token.
        (
            "_method=LOC%E2%84%AA",
            refused(RefusalReason::OverrideNotAMethod),
        ),
        ("_method=%FF", refused(RefusalReason::OverrideNotAMethod)),
        (
            "_method=CONNECT",
            refused(RefusalReason::OverrideNotAllowed),
        ),
        (
            "_method=PROPFIND",
            refused(RefusalReason::OverrideNotAllowed),
        ),
    ] {
        assert_eq!(metered(&[], Some(query)), want, "{query:?}");
    }
    let flood = "_method=GET&".repeat(17);
    assert_eq!(
        metered(&[], Some(&flood)),
        refused(RefusalReason::OverrideTooMany)
    );
    // Headers and parameters count together.
    assert_eq!(
        metered(&[("x-http-method-override", "PUT")], Some("_method=DELETE")),
        ok(&["PUT", "DELETE"])
    );
}

#[test]
fn strip_and_refuse_need_only_presence() {
    let h = [("x-http-method-override", "NOT A METHOD")];
    let strip = rules(OverrideMode::Strip);
    assert_eq!(judge(&strip, &h, None), Overrides::Strip);
    assert_eq!(judge(&strip, &[], Some("_method=x y")), Overrides::Strip);
    assert_eq!(judge(&strip, &[], Some("a=1")), Overrides::None);
    assert_eq!(
        strip.judge(
            h.iter().map(|(n, v)| (*n, v.as_bytes())),
            None,
            At::DecisionEndpoint
        ),
        Overrides::Refuse(Refusal::Unstrippable(Source::Header(
            "x-http-method-override".into()
        )))
    );
    let refuse = rules(OverrideMode::Refuse);
    assert_eq!(
        judge(&refuse, &[], Some("a=1&%5Fmethod=")),
        Overrides::Refuse(Refusal::Refused(Source::Param("_method".into())))
    );
    assert_eq!(
        judge(&refuse, &[("x-agent-id", "a")], None),
        Overrides::None
    );
}

#[test]
fn stripping_keeps_every_other_parameter_as_sent() {
    let r = rules(OverrideMode::Strip);
    for (query, want) in [
        ("a=1", None),
        ("", None),
        ("_method=GET", Some("")),
        ("a=1&_method=GET&b=%20", Some("a=1&b=%20")),
        ("_method=GET&a=1", Some("a=1")),
        ("a=1;%5Fmethod=GET;b=2", Some("a=1;b=2")),
        ("a=1&_method&_METHOD=x&.method=y", Some("a=1")),
        ("a=1&&b=2&_method=GET", Some("a=1&&b=2")),
    ] {
        assert_eq!(r.strip_query(query).as_deref(), want, "{query:?}");
    }
}

#[test]
fn allowed_methods_are_case_sensitive_and_listed_for_allow() {
    let r = rules(OverrideMode::Meter);
    for m in DEFAULT_ALLOWED {
        assert!(r.allows(m), "{m}");
    }
    for m in ["CONNECT", "TRACE", "PROPFIND", "get", "Post", "FOO", ""] {
        assert!(!r.allows(m), "{m}");
    }
    assert_eq!(r.allow(), "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");
}

#[test]
fn names_are_normalised_once_when_built() {
    let r = MethodRules::new(
        OverrideMode::Meter,
        &["X_Verb", "x-verb"],
        &["Do.It"],
        &["get", "GET", "propfind"],
    );
    assert!(r.is_override_header("x-verb"));
    assert!(r.is_override_header("x_verb"));
    assert!(!r.is_override_header("x-http-method-override"));
    assert_eq!(r.allow(), "GET, PROPFIND");
    assert_eq!(
        metered_with(&r, &[], Some("do_it=propfind")),
        vec!["PROPFIND"]
    );
    let none = MethodRules::new(
        OverrideMode::Refuse,
        &[] as &[&str],
        &[] as &[&str],
        &["GET"],
    );
    assert_eq!(
        judge(
            &none,
            &[("x-http-method-override", "GET")],
            Some("_method=GET")
        ),
        Overrides::None
    );
}

fn metered_with(r: &MethodRules, h: &[(&str, &str)], q: Option<&str>) -> Vec<String> {
    match judge(r, h, q) {
        Overrides::Meter(n) => n.methods(r).iter().map(|m| m.to_string()).collect(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn refusals_say_where_and_why() {
    let r = rules(OverrideMode::Meter);
    let d = Refusal::NotAllowed(Source::Param("_method".into()), "PROPFIND".into()).detail(&r);
    assert_eq!(
        d,
        "The `_method` query parameter names `PROPFIND`, which this gateway does not forward (it forwards GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS)."
    );
    let d = Refusal::NotAMethod(Source::Header("x-http-method".into())).detail(&r);
    assert!(
        d.starts_with("The `x-http-method` header does not name"),
        "{d}"
    );
}

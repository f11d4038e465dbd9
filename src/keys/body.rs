//! `body:<field>` keys, as pure functions: which bodies are read, a top-level field's value from
//! a JSON or form body, and the value normalised into the key.
//!
//! Every way a body can fail to name one clear value (a type other than JSON or form, an
//! encoding, bytes that do not parse as a whole, the field missing, sent twice, or not a string
//! or whole number, a value empty or too long) gives `None`: the limiter keys on the address,
//! as `user-or-ip` does without a user. A body is never refused for it; the upstream decides
//! what a malformed body means.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// The largest body read for body keys by default (`server.body_key_max_bytes`).
pub(crate) const DEFAULT_MAX_BYTES: usize = 16 * 1024;
/// The least and the most `server.body_key_max_bytes` may be.
pub(crate) const MIN_MAX_BYTES: usize = 64;
pub(crate) const MAX_MAX_BYTES: usize = 1024 * 1024;
/// The longest value (after trimming) that keys a bucket; a longer one keys on the address.
pub(crate) const MAX_VALUE_LEN: usize = 256;
/// The longest field name a `body:<field>` key may name.
pub(crate) const MAX_FIELD_LEN: usize = 64;
/// The deepest nesting of arrays and objects a JSON body may have to be read (the top-level
/// object is depth 1); a deeper one keys on the address.
pub(crate) const MAX_DEPTH: usize = 32;

/// A body the key can be read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `application/json`: the field is a member of the top-level object.
    Json,
    /// `application/x-www-form-urlencoded`: the field is a top-level name.
    Form,
}

/// Whether `name` can be a `body:<field>` key's field: 1–64 characters of `A-Za-z0-9_.-`
/// (matched exactly, case and all).
pub(crate) fn valid_field(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_FIELD_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The body's format from its `Content-Type` (the media type, any case, parameters such as
/// `charset=utf-8` ignored), or `None` for any other type, for no type, and for a body with a
/// `Content-Encoding` other than `identity` (a compressed body is not unpacked).
pub(crate) fn format_of(
    content_type: Option<&[u8]>,
    content_encoding: Option<&[u8]>,
) -> Option<Format> {
    if let Some(enc) = content_encoding {
        if !enc.trim_ascii().eq_ignore_ascii_case(b"identity") {
            return None;
        }
    }
    let ct = content_type?;
    let media = ct.split(|b| *b == b';').next()?.trim_ascii();
    if media.eq_ignore_ascii_case(b"application/json") {
        Some(Format::Json)
    } else if media.eq_ignore_ascii_case(b"application/x-www-form-urlencoded") {
        Some(Format::Form)
    } else {
        None
    }
}

/// The normalised value of each of `fields` in `body`, in order: `None` for a field the body
/// does not name exactly once as a string or whole number, and for every field when the body
/// does not parse as a whole.
pub(crate) fn values(format: Format, body: &[u8], fields: &[&str]) -> Vec<Option<String>> {
    let found = match format {
        Format::Json => json(body, fields),
        Format::Form => form(body, fields),
    };
    match found {
        Some(slots) => slots
            .into_iter()
            .map(|s| match s {
                Slot::Once(v) => normalize(&v),
                Slot::Missing | Slot::Unusable => None,
            })
            .collect(),
        None => vec![None; fields.len()],
    }
}

/// A value as its key: surrounding white space trimmed, Unicode lower case; an email address
/// (`local@domain`, one `@`, both parts non-empty) also loses a `+tag` on its local part and
/// trailing dots on its domain (`" Alice+promo@Example.COM. "` is `alice@example.com`), since
/// all of them reach one inbox. `None` when what is left is empty, longer than
/// [`MAX_VALUE_LEN`] bytes, or holds a control character.
pub(crate) fn normalize(raw: &str) -> Option<String> {
    let t = raw.trim();
    if t.is_empty() || t.len() > MAX_VALUE_LEN || t.chars().any(char::is_control) {
        return None;
    }
    let folded = t.to_lowercase();
    let Some((local, domain)) = folded.split_once('@') else {
        return Some(folded);
    };
    if local.is_empty() || domain.is_empty() || domain.contains('@') {
        return Some(folded);
    }
    let local = match local.split_once('+') {
        Some((base, _)) if !base.is_empty() => base,
        _ => local,
    };
    let domain = domain.trim_end_matches('.');
    if domain.is_empty() {
        return Some(folded);
    }
    Some(format!("{local}@{domain}"))
}

/// What a body says of one field.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Missing,
    Once(String),
    /// Sent twice, or not a string or whole number.
    Unusable,
}

impl Slot {
    fn saw(&mut self, v: Option<String>) {
        *self = match (std::mem::replace(self, Slot::Missing), v) {
            (Slot::Missing, Some(v)) => Slot::Once(v),
            _ => Slot::Unusable,
        };
    }
}

/// The top-level object's members named by `fields`; `None` when the body is not one JSON
/// object (another value, bad UTF-8 anywhere, nesting deeper than [`MAX_DEPTH`], trailing
/// bytes). Every value is parsed, not skipped, so the whole body is checked.
fn json(body: &[u8], fields: &[&str]) -> Option<Vec<Slot>> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let slots = Top { fields }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(slots)
}

struct Top<'f> {
    fields: &'f [&'f str],
}

impl<'de> DeserializeSeed<'de> for Top<'_> {
    type Value = Vec<Slot>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = Vec<Slot>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut slots = vec![Slot::Missing; self.fields.len()];
        while let Some(key) = map.next_key::<String>()? {
            match self.fields.iter().position(|f| *f == key) {
                Some(i) => {
                    let Scalar(v) = map.next_value_seed(Skip(2))?;
                    slots[i].saw(v);
                }
                None => {
                    map.next_value_seed(Skip(2))?;
                }
            }
        }
        Ok(slots)
    }
}

/// A value's text when it is a string or a whole number, else `None`; arrays and objects are
/// read through to the end, at most [`MAX_DEPTH`] deep (the depth of the value being read).
struct Scalar(Option<String>);

#[derive(Clone, Copy)]
struct Skip(usize);

impl<'de> DeserializeSeed<'de> for Skip {
    type Value = Scalar;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar(Some(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar(Some(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar(Some(v.to_string())))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar(Some(v.to_string())))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
        Ok(Scalar(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Scalar, E> {
        Ok(Scalar(None))
    }
    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        let inner = self.deeper::<A::Error>()?;
        while seq.next_element_seed(inner)?.is_some() {}
        Ok(Scalar(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        let inner = self.deeper::<A::Error>()?;
        while map.next_key::<String>()?.is_some() {
            map.next_value_seed(inner)?;
        }
        Ok(Scalar(None))
    }
}

/// The names of a form body that `fields` names; `None` when any name or value of the body is
/// badly encoded (a `%` not followed by two hex digits, or bytes that decode to something other
/// than UTF-8): a parser elsewhere may read such a body otherwise.
fn form(body: &[u8], fields: &[&str]) -> Option<Vec<Slot>> {
    let mut slots = vec![Slot::Missing; fields.len()];
    for pair in body.split(|b| *b == b'&') {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = match pair.iter().position(|b| *b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &[][..]),
        };
        let name = decode(name)?;
        let value = decode(value)?;
        if let Some(i) = fields.iter().position(|f| *f == name) {
            slots[i].saw(Some(value));
        }
    }
    Some(slots)
}

/// `application/x-www-form-urlencoded` decoding, strictly: `+` is a space, `%XX` a byte, and
/// the result UTF-8; anything else `None`.
fn decode(raw: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = hex(*raw.get(i + 1)?)?;
                let lo = hex(*raw.get(i + 2)?)?;
                out.push(hi << 4 | lo);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

impl Skip {
    /// The seed for the values inside this array or object (at depth `self.0`), or an error
    /// when it is deeper than [`MAX_DEPTH`].
    fn deeper<E: serde::de::Error>(self) -> Result<Skip, E> {
        if self.0 > MAX_DEPTH {
            return Err(E::custom("nested too deep"));
        }
        Ok(Skip(self.0 + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(format: Format, body: &[u8]) -> Option<String> {
        values(format, body, &["email"]).remove(0)
    }

    #[test]
    fn only_json_and_form_bodies_without_an_encoding_are_read() {
        let f = |ct: &str| format_of(Some(ct.as_bytes()), None);
        assert_eq!(f("application/json"), Some(Format::Json));
        assert_eq!(f("Application/JSON; charset=utf-8"), Some(Format::Json));
        assert_eq!(f("application/x-www-form-urlencoded"), Some(Format::Form));
        for other in [
            "text/plain",
            "application/json-patch+json",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "",
        ] {
            assert_eq!(f(other), None, "{other}");
        }
        assert_eq!(format_of(None, None), None);
        assert_eq!(
            format_of(Some(b"application/json"), Some(b"gzip")),
            None,
            "a compressed body is not unpacked"
        );
        assert_eq!(
            format_of(Some(b"application/json"), Some(b"identity")),
            Some(Format::Json)
        );
    }

    #[test]
    fn a_json_field_is_read_from_the_top_level_object_only() {
        let j = |b: &str| one(Format::Json, b.as_bytes());
        assert_eq!(j(r#"{"email":"a@x.io"}"#).as_deref(), Some("a@x.io"));
        assert_eq!(
            j(r#"{"password":"p","email":"A@X.io","nested":{"email":"b@y"}}"#).as_deref(),
            Some("a@x.io")
        );
        // Escapes in the name and the value read as any JSON parser reads them.
        assert_eq!(
            j(r#"{"em\u0061il":"a\u0040x.io"}"#).as_deref(),
            Some("a@x.io")
        );
        assert_eq!(j(r#"{"code":12345,"email":42}"#).as_deref(), Some("42"));
        // Hostile: duplicates, wrong types, not an object, broken, deep, trailing bytes.
        for hostile in [
            r#"{"email":"a@x.io","email":"b@x.io"}"#,
            r#"{"email":"a@x.io","email":"a@x.io"}"#,
            r#"{"email":["a@x.io"]}"#,
            r#"{"email":{"v":"a@x.io"}}"#,
            r#"{"email":null}"#,
            r#"{"email":true}"#,
            r#"{"email":1.5}"#,
            r#"{"email":""}"#,
            r#"{"email":"   "}"#,
            r#"{"other":"a@x.io"}"#,
            r#"{"Email":"a@x.io"}"#,
            r#"["a@x.io"]"#,
            r#""a@x.io""#,
            r#"{"email":"a@x.io""#,
            r#"{"email":"a@x.io"} {}"#,
            r#"{"email":"a@x.io"}x"#,
            "",
            "{}",
        ] {
            assert_eq!(j(hostile), None, "{hostile}");
        }
        let nest = |n: usize| {
            format!(
                r#"{{"email":"a@x.io","d":{}1{}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        assert_eq!(
            j(&nest(MAX_DEPTH - 1)).as_deref(),
            Some("a@x.io"),
            "as deep as allowed"
        );
        assert_eq!(j(&nest(MAX_DEPTH)), None, "one deeper");
        assert_eq!(j(&nest(100_000)), None, "far deeper");
        let objects = format!(
            r#"{{"email":"a@x.io","d":{}1{}}}"#,
            r#"{"a":"#.repeat(40),
            "}".repeat(40)
        );
        assert_eq!(j(&objects), None, "objects count as arrays do");
        let mut bad_utf8 = br#"{"email":"a@x.io","n":""#.to_vec();
        bad_utf8.extend_from_slice(&[0xff, 0xfe]);
        bad_utf8.extend_from_slice(br#""}"#);
        assert_eq!(one(Format::Json, &bad_utf8), None, "bad UTF-8 anywhere");
        assert_eq!(
            one(Format::Json, b"\xef\xbb\xbf{\"email\":\"a@x.io\"}"),
            None,
            "a byte-order mark is not JSON"
        );
        let long = format!(r#"{{"email":"{}@x.io"}}"#, "a".repeat(300));
        assert_eq!(j(&long), None, "too long to key");
        assert_eq!(
            j("{\"email\":\"a\\u0000@x.io\"}"),
            None,
            "a control character"
        );
    }

    #[test]
    fn a_form_field_is_decoded_strictly() {
        let f = |b: &str| one(Format::Form, b.as_bytes());
        assert_eq!(f("email=a%40x.io&password=p").as_deref(), Some("a@x.io"));
        assert_eq!(f("x=1&email=+A%40X.io+").as_deref(), Some("a@x.io"));
        assert_eq!(f("em%61il=a@x.io").as_deref(), Some("a@x.io"));
        assert_eq!(f("&&email=a@x.io&").as_deref(), Some("a@x.io"));
        for hostile in [
            "email=a@x.io&email=b@x.io",
            "email=a@x.io&email",
            "email=%zz@x.io",
            "email=a%4@x.io",
            "email=a%",
            "email=a@x.io&other=%ff%fe",
            "email=%C3%28",
            "email=",
            "email",
            "other=a@x.io",
            "",
        ] {
            assert_eq!(f(hostile), None, "{hostile}");
        }
        assert_eq!(
            one(Format::Form, b"email=a@x.io&n=\xff"),
            None,
            "raw bytes that are not UTF-8"
        );
    }

    #[test]
    fn several_fields_at_once_each_on_its_own() {
        let v = values(
            Format::Json,
            br#"{"email":"a@x.io","code_id":"c-1","user":["x"]}"#,
            &["email", "code_id", "user", "none"],
        );
        assert_eq!(
            v,
            [
                Some("a@x.io".to_owned()),
                Some("c-1".to_owned()),
                None,
                None
            ]
        );
    }

    #[test]
    fn values_are_trimmed_and_folded_and_addresses_reach_their_inbox() {
        for (raw, key) in [
            (" Alice@Example.COM ", "alice@example.com"),
            ("alice+promo@example.com", "alice@example.com"),
            ("alice@example.com.", "alice@example.com"),
            ("\tBob\n", "bob"),
            ("ÉLODIE@exemple.fr", "élodie@exemple.fr"),
            ("+tag@example.com", "+tag@example.com"),
            ("a@b@c", "a@b@c"),
            ("@example.com", "@example.com"),
            ("user@", "user@"),
            ("Code-7F", "code-7f"),
        ] {
            assert_eq!(normalize(raw).as_deref(), Some(key), "{raw:?}");
        }
        for none in ["", "  ", "a\u{0}b", "a\u{7f}", &"x".repeat(257)] {
            assert_eq!(normalize(none), None, "{none:?}");
        }
        assert_eq!(normalize(&"x".repeat(256)).map(|s| s.len()), Some(256));
    }

    #[test]
    fn field_names() {
        assert!(valid_field("email") && valid_field("codeId") && valid_field("user.name"));
        for bad in ["", "a b", "é", "a/b", &"x".repeat(65)] {
            assert!(!valid_field(bad), "{bad}");
        }
    }
}

//! `body:<field>` keys, as pure functions: which bodies are read, a top-level field's value from
//! a JSON or form body, and the value normalised into the key.
//!
//! A `body:` limiter decides on exactly what the upstream will read, or the request is refused:
//! every body it cannot read with certainty (a type other than JSON or a form, a charset other
//! than UTF-8, a `Content-Encoding`, bytes that do not parse as a whole, nesting past
//! [`MAX_DEPTH`], the field in a shape a parser may read otherwise, a value that is not one
//! recipient) is an [`Unreadable`], answered with a 4xx that names the reason. It never falls
//! back to the address: a client could then choose the bodies the limiter does not read and
//! reach a target without its ceiling. A field the body does not name at all is certain: the
//! upstream reads no target there either, and the limiter keys on the address.

use icu_normalizer::ComposingNormalizerBorrowed;
use icu_properties::props::GeneralCategory;
use icu_properties::CodePointMapData;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::cell::Cell;
use std::fmt;

/// The largest body read for body keys by default (`server.body_key_max_bytes`).
pub(crate) const DEFAULT_MAX_BYTES: usize = 16 * 1024;
/// The least and the most `server.body_key_max_bytes` may be.
pub(crate) const MIN_MAX_BYTES: usize = 64;
pub(crate) const MAX_MAX_BYTES: usize = 1024 * 1024;
/// The longest value (after normalising) that keys a bucket; a longer one is refused.
pub(crate) const MAX_VALUE_LEN: usize = 256;
/// The longest field name a `body:<field>` key may name.
pub(crate) const MAX_FIELD_LEN: usize = 64;
/// The deepest nesting of arrays and objects a JSON body may have to be read (the top-level
/// object is depth 1); a deeper one is refused.
pub(crate) const MAX_DEPTH: usize = 32;

/// A body field a `body:<field>` limiter reads, and its normalised value ([`normalize`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BodyValue {
    pub(crate) field: std::sync::Arc<str>,
    pub(crate) value: String,
}

/// A body the key can be read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `application/json`: the field is a member of the top-level object.
    Json,
    /// `application/x-www-form-urlencoded`: the field is a top-level name.
    Form,
}

/// Why a body on a route a `body:` limiter meters cannot be read with certainty. The request is
/// refused with [`Unreadable::status`] and a detail naming the reason; no limiter is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unreadable {
    /// A body whose `Content-Type` is neither JSON nor a form, or that has none (415).
    MediaType,
    /// A `charset` other than UTF-8 (415).
    Charset,
    /// A `Content-Encoding` other than `identity` (415): a compressed body is not unpacked.
    Encoding,
    /// Declared or found larger than `server.body_key_max_bytes` (413).
    TooLarge,
    /// Not one JSON object, or a form badly escaped; bytes that are not UTF-8 (400).
    Malformed,
    /// Arrays and objects nested deeper than [`MAX_DEPTH`] (400).
    TooDeep,
    /// The field in a shape parsers read differently: not a string or whole number (an array,
    /// an object, `null`, a boolean, a fraction), a form field sent twice, or a form name a
    /// parser folds into the field (`email[]`, `email[0]`) (400).
    Ambiguous,
    /// The value is not one usable key: empty, longer than [`MAX_VALUE_LEN`], a control
    /// character, or an address that is a list or that mailers read differently (400).
    Value,
    /// Still arriving after the body's pace rules (408).
    TooSlow,
    /// Broken off by the client (400).
    Broken,
}

impl Unreadable {
    /// Every reason, for metrics and tests.
    pub(crate) const ALL: [Unreadable; 10] = [
        Unreadable::MediaType,
        Unreadable::Charset,
        Unreadable::Encoding,
        Unreadable::TooLarge,
        Unreadable::Malformed,
        Unreadable::TooDeep,
        Unreadable::Ambiguous,
        Unreadable::Value,
        Unreadable::TooSlow,
        Unreadable::Broken,
    ];

    /// The metric label, log field and the last part of the problem type.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unreadable::MediaType => "media-type",
            Unreadable::Charset => "charset",
            Unreadable::Encoding => "encoding",
            Unreadable::TooLarge => "too-large",
            Unreadable::Malformed => "malformed",
            Unreadable::TooDeep => "too-deep",
            Unreadable::Ambiguous => "ambiguous",
            Unreadable::Value => "value",
            Unreadable::TooSlow => "too-slow",
            Unreadable::Broken => "broken",
        }
    }

    /// The HTTP status the refusal carries.
    pub(crate) fn status(self) -> u16 {
        match self {
            Unreadable::MediaType | Unreadable::Charset | Unreadable::Encoding => 415,
            Unreadable::TooLarge => 413,
            Unreadable::TooSlow => 408,
            Unreadable::Malformed
            | Unreadable::TooDeep
            | Unreadable::Ambiguous
            | Unreadable::Value
            | Unreadable::Broken => 400,
        }
    }

    /// What the client is told: the reason, and what a body this route reads looks like.
    /// `field` is the operator's field name (never a value the client sent).
    pub(crate) fn detail(self, field: &str, max_bytes: usize) -> String {
        let why = match self {
            Unreadable::MediaType => "has no Content-Type, or one other than application/json or application/x-www-form-urlencoded".to_owned(),
            Unreadable::Charset => "declares a charset other than UTF-8".to_owned(),
            Unreadable::Encoding => "has a Content-Encoding (a compressed body is not read here)".to_owned(),
            Unreadable::TooLarge => format!("is larger than {max_bytes} bytes (server.body_key_max_bytes)"),
            Unreadable::Malformed => "is not one JSON object, or a form escaped correctly, in UTF-8".to_owned(),
            Unreadable::TooDeep => format!("nests arrays or objects more than {MAX_DEPTH} deep"),
            Unreadable::Ambiguous => format!("sends `{field}` as something other than one string or whole number (an array, an object, null, a boolean, a fraction, a repeated or bracketed form field)"),
            Unreadable::Value => format!("sends a `{field}` that is empty, longer than {MAX_VALUE_LEN} bytes, holds a control character, or is a list or an address mailers read differently"),
            Unreadable::TooSlow => "arrived too slowly".to_owned(),
            Unreadable::Broken => "was broken off".to_owned(),
        };
        format!("The request body {why}. This route reads `{field}` from the body to meter it, and refuses a body it cannot read with certainty rather than guess what the server behind it reads. Send one JSON object or form in UTF-8, with `{field}` once as a string.")
    }
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

/// The body's format from its `Content-Type` (the media type, any case; a `charset` parameter,
/// when given, must be UTF-8) and `Content-Encoding` (absent, or `identity`). Header values
/// sent twice arrive here as empty (see `only_value`) and are refused as any unknown value is.
pub(crate) fn format_of(
    content_type: Option<&[u8]>,
    content_encoding: Option<&[u8]>,
) -> Result<Format, Unreadable> {
    if let Some(enc) = content_encoding {
        if !enc.trim_ascii().eq_ignore_ascii_case(b"identity") {
            return Err(Unreadable::Encoding);
        }
    }
    let ct = content_type.ok_or(Unreadable::MediaType)?;
    let mut parts = ct.split(|b| *b == b';');
    let media = parts.next().unwrap_or_default().trim_ascii();
    let format = if media.eq_ignore_ascii_case(b"application/json") {
        Format::Json
    } else if media.eq_ignore_ascii_case(b"application/x-www-form-urlencoded") {
        Format::Form
    } else {
        return Err(Unreadable::MediaType);
    };
    for param in parts {
        let Some(eq) = param.iter().position(|b| *b == b'=') else {
            continue;
        };
        let (name, value) = (param[..eq].trim_ascii(), param[eq + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"charset") {
            let value = value
                .strip_prefix(b"\"")
                .and_then(|v| v.strip_suffix(b"\""))
                .unwrap_or(value);
            if !(value.eq_ignore_ascii_case(b"utf-8") || value.eq_ignore_ascii_case(b"utf8")) {
                return Err(Unreadable::Charset);
            }
        }
    }
    Ok(format)
}

/// The normalised value of each of `fields` in `body`, in order: `None` for a field the body
/// does not name; an [`Unreadable`] when the body, or any of the fields, cannot be read with
/// certainty. A UTF-8 byte-order mark at the start is skipped, as Node's body parsers do.
pub(crate) fn values(
    format: Format,
    body: &[u8],
    fields: &[&str],
) -> Result<Vec<Option<String>>, Unreadable> {
    let body = body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body);
    let found = match format {
        Format::Json => json(body, fields)?,
        Format::Form => form(body, fields)?,
    };
    found
        .into_iter()
        .map(|s| match s {
            Slot::Missing => Ok(None),
            Slot::Value(v) => normalize(&v).map(Some).ok_or(Unreadable::Value),
            Slot::Unusable => Err(Unreadable::Ambiguous),
        })
        .collect()
}

/// A value as its key, so that every spelling that reaches one target is one bucket:
///
/// - format characters (Unicode category Cf: zero-width spaces and joiners, direction marks,
///   soft hyphens, a byte-order mark) removed, then Unicode NFKC (fullwidth `＠` and letters,
///   ligatures and other compatibility forms become their plain form), surrounding white space
///   trimmed, lower case;
/// - a value with an `@` is an email address: a quoted local part is unquoted
///   (`"victim"@example.com`), a `+tag` dropped, the domain's trailing dots dropped and the
///   domain in its IDNA ASCII form (`bücher.example` and `xn--bcher-kva.example` are one);
///   then a provider's own rule from [`MAIL_PROVIDERS`] (Gmail ignores dots in the local part,
///   and `googlemail.com` is `gmail.com`).
///
/// `None` (the request is refused) when what is left is empty, longer than [`MAX_VALUE_LEN`]
/// bytes, or holds a control character; and for an address that is a list or a display form
/// (`,` `;` `<` `>`, white space, a second `@`), has an empty local part or domain, or a domain
/// that is not a valid name.
pub(crate) fn normalize(raw: &str) -> Option<String> {
    if raw.len() > MAX_VALUE_LEN * 4 {
        return None;
    }
    let t = fold(raw);
    let t = t.trim();
    if t.is_empty() || t.len() > MAX_VALUE_LEN || t.chars().any(char::is_control) {
        return None;
    }
    if !t.contains('@') {
        return Some(t.to_owned());
    }
    let key = address(t)?;
    (key.len() <= MAX_VALUE_LEN).then_some(key)
}

/// Format characters removed, NFKC, lower case, and NFKC again (lower-casing can leave a form
/// NFKC composes).
fn fold(raw: &str) -> String {
    let categories = CodePointMapData::<GeneralCategory>::new();
    let visible: String = raw
        .chars()
        .filter(|c| categories.get(*c) != GeneralCategory::Format)
        .collect();
    let nfkc = ComposingNormalizerBorrowed::new_nfkc();
    let lower = nfkc.normalize(&visible).to_lowercase();
    nfkc.normalize(&lower).into_owned()
}

/// Characters that make an address a list, a display form or a comment in some mailer.
fn separates(c: char) -> bool {
    c.is_whitespace()
        || matches!(
            c,
            ',' | ';' | '<' | '>' | '(' | ')' | ':' | '"' | '\\' | '[' | ']'
        )
}

/// An address (already folded) as its inbox's key; `None` when it is not exactly one.
fn address(v: &str) -> Option<String> {
    let (local, domain) = match v.strip_prefix('"') {
        Some(rest) => {
            let mut local = String::new();
            let mut chars = rest.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => local.push(chars.next()?.1),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => local.push(c),
                }
            }
            let domain = rest.get(end?..)?.strip_prefix('@')?;
            (local, domain)
        }
        None => {
            let (l, d) = v.split_once('@')?;
            (l.to_owned(), d)
        }
    };
    if local.is_empty() || local.contains('@') || local.chars().any(separates) {
        return None;
    }
    let local = match local.split_once('+') {
        Some((base, _)) if !base.is_empty() => base,
        _ => local.as_str(),
    };
    let domain = domain.trim_end_matches('.');
    if domain.is_empty() || domain.contains('@') || domain.chars().any(separates) {
        return None;
    }
    let domain = idna::domain_to_ascii(domain).ok()?;
    if domain.is_empty()
        || !domain
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return None;
    }
    if let Some(p) = MAIL_PROVIDERS.iter().find(|p| p.domain == domain) {
        let local: String = if p.dots_ignored {
            local.chars().filter(|&c| c != '.').collect()
        } else {
            local.to_owned()
        };
        if local.is_empty() {
            return None;
        }
        return Some(format!("{local}@{}", p.inbox_domain));
    }
    Some(format!("{local}@{domain}"))
}

/// A mail provider's own rule for which spellings reach one inbox, beyond the rules every
/// address gets (case, a `+tag`, the domain's trailing dots and IDNA form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MailProvider {
    /// The domain as an address spells it (lower case, ASCII).
    pub(crate) domain: &'static str,
    /// The domain of the inbox it delivers to: its key's domain.
    pub(crate) inbox_domain: &'static str,
    /// Dots in the local part are not part of the inbox's name (`v.i.c.t.i.m` is `victim`).
    pub(crate) dots_ignored: bool,
}

/// The built-in mail-provider rules, one row a domain (docs/configuration.md shows this table).
pub(crate) const MAIL_PROVIDERS: &[MailProvider] = &[
    MailProvider {
        domain: "gmail.com",
        inbox_domain: "gmail.com",
        dots_ignored: true,
    },
    MailProvider {
        domain: "googlemail.com",
        inbox_domain: "gmail.com",
        dots_ignored: true,
    },
];

/// What a body says of one field.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Missing,
    Value(String),
    /// Not a string or whole number; or a form field repeated or bracketed.
    Unusable,
}

/// The top-level object's members named by `fields`, the last of duplicates winning as in
/// `JSON.parse` (and Python's, Go's and serde's own maps). Every value is parsed, not skipped,
/// so the whole body is checked.
fn json(body: &[u8], fields: &[&str]) -> Result<Vec<Slot>, Unreadable> {
    let deep = Cell::new(false);
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = Top {
        fields,
        deep: &deep,
    }
    .deserialize(&mut de)
    .and_then(|slots| de.end().map(|()| slots));
    match parsed {
        Ok(slots) => Ok(slots),
        Err(_) if deep.get() => Err(Unreadable::TooDeep),
        Err(_) => Err(Unreadable::Malformed),
    }
}

struct Top<'f> {
    fields: &'f [&'f str],
    deep: &'f Cell<bool>,
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
        let seed = Skip {
            depth: 2,
            deep: self.deep,
        };
        while let Some(key) = map.next_key::<String>()? {
            let Scalar(v) = map.next_value_seed(seed)?;
            if let Some(i) = self.fields.iter().position(|f| *f == key) {
                slots[i] = match v {
                    Some(v) => Slot::Value(v),
                    None => Slot::Unusable,
                };
            }
        }
        Ok(slots)
    }
}

/// A value's text when it is a string or a whole number, else `None`; arrays and objects are
/// read through to the end, at most [`MAX_DEPTH`] deep (the depth of the value being read).
struct Scalar(Option<String>);

#[derive(Clone, Copy)]
struct Skip<'f> {
    depth: usize,
    deep: &'f Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for Skip<'_> {
    type Value = Scalar;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Skip<'_> {
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

impl Skip<'_> {
    /// The seed for the values inside this array or object (at depth `self.depth`), or an
    /// error when it is deeper than [`MAX_DEPTH`].
    fn deeper<E: serde::de::Error>(self) -> Result<Self, E> {
        if self.depth > MAX_DEPTH {
            self.deep.set(true);
            return Err(E::custom("nested too deep"));
        }
        Ok(Skip {
            depth: self.depth + 1,
            deep: self.deep,
        })
    }
}

/// The names of a form body that `fields` names. Node's `querystring` and `qs` (Express's
/// `urlencoded()`), PHP and Rack read a repeated name, or a name with brackets after it
/// (`email[]=`, `email[0]=`), as a list or the last value: either is refused. A `%` not
/// followed by two hex digits, or bytes that decode to something other than UTF-8, anywhere in
/// the body, make it [`Unreadable::Malformed`]: parsers elsewhere may read such a body
/// otherwise.
fn form(body: &[u8], fields: &[&str]) -> Result<Vec<Slot>, Unreadable> {
    let mut slots = vec![Slot::Missing; fields.len()];
    for pair in body.split(|b| *b == b'&') {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = match pair.iter().position(|b| *b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &[][..]),
        };
        let name = decode(name).ok_or(Unreadable::Malformed)?;
        let value = decode(value).ok_or(Unreadable::Malformed)?;
        for (i, field) in fields.iter().enumerate() {
            if name == *field {
                slots[i] = match slots[i] {
                    Slot::Missing => Slot::Value(value.clone()),
                    _ => Slot::Unusable,
                };
            } else if name
                .strip_prefix(*field)
                .is_some_and(|rest| rest.starts_with('['))
            {
                slots[i] = Slot::Unusable;
            }
        }
    }
    Ok(slots)
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

#[cfg(test)]
mod tests;

//! The HS256 shared secret: never printed (`Debug` shows its length), and judged for weakness
//! (placeholders, patterns, too little randomness) before it may sign anything.

use std::collections::HashMap;
use std::fmt;

/// The shortest HS256 secret accepted without `allow_weak_secret`: 256 bits, the size of the MAC.
pub(crate) const MIN_SECRET_BYTES: usize = 32;

/// Secrets that ship in samples, tutorials and `.env.example` files: anyone can sign with them.
const PLACEHOLDER_SECRETS: &[&str] = &[
    "secret",
    "changeme",
    "change-me",
    "change_me",
    "changethis",
    "change-this-secret",
    "your-256-bit-secret",
    "your-secret-key",
    "your_secret_key",
    "your-jwt-secret",
    "jwt-secret",
    "jwt_secret",
    "jwtsecret",
    "supersecret",
    "super-secret",
    "mysecret",
    "my-secret",
    "secretkey",
    "secret-key",
    "password",
    "placeholder",
    "development",
    "dev-secret",
    "test-secret",
    "testsecret",
    "example",
    "default",
    "replace-me",
    "replaceme",
    "xxx",
];

/// A value that must not reach a log line: `Debug` prints only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// Words that make up placeholder secrets (`my-super-secret-jwt-key`, `changeme-in-production`):
/// a secret made mostly of them is guessable, however long.
const PLACEHOLDER_WORDS: &[&str] = &[
    "your-256-bit-secret",
    "qwertyuiop",
    "asdfghjkl",
    "zxcvbnm",
    "development",
    "production",
    "placeholder",
    "localhost",
    "changeme",
    "changethis",
    "password",
    "insecure",
    "example",
    "default",
    "replace",
    "staging",
    "letmein",
    "signing",
    "session",
    "secrets",
    "testing",
    "sample",
    "secret",
    "change",
    "passwd",
    "random",
    "string",
    "tokens",
    "admin",
    "hs256",
    "value",
    "token",
    "super",
    "local",
    "your",
    "demo",
    "test",
    "pass",
    "this",
    "with",
    "long",
    "very",
    "keys",
    "bits",
    "here",
    "sign",
    "auth",
    "jwt",
    "key",
    "bit",
    "dev",
    "prod",
    "app",
    "api",
    "for",
    "and",
    "not",
    "use",
    "the",
    "our",
    "xxx",
    "abc",
    "256",
    "me",
    "my",
];

/// Fewer characters than this outside placeholder words, and the secret is made of them.
const MIN_OWN_CHARS: usize = 16;
/// Fewer distinct characters than this is too small an alphabet to be random.
const MIN_DISTINCT_CHARS: usize = 8;
/// Less estimated randomness than this (Shannon entropy of the characters, times the length).
const MIN_ESTIMATED_BITS: f64 = 80.0;

/// Why a shared secret is unfit to sign tokens, or `None` when it is fit.
///
/// Surrounding whitespace does not count. Refused: blank; a well-known placeholder; one
/// character repeated; shorter
/// than 32 bytes; a run of consecutive characters (`1234567890…`, `abcdef…`); a short pattern
/// repeated (`changemechangeme…`); mostly placeholder words (`your-256-bit-secret-your-…`);
/// fewer than 8 distinct characters; too little randomness for its length. A random secret of
/// 32 bytes or more, hex or base64, passes.
pub(crate) fn weakness(secret: &str) -> Option<&'static str> {
    let trimmed = secret.trim();
    if trimmed.is_empty() {
        return Some("it is blank");
    }
    let lower = trimmed.to_ascii_lowercase();
    let first = lower.chars().next();
    if PLACEHOLDER_SECRETS.contains(&lower.as_str()) {
        return Some("it is a well-known placeholder, so anyone can sign tokens with it");
    }
    if lower.chars().all(|c| Some(c) == first) {
        return Some("it is one character repeated, so anyone can guess it");
    }
    if trimmed.len() < MIN_SECRET_BYTES {
        return Some("it is shorter than 32 bytes");
    }
    let chars: Vec<char> = lower.chars().collect();
    if consecutive(&chars) {
        return Some(
            "it is a run of consecutive characters (like 1234567890 or abcdef), so it is guessable",
        );
    }
    if repeated(&chars) {
        return Some("it repeats a short pattern, so it holds no more randomness than the pattern");
    }
    if own_chars(&lower) < MIN_OWN_CHARS {
        return Some("it is made of well-known placeholder words (secret, changeme, your-256-bit-secret, ...), so it is guessable");
    }
    let mut distinct = chars.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < MIN_DISTINCT_CHARS {
        return Some("it uses too few distinct characters to be random");
    }
    if estimated_bits(&chars) < MIN_ESTIMATED_BITS {
        return Some("it holds too little randomness for its length");
    }
    None
}

/// Most steps between neighbours go up by one (or most go down by one): `0123456789012…`,
/// `abcdef…`, `987654…`.
fn consecutive(chars: &[char]) -> bool {
    let step = |a: char, b: char| -> i64 {
        match (a.to_digit(10), b.to_digit(10)) {
            // Digits wrap: 9 then 0 is a step up.
            (Some(x), Some(y)) if (x + 1) % 10 == y => 1,
            (Some(x), Some(y)) if (y + 1) % 10 == x => -1,
            _ => b as i64 - a as i64,
        }
    };
    let steps = chars.len().saturating_sub(1);
    let up = chars.windows(2).filter(|w| step(w[0], w[1]) == 1).count();
    let down = chars.windows(2).filter(|w| step(w[0], w[1]) == -1).count();
    steps > 0 && (up * 10 >= steps * 6 || down * 10 >= steps * 6)
}

/// The whole secret is a pattern of at most half its length, repeated.
fn repeated(chars: &[char]) -> bool {
    (1..=chars.len() / 2).any(|p| (p..chars.len()).all(|i| chars[i] == chars[i - p]))
}

/// How many characters are left once placeholder words and separators are taken out.
fn own_chars(lower: &str) -> usize {
    let mut rest = lower.to_owned();
    for w in PLACEHOLDER_WORDS {
        rest = rest.replace(w, " ");
    }
    rest.chars()
        .filter(|c| !(c.is_whitespace() || matches!(c, '-' | '_' | '.')))
        .count()
}

/// Shannon entropy of the character frequencies, times the length: an upper bound on the
/// randomness a secret with this character make-up can hold.
fn estimated_bits(chars: &[char]) -> f64 {
    let mut counts: HashMap<char, usize> = HashMap::new();
    for c in chars {
        *counts.entry(*c).or_default() += 1;
    }
    let n = chars.len() as f64;
    let per_char: f64 = counts
        .values()
        .map(|&k| {
            let p = k as f64 / n;
            -p * p.log2()
        })
        .sum();
    per_char * n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_secrets_are_named() {
        assert_eq!(weakness(""), Some("it is blank"));
        assert_eq!(weakness("   "), Some("it is blank"));
        assert!(weakness("changeme").unwrap().contains("placeholder"));
        assert!(weakness("Your-256-Bit-Secret")
            .unwrap()
            .contains("placeholder"));
        assert_eq!(
            weakness(&"a".repeat(64)),
            Some("it is one character repeated, so anyone can guess it")
        );
        assert_eq!(
            weakness("0123456789abcdef0123456789abcde"),
            Some("it is shorter than 32 bytes")
        );
        assert_eq!(
            weakness("0f3a9c1e7b2d4a6c8e0b1d3f5a7c9e2b"),
            None,
            "32 random hex characters"
        );
    }

    #[test]
    fn guessable_secrets_of_any_length_are_named() {
        for (secret, why) in [
            (
                "changemechangemechangemechangeme",
                "repeats a short pattern",
            ),
            (
                "abababababababababababababababab",
                "repeats a short pattern",
            ),
            (
                "Passw0rd!Passw0rd!Passw0rd!Passw0rd!",
                "repeats a short pattern",
            ),
            ("0123456789abcdef0123456789abcdef", "consecutive characters"),
            (
                "your-256-bit-secret-your-256-bit-secret",
                "placeholder words",
            ),
            (
                "my-super-secret-jwt-key-for-production",
                "placeholder words",
            ),
            ("changeme1changeme2changeme3changeme4", "placeholder words"),
            ("qwertyuiopasdfghjklzxcvbnm123456", "placeholder words"),
            ("12345678901234567890123456789012", "consecutive characters"),
            (
                "abcdefghijklmnopqrstuvwxyz0123456789",
                "consecutive characters",
            ),
            ("98765432109876543210987654321098", "consecutive characters"),
            ("secret                              ", "placeholder"),
            (
                "hello                               ",
                "shorter than 32 bytes",
            ),
            ("aaaabbbbaaaabbbbccccaaaabbbbccccaaaabbbb", "few distinct"),
            (
                "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab1c2d3e4f5g",
                "too little randomness",
            ),
        ] {
            let got = weakness(secret).unwrap_or_else(|| panic!("{secret:?} must be weak"));
            assert!(got.contains(why), "{secret:?}: {got}");
        }
    }

    #[test]
    fn random_secrets_pass() {
        use base64::Engine;
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5ec7e7);
        let engines = [
            &base64::engine::general_purpose::STANDARD,
            &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        ];
        for _ in 0..3000 {
            let mut bytes = [0u8; 48];
            rng.fill(&mut bytes[..]);
            let candidates = [
                hex::encode(&bytes[..16]),       // 32 hex characters
                hex::encode(&bytes[..32]),       // 64 hex characters
                engines[1].encode(&bytes[..32]), // 43 base64url characters
                engines[0].encode(&bytes[..24]), // 32 base64 characters
                engines[0].encode(&bytes[..48]), // `openssl rand -base64 48`
                (0..40)
                    .map(|_| char::from(b'0' + rng.gen_range(0..10u8)))
                    .collect(),
            ];
            for c in &candidates {
                assert_eq!(weakness(c), None, "{c}");
            }
        }
    }

    #[test]
    fn secret_debug_hides_the_value() {
        let s = Secret::new("hunter2-hunter2");
        assert_eq!(format!("{s:?}"), "Secret(15 bytes)");
    }
}

//! Validated cache keys.

use crate::error::{Error, Result};

/// The name of one cache entry: exactly 64 lowercase hex characters (a SHA-256 the compiler
/// crate computes as an `ExecutableKey`). Validation is what keeps object names inside the
/// cache root: no separators, no dots, no NUL. It serializes as that text and deserializes only
/// through the same validation.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(into = "String", try_from = "String")]
pub struct EntryKey(String);

impl From<EntryKey> for String {
    fn from(k: EntryKey) -> String {
        k.0
    }
}

impl TryFrom<String> for EntryKey {
    type Error = Error;

    fn try_from(s: String) -> Result<EntryKey> {
        EntryKey::parse(&s)
    }
}

impl EntryKey {
    /// Validates `s`; anything but 64 lowercase hex characters is an error.
    pub fn parse(s: &str) -> Result<EntryKey> {
        if s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(EntryKey(s.to_string()))
        } else {
            let shown: String = s.chars().take(80).collect();
            Err(Error::InvalidKey { key: shown })
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 characters, as tables and logs show a key.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }

    /// Two-character shard directory, so no directory holds every entry.
    pub(crate) fn shard(&self) -> &str {
        &self.0[..2]
    }
}

impl std::fmt::Display for EntryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The old name of [`EntryKey`] (until 0.2).
#[deprecated(since = "0.1.1", note = "renamed `EntryKey`")]
pub type CacheKey = EntryKey;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_64_lowercase_hex_is_a_key() {
        let good = "0123456789abcdef".repeat(4);
        assert_eq!(EntryKey::parse(&good).unwrap().as_str(), good);
        for bad in [
            String::new(),
            good[..63].to_string(),
            format!("{good}0"),
            good.to_uppercase(),
            format!("../{}", &good[3..]),
            format!("{}/x", &good[..62]),
            format!("{}\0", &good[..63]),
            "g".repeat(64),
            "é".repeat(32),
            "a".repeat(1 << 20),
        ] {
            assert!(EntryKey::parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn random_strings_never_pass_unless_they_are_hex() {
        // A seeded generator over a byte alphabet that includes separators and NUL.
        let alphabet = b"0123456789abcdefABCDEF./\\\0 -_g";
        let mut s: u64 = 0x1234_5678;
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let len = (s % 70) as usize;
            let text: String = (0..len)
                .map(|i| alphabet[((s >> (i % 50)) as usize + i) % alphabet.len()] as char)
                .collect();
            let ok = EntryKey::parse(&text).is_ok();
            let expect = text.len() == 64
                && text
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
            assert_eq!(ok, expect, "{text:?}");
        }
    }
}

//! The JSON records stored beside executables: what an entry holds (the commit point of every
//! entry) and what a failed compilation said.

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::key::EntryKey;

/// Version of the entry layout and record format; entries of another version are misses.
pub const ENTRY_FORMAT_VERSION: u32 = 1;

/// Records are small; anything larger is not ours.
pub(crate) const MAX_RECORD_BYTES: usize = 1 << 20;

/// The record of one entry (`<key>.json`), written after the executable and program text.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EntryRecord {
    /// Layout version ([`ENTRY_FORMAT_VERSION`]).
    pub format_version: u32,
    /// The key this record belongs to.
    pub key: String,
    /// The compiler's named key components (digests, flags, compiler identity): what makes
    /// this key differ from another.
    pub key_inputs: BTreeMap<String, String>,
    /// Bytes of the executable.
    pub executable_size: u64,
    /// SHA-256 of the executable (hex).
    pub executable_sha256: String,
    /// Bytes of the program text.
    pub program_size: u64,
    /// Compile time in milliseconds.
    pub compile_ms: f64,
    /// The neuron-pc version that wrote the entry.
    pub tool_version: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    /// HMAC-SHA256 (hex) over the key and the executable digest, when written with a
    /// signing key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// A failed compilation (`failures/<key>.json`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FailureRecord {
    /// Layout version ([`ENTRY_FORMAT_VERSION`]).
    pub format_version: u32,
    /// The key whose compilation failed.
    pub key: String,
    /// The compiler's message.
    pub message: String,
    /// The compiler that failed; a record from another compiler does not block this one.
    pub compiler_version: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// HMAC-SHA256 over the key and the executable's digest.
pub(crate) fn sign(signing_key: &[u8], key: &EntryKey, exe_sha256: &str) -> String {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(signing_key).expect("HMAC takes keys of any length");
    mac.update(key.as_str().as_bytes());
    mac.update(b"\n");
    mac.update(exe_sha256.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn verify_signature(signing_key: &[u8], key: &EntryKey, exe_sha256: &str, signature: &str) -> bool {
    let Ok(sig) = hex::decode(signature) else {
        return false;
    };
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(signing_key).expect("HMAC takes keys of any length");
    mac.update(key.as_str().as_bytes());
    mac.update(b"\n");
    mac.update(exe_sha256.as_bytes());
    mac.verify_slice(&sig).is_ok()
}

impl EntryRecord {
    /// Parses and checks a record read for `key` (never trusts it: it may be truncated,
    /// garbage, of another version, or copied from another key).
    pub fn parse(key: &EntryKey, bytes: &[u8]) -> Result<EntryRecord> {
        let corrupt = |message: String| Error::Corrupt {
            key: key.to_string(),
            message,
        };
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(corrupt(format!(
                "record of {} bytes is too large",
                bytes.len()
            )));
        }
        let r: EntryRecord = serde_json::from_slice(bytes)
            .map_err(|e| corrupt(format!("unreadable record: {e}")))?;
        if r.format_version != ENTRY_FORMAT_VERSION {
            return Err(corrupt(format!(
                "record format {} (this build reads {ENTRY_FORMAT_VERSION})",
                r.format_version
            )));
        }
        if r.key != key.as_str() {
            return Err(corrupt(format!("record is for key {}", r.key)));
        }
        // The digest names the executable object, so it must be plain hex.
        if EntryKey::parse(&r.executable_sha256).is_err() {
            return Err(corrupt(
                "record's executable digest is not 64 lowercase hex characters".into(),
            ));
        }
        Ok(r)
    }

    /// Checks executable bytes (and the signature, when a signing key is set) against the
    /// record.
    pub fn verify(
        &self,
        key: &EntryKey,
        executable: &[u8],
        signing_key: Option<&[u8]>,
    ) -> Result<()> {
        let corrupt = |message: String| Error::Corrupt {
            key: key.to_string(),
            message,
        };
        if executable.len() as u64 != self.executable_size {
            return Err(corrupt(format!(
                "executable has {} bytes, record says {}",
                executable.len(),
                self.executable_size
            )));
        }
        if sha256_hex(executable) != self.executable_sha256 {
            return Err(corrupt(
                "executable digest does not match its record".into(),
            ));
        }
        if let Some(sk) = signing_key {
            match &self.signature {
                None => return Err(corrupt("entry is not signed".into())),
                Some(sig) if !verify_signature(sk, key, &self.executable_sha256, sig) => {
                    return Err(corrupt("signature does not match".into()))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

impl FailureRecord {
    /// Parses a failure record read for `key`; one for another key or format is refused.
    pub fn parse(key: &EntryKey, bytes: &[u8]) -> Result<FailureRecord> {
        let corrupt = |message: String| Error::Corrupt {
            key: key.to_string(),
            message,
        };
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(corrupt("failure record too large".into()));
        }
        let r: FailureRecord = serde_json::from_slice(bytes)
            .map_err(|e| corrupt(format!("unreadable failure record: {e}")))?;
        if r.key != key.as_str() || r.format_version != ENTRY_FORMAT_VERSION {
            return Err(corrupt("failure record for another key or format".into()));
        }
        Ok(r)
    }
}

/// This machine's name (for lease holders, probes, and the files and leases of checkpoints
/// and metrics logs): the kernel's hostname, else `HOSTNAME`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| std::env::var("HOSTNAME").unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: char) -> EntryKey {
        EntryKey::parse(&c.to_string().repeat(64)).unwrap()
    }

    fn record(k: &EntryKey, exe: &[u8], signing: Option<&[u8]>) -> EntryRecord {
        let digest = sha256_hex(exe);
        EntryRecord {
            format_version: ENTRY_FORMAT_VERSION,
            key: k.to_string(),
            key_inputs: BTreeMap::new(),
            executable_size: exe.len() as u64,
            signature: signing.map(|s| sign(s, k, &digest)),
            executable_sha256: digest,
            program_size: 0,
            compile_ms: 1.0,
            tool_version: "test".into(),
            created_at: 0,
        }
    }

    #[test]
    fn verification_catches_every_kind_of_damage() {
        let k = key('a');
        let exe = b"executable bytes".to_vec();
        let r = record(&k, &exe, None);
        r.verify(&k, &exe, None).unwrap();
        let mut flipped = exe.clone();
        flipped[3] ^= 1;
        assert!(r.verify(&k, &flipped, None).is_err());
        assert!(r.verify(&k, &exe[..5], None).is_err());
        assert!(r.verify(&k, &[], None).is_err());
        let mut longer = exe.clone();
        longer.push(0);
        assert!(r.verify(&k, &longer, None).is_err());
        // The same record read under another key is refused.
        let bytes = serde_json::to_vec(&r).unwrap();
        assert!(EntryRecord::parse(&key('b'), &bytes).is_err());
        assert!(EntryRecord::parse(&k, &bytes[..bytes.len() / 2]).is_err());
        let mut old = r.clone();
        old.format_version = 0;
        assert!(EntryRecord::parse(&k, &serde_json::to_vec(&old).unwrap()).is_err());
    }

    #[test]
    fn signatures() {
        let k = key('c');
        let exe = b"code".to_vec();
        let signed = record(&k, &exe, Some(b"secret"));
        signed.verify(&k, &exe, Some(b"secret")).unwrap();
        assert!(signed.verify(&k, &exe, Some(b"other secret")).is_err());
        assert!(
            record(&k, &exe, None)
                .verify(&k, &exe, Some(b"secret"))
                .is_err(),
            "unsigned refused"
        );
        // Moving a signed entry to another key breaks its signature.
        let mut moved = signed.clone();
        moved.key = key('d').to_string();
        assert!(moved.verify(&key('d'), &exe, Some(b"secret")).is_err());
    }

    #[test]
    fn record_parser_survives_garbage() {
        let k = key('e');
        let mut s: u64 = 99;
        for len in 0..2000usize {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let bytes: Vec<u8> = (0..len % 300).map(|i| (s >> (i % 56)) as u8).collect();
            let _ = EntryRecord::parse(&k, &bytes);
            let _ = FailureRecord::parse(&k, &bytes);
        }
    }

    #[test]
    fn mutated_records_never_vouch_for_other_bytes() {
        // Property: whatever bytes of a valid record are flipped, dropped or inserted, a record
        // that still parses and verifies an executable vouches for exactly the original one.
        let k = key('f');
        let exe = b"the one true executable".to_vec();
        let good = serde_json::to_vec(&record(&k, &exe, None)).unwrap();
        let mut s: u64 = 0x5eed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut still_valid = 0;
        for _ in 0..5000 {
            let mut b = good.clone();
            for _ in 0..1 + next() % 3 {
                let at = (next() as usize) % b.len();
                match next() % 3 {
                    0 => b[at] ^= 1 << (next() % 8),
                    1 => {
                        b.remove(at);
                    }
                    _ => b.insert(at, next() as u8),
                }
            }
            if let Ok(r) = EntryRecord::parse(&k, &b) {
                let mut other = exe.clone();
                other[(next() as usize) % exe.len()] ^= 1;
                assert!(
                    r.verify(&k, &other, None).is_err(),
                    "a mutated record verified other bytes"
                );
                if r.verify(&k, &exe, None).is_ok() {
                    assert_eq!(
                        (r.executable_sha256.as_str(), r.executable_size),
                        (sha256_hex(&exe).as_str(), exe.len() as u64)
                    );
                    still_valid += 1;
                }
            }
        }
        // Some mutations only touch fields like compile_ms; the loop must have seen them.
        assert!(still_valid > 0);
    }
}

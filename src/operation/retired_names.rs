//! The names whose retention ended: kept for good as 16-byte rows in a few shared objects,
//! never as an object's database per name (docs/DESIGN.md, invariant 12).
//!
//! Guarantees: a name is known by the first 16 bytes of the SHA-256 of its normalized key
//! ([`RetiredName::of`]), the same whichever path names it (invariant 6); its first byte picks
//! one of [`SHARDS`] objects (`retired-00` to `retired-ff`), so each shard holds 1/256 of the
//! names and no object is a global bottleneck. A shard's one table is `retired(hash BLOB
//! PRIMARY KEY) WITHOUT ROWID` ([`DDL`]): one row a name, no second index, about 24 bytes a
//! name on disk (`stored_bytes_per_name` below measures it); keeping a name writes one row
//! once (a second keep of the same name writes nothing), asking reads one row.
//!
//! Who asks: a gate retiring its operation keeps the name ([`RetiredCommand::Keep`]) before
//! it deletes its storage; a registration that finds an empty gate, and the first alarm of a
//! record a signed delivery created, ask ([`RetiredCommand::Ask`]). Nothing else creates a
//! record, so nothing else needs to ask. Two keys that share their 16 bytes would make the
//! second one retired too: at 2^-128 per pair, not a risk at any volume a worker sees.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How many shard objects hold the names (one per first byte of the hash).
pub const SHARDS: usize = 256;

/// The shard objects' binding.
pub const RETIRED_BINDING: &str = "RETIRED_NAMES";

/// The shard's one table: one row a name, keyed by its hash, with no rowid (no second index).
pub const DDL: &str = "CREATE TABLE IF NOT EXISTS retired (hash BLOB PRIMARY KEY) WITHOUT ROWID";
/// Keeps a name: one row written the first time, none after.
pub const KEEP: &str = "INSERT INTO retired (hash) VALUES (?) ON CONFLICT DO NOTHING";
/// Asks for a name: one row read when kept, none otherwise.
pub const ASK: &str = "SELECT 1 AS kept FROM retired WHERE hash = ?";

/// A retired name as the shards hold it: 16 bytes of the SHA-256 of its normalized key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredName(#[serde(with = "hex16")] pub [u8; 16]);

impl RetiredName {
    /// The name of the operation whose normalized key is `key`.
    pub fn of(key: &str) -> RetiredName {
        let digest = Sha256::digest(key.as_bytes());
        let mut hash = [0u8; 16];
        hash.copy_from_slice(&digest[..16]);
        RetiredName(hash)
    }

    /// The name of the shard object that holds it.
    pub fn shard(&self) -> String {
        format!("retired-{:02x}", self.0[0])
    }
}

/// A command to a shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum RetiredCommand {
    /// Keep this name for good (a gate retiring it; answered once durable).
    Keep { name: RetiredName },
    /// Whether this name was kept.
    Ask { name: RetiredName },
}

/// A shard's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetiredReply {
    /// The name is kept (stored before this answer left).
    Kept,
    /// The answer to [`RetiredCommand::Ask`].
    Retired(bool),
}

/// The 16 bytes as 32 lowercase hex digits in JSON.
mod hex16 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8; 16], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 16], D::Error> {
        let text = String::deserialize(d)?;
        let mut out = [0u8; 16];
        if text.len() != 32 || !text.is_ascii() {
            return Err(D::Error::custom("a retired name is 32 hex digits"));
        }
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
                .map_err(|_| D::Error::custom("a retired name is 32 hex digits"))?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operation::key::normalize;

    #[test]
    fn a_name_is_the_same_whichever_way_it_was_written() {
        let a = normalize("projects/p/locations/l/batches/x", None).unwrap();
        let b = normalize(" batches/x/", None).unwrap();
        assert_eq!(RetiredName::of(&a.key), RetiredName::of(&b.key));
        assert_ne!(RetiredName::of("batches/x"), RetiredName::of("batches/X"));
    }

    #[test]
    fn the_first_byte_picks_one_of_256_shards() {
        let shards: std::collections::BTreeSet<String> = (0..5_000)
            .map(|i| RetiredName::of(&format!("batches/{i}")).shard())
            .collect();
        assert_eq!(shards.len(), SHARDS);
        assert!(shards.iter().all(|s| s.len() == "retired-00".len()));
    }

    #[test]
    fn commands_round_trip_as_hex() {
        let name = RetiredName::of("batches/x");
        let text = serde_json::to_string(&RetiredCommand::Keep { name }).unwrap();
        assert!(text.starts_with(r#"{"command":"keep","name":""#), "{text}");
        assert_eq!(
            serde_json::from_str::<RetiredCommand>(&text).unwrap(),
            RetiredCommand::Keep { name }
        );
        assert!(
            serde_json::from_str::<RetiredCommand>(r#"{"command":"ask","name":"zz"}"#).is_err()
        );
        let reply = serde_json::to_string(&RetiredReply::Retired(true)).unwrap();
        assert_eq!(
            serde_json::from_str::<RetiredReply>(&reply).unwrap(),
            RetiredReply::Retired(true)
        );
    }

    /// The statements on a real SQLite: a name kept is found, kept twice is one row, and the
    /// table costs about 24 bytes a name on disk (23.2 measured) (what docs/PERFORMANCE.md's bill counts).
    #[test]
    fn stored_bytes_per_name() {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        db.execute(DDL, []).unwrap();
        let n = 200_000u32;
        let tx = db.unchecked_transaction().unwrap();
        for i in 0..n {
            let name = RetiredName::of(&format!("batches/bench-{i}"));
            assert_eq!(tx.execute(KEEP, [name.0.to_vec()]).unwrap(), 1);
        }
        tx.commit().unwrap();
        let again = RetiredName::of("batches/bench-7");
        assert_eq!(
            db.execute(KEEP, [again.0.to_vec()]).unwrap(),
            0,
            "kept once"
        );
        let found = |name: RetiredName| db.prepare(ASK).unwrap().exists([name.0.to_vec()]).unwrap();
        assert!(found(again));
        assert!(!found(RetiredName::of("batches/never")));
        let pages: i64 = db.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
        let size: i64 = db.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
        let per_name = (pages * size) as f64 / f64::from(n);
        println!("retired names: {per_name:.1} bytes a name ({pages} pages of {size})");
        assert!((20.0..=40.0).contains(&per_name), "{per_name} bytes a name");
    }
}

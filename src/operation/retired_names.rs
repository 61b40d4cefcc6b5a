//! The names whose retention ended: kept for good, packed many to a row in a few shared
//! objects, never as an object's database per name (docs/DESIGN.md, invariant 12).
//!
//! Guarantees: a name is known by the first 12 bytes of the SHA-256 of its normalized key
//! ([`RetiredName::of`]; the wire carries 16, of which the shards keep 12), the same whichever path
//! names it (invariant 6); its first byte picks one of [`SHARDS`] objects (`retired-00` to
//! `retired-ff`), so each shard holds 1/256 of the names and no object is a global bottleneck. In
//! its shard a name is an [`ENTRY_BYTES`]-byte entry (the 11 bytes after the first) in the row of
//! its bucket ([`BUCKETS`] a shard, by its second byte): `names(bucket, part, hashes) WITHOUT
//! ROWID` ([`DDL`]), each row's `hashes` the sorted concatenation of at most [`PART_NAMES`]
//! entries, so a name costs its 11 bytes on disk and a few more (`stored_bytes_per_name` below
//! measures it); keeping a batch of names reads each of their buckets' last row and rewrites it
//! (one row read and one written a bucket, whatever the batch's size, and one more written each
//! time a row fills: [`plan_keeps`]; a second keep writes nothing), asking reads its bucket's rows
//! (one per [`PART_NAMES`] names in it) and finds the entry by binary search ([`holds`]).
//!
//! When: a gate retires at the first moment of its name's bucket at or after its retention's
//! end ([`RetiredName::moment`]: one a day a bucket, spread over the day), so a bucket's names
//! whose retention ends the same day reach their shard together and share one write (about
//! 200 at 100 M completions a month); retention is never shorter, and less than a day longer.
//!
//! Shards written before the packing keep their `retired(hash)` rows of 16 bytes
//! ([`LEGACY_DDL`]): both are read, so a name retired before an upgrade stays retired; new
//! names go to the packed rows only.
//!
//! Who asks: a gate retiring its operation keeps the name ([`RetiredCommand::Keep`]) before
//! it deletes its storage; a registration that finds an empty gate, and the first alarm of a
//! record a signed delivery created, ask ([`RetiredCommand::Ask`]). Nothing else creates a
//! record, so nothing else needs to ask. Two keys that share their 12 bytes would make the
//! second one retired too: with n names kept, the odds that any two share them are about
//! n²/2^97, 6·10^-10 at ten billion names.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How many shard objects hold the names (one per first byte of the hash).
pub const SHARDS: usize = 256;

/// The shard objects' binding.
pub const RETIRED_BINDING: &str = "RETIRED_NAMES";

/// Bytes a shard keeps of a name: the hash's 2nd to 12th (the 1st is the shard's name).
pub const ENTRY_BYTES: usize = 11;

/// One name as its shard keeps it.
pub type Entry = [u8; ENTRY_BYTES];

/// Buckets a shard's names are spread over (by the top 6 bits of the hash's second byte):
/// enough that a bucket stays a few rows at 100 M names a month for years, few enough that a
/// bucket's row is large (overflow pages are full; small rows leave leaf pages part empty).
pub const BUCKETS: u8 = 64;

/// Entries a row holds at most (45 KB): a keep rewrites one row of at most this, an ask reads
/// a bucket's rows, one per [`PART_NAMES`] names in it.
pub const PART_NAMES: usize = 4_096;

/// The shard's tables: the packed names, and the one-row-a-name table of shards written before
/// the packing (read, never written; empty in a shard created since).
pub const DDL: &str = "CREATE TABLE IF NOT EXISTS names (bucket INTEGER NOT NULL, part INTEGER NOT NULL, hashes BLOB NOT NULL, PRIMARY KEY (bucket, part)) WITHOUT ROWID";
/// The table of shards written before the packing: a 16-byte hash a row.
pub const LEGACY_DDL: &str =
    "CREATE TABLE IF NOT EXISTS retired (hash BLOB PRIMARY KEY) WITHOUT ROWID";
/// A bucket's rows, in order (what an ask reads).
pub const PARTS: &str = "SELECT part, hashes FROM names WHERE bucket = ? ORDER BY part";
/// A bucket's last row (what a keep reads: one row).
pub const LAST_PART: &str =
    "SELECT part, hashes FROM names WHERE bucket = ? ORDER BY part DESC LIMIT 1";
/// Stores a bucket's row: one row written.
pub const PUT: &str = "INSERT INTO names (bucket, part, hashes) VALUES (?, ?, ?) ON CONFLICT (bucket, part) DO UPDATE SET hashes = excluded.hashes";
/// Asks the table of shards written before the packing: one row read when kept there.
pub const LEGACY_ASK: &str = "SELECT 1 AS kept FROM retired WHERE hash = ?";

/// A retired name on the wire: 16 bytes of the SHA-256 of its normalized key (the shards keep
/// its first 12: [`RetiredName::entry`]; the old table, all 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredName(#[serde(with = "hex16")] pub [u8; 16]);

impl RetiredName {
    /// The name of the operation whose normalized key is `key`.
    pub fn of(key: &str) -> RetiredName {
        let digest = Sha256::digest(key.as_bytes());
        RetiredName(std::array::from_fn(|i| digest[i]))
    }

    /// The name of the shard object that holds it.
    pub fn shard(&self) -> String {
        format!("retired-{:02x}", self.0[0])
    }

    /// Its bucket in its shard.
    pub fn bucket(&self) -> i64 {
        i64::from(self.0[1] / (256 / BUCKETS as u16) as u8)
    }

    /// Its entry in its bucket's rows.
    pub fn entry(&self) -> Entry {
        std::array::from_fn(|i| self.0[i + 1])
    }

    /// Its bucket among all shards' (`SHARDS` × `BUCKETS`), numbered so that consecutive
    /// buckets are in different shards: consecutive moments go to different objects.
    pub fn global_bucket(&self) -> i64 {
        self.bucket() * SHARDS as i64 + i64::from(self.0[0])
    }

    /// The first retirement moment of its bucket at or after `not_before_ms`: each bucket has
    /// one moment per `period_ms` ([`moment_period_ms`]), the buckets' moments spread evenly
    /// over it, so the names of a bucket whose retention ends within one period retire at the
    /// same moment and reach their shard together ([`plan_keeps`] stores them in one write).
    /// Never earlier than `not_before_ms`, and less than `period_ms` later.
    pub fn moment(&self, not_before_ms: i64, period_ms: i64) -> i64 {
        if period_ms <= 0 {
            return not_before_ms;
        }
        let all = SHARDS as i64 * i64::from(BUCKETS);
        let offset = self.global_bucket() * period_ms / all;
        let since = (not_before_ms - offset).rem_euclid(period_ms);
        not_before_ms + (period_ms - since) % period_ms
    }
}

/// Whether a row's sorted `hashes` hold `entry` (binary search; a trailing partial entry,
/// which no keep writes, is ignored).
pub fn holds(hashes: &[u8], entry: &Entry) -> bool {
    let (entries, _partial) = hashes.as_chunks::<ENTRY_BYTES>();
    entries.binary_search(entry).is_ok()
}

/// What keeping a name in its bucket takes, given the bucket's last row (`part`, `hashes`).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeepPlan {
    /// The last row already holds it: nothing to write.
    Held,
    /// Store this row (one row written): the last one with the entry added, or a new one
    /// after it when the last is full.
    Put { part: i64, hashes: Vec<u8> },
}

/// The one write that keeps `entry` in the bucket whose last row is `last` ([`plan_keeps`] for
/// one name).
#[cfg(test)]
pub fn plan_keep(last: Option<&(i64, Vec<u8>)>, entry: &Entry) -> KeepPlan {
    match plan_keeps(last, &[*entry]).pop() {
        None => KeepPlan::Held,
        Some((part, hashes)) => KeepPlan::Put { part, hashes },
    }
}

/// The rows (`part`, `hashes`) to store so that the bucket whose last row is `last` keeps
/// every one of `entries` (a batch of keeps that arrived together, in any order, repeats
/// allowed): the last row with as many of them merged in as fit under [`PART_NAMES`], then
/// new rows after it of at most [`PART_NAMES`] each, every row sorted. Empty when the last row
/// already holds them all. Only the last row is read: a keep comes again only when its gate
/// died between the keep and its delete, so a name is at most kept twice when a new row began
/// in between (11 bytes more, still found).
pub fn plan_keeps(last: Option<&(i64, Vec<u8>)>, entries: &[Entry]) -> Vec<(i64, Vec<u8>)> {
    let held = last.map_or(&[][..], |(_, hashes)| hashes.as_slice());
    let mut new = entries.to_vec();
    new.retain(|e| !holds(held, e));
    new.sort_unstable();
    new.dedup();
    if new.is_empty() {
        return Vec::new();
    }
    let (held, _partial) = held.as_chunks::<ENTRY_BYTES>();
    let mut rows = Vec::new();
    let mut rest = &new[..];
    let mut part = last.map_or(0, |(part, _)| *part);
    if last.is_some() {
        let room = PART_NAMES.saturating_sub(held.len()).min(rest.len());
        if room > 0 {
            let (now, later) = rest.split_at(room);
            let mut merged: Vec<Entry> = held.iter().chain(now).copied().collect();
            merged.sort_unstable();
            rows.push((part, merged.concat()));
            rest = later;
        }
        part += 1;
    }
    for chunk in rest.chunks(PART_NAMES) {
        rows.push((part, chunk.concat()));
        part += 1;
    }
    rows
}

/// The longest a bucket's retirement moments are apart: a day.
pub const MOMENT_PERIOD_MAX_MS: i64 = 86_400_000;

/// How far apart a bucket's retirement moments are for a retention of `retention_ms`: a day,
/// or the retention itself when that is shorter (`LEDGER_RETENTION_SECONDS`, for trying), so
/// a moment moves retention's end later by less than a day, and never more than doubles it.
pub fn moment_period_ms(retention_ms: i64) -> i64 {
    retention_ms.min(MOMENT_PERIOD_MAX_MS)
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
        s.serialize_str(&crate::hex(bytes, 16))
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

    /// `n` names of the shard whose first byte is `byte` (hashes of distinct keys, their first
    /// byte set to it: what the shard would see, without hashing 256 times as many keys).
    fn names_in(byte: u8, n: usize) -> Vec<RetiredName> {
        (0..n)
            .map(|i| {
                let mut name = RetiredName::of(&format!("batches/bench-{i}"));
                name.0[0] = byte;
                name
            })
            .collect()
    }

    #[test]
    fn a_bucket_keeps_its_entries_sorted_and_each_once() {
        let names = names_in(7, 3_000);
        let mut parts: Vec<(i64, Vec<u8>)> = Vec::new();
        for name in &names {
            if let KeepPlan::Put { part, hashes } = plan_keep(parts.last(), &name.entry()) {
                match parts.iter_mut().find(|(p, _)| *p == part) {
                    Some(row) => row.1 = hashes,
                    None => parts.push((part, hashes)),
                }
            }
        }
        // Everything in one list here (one bucket's rule, all buckets mixed: still sorted).
        let all = &parts[0].1;
        assert_eq!(all.len(), 3_000 * ENTRY_BYTES);
        assert!(all.chunks_exact(ENTRY_BYTES).is_sorted());
        assert!(names.iter().all(|n| holds(all, &n.entry())));
        assert_eq!(plan_keep(parts.last(), &names[5].entry()), KeepPlan::Held);
        assert!(!holds(all, &RetiredName::of("batches/never").entry()));
        assert!(!holds(&[], &names[0].entry()));
        // A trailing partial entry is ignored, never read as a name.
        let mut torn = all.clone();
        torn.extend_from_slice(&[0xff; 5]);
        assert!(holds(&torn, &names[0].entry()));
    }

    #[test]
    fn a_full_row_starts_the_next_part() {
        let full: Vec<u8> = (0..PART_NAMES as u32)
            .flat_map(|i| {
                let mut e = [0u8; ENTRY_BYTES];
                e[..4].copy_from_slice(&i.to_be_bytes());
                e
            })
            .collect();
        let entry = [0xee; ENTRY_BYTES];
        assert_eq!(
            plan_keep(Some(&(0, full)), &entry),
            KeepPlan::Put {
                part: 1,
                hashes: entry.to_vec()
            }
        );
        assert_eq!(
            plan_keep(Some(&(1, entry.to_vec())), &entry),
            KeepPlan::Held
        );
        assert_eq!(
            plan_keep(None, &entry),
            KeepPlan::Put {
                part: 0,
                hashes: entry.to_vec()
            }
        );
    }

    #[test]
    fn buckets_spread_a_shards_names() {
        let buckets: std::collections::BTreeSet<i64> =
            names_in(3, 2_000).iter().map(RetiredName::bucket).collect();
        assert_eq!(buckets.len(), usize::from(BUCKETS));
        assert_eq!(*buckets.last().unwrap(), i64::from(BUCKETS) - 1);
    }

    #[test]
    fn a_batch_is_merged_into_its_buckets_last_row_in_one_write() {
        let names = names_in(9, 300);
        let entries: Vec<Entry> = names.iter().map(RetiredName::entry).collect();
        let first = plan_keeps(None, &entries[..100]);
        assert_eq!(first.len(), 1, "100 names, one row written");
        assert_eq!(first[0].0, 0);
        // Another batch, with repeats of the first and within itself: one write, each once.
        let mut again: Vec<Entry> = entries[50..300].to_vec();
        again.extend_from_slice(&entries[250..260]);
        let rows = plan_keeps(first.first(), &again);
        assert_eq!(rows.len(), 1);
        let (part, all) = &rows[0];
        assert_eq!(*part, 0);
        assert_eq!(all.len(), 300 * ENTRY_BYTES);
        assert!(all.chunks_exact(ENTRY_BYTES).is_sorted());
        assert!(entries.iter().all(|e| holds(all, e)));
        assert!(
            plan_keeps(rows.first(), &entries[..10]).is_empty(),
            "held: nothing written"
        );
    }

    #[test]
    fn a_batch_that_fills_the_row_spills_into_new_rows() {
        let names = names_in(11, PART_NAMES * 2 + 500);
        let entries: Vec<Entry> = names.iter().map(RetiredName::entry).collect();
        let last = plan_keeps(None, &entries[..PART_NAMES - 10]).remove(0);
        let rows = plan_keeps(Some(&last), &entries[PART_NAMES - 10..]);
        let sizes: Vec<(i64, usize)> = rows
            .iter()
            .map(|(p, h)| (*p, h.len() / ENTRY_BYTES))
            .collect();
        assert_eq!(sizes, vec![(0, PART_NAMES), (1, PART_NAMES), (2, 500)]);
        for (_, hashes) in &rows {
            assert_eq!(hashes.len() % ENTRY_BYTES, 0);
            assert!(hashes.chunks_exact(ENTRY_BYTES).is_sorted());
        }
        assert!(entries
            .iter()
            .all(|e| rows.iter().any(|(_, h)| holds(h, e))));
        // A full last row is left as it is: the batch begins the next part.
        let full = rows[0].clone();
        let more = [[0xab; ENTRY_BYTES], [0x01; ENTRY_BYTES]];
        assert_eq!(
            plan_keeps(Some(&full), &more),
            vec![(1, [more[1], more[0]].concat())]
        );
    }

    #[test]
    fn a_moment_is_its_buckets_first_at_or_after_retentions_end() {
        const DAY: i64 = MOMENT_PERIOD_MAX_MS;
        assert_eq!(moment_period_ms(14 * DAY), DAY);
        assert_eq!(
            moment_period_ms(2_000),
            2_000,
            "shorter retention: its own length"
        );
        let names = names_in(5, 2_000);
        let end = 1_700_000_000_123;
        for name in &names {
            let at = name.moment(end, DAY);
            assert!((end..end + DAY).contains(&at), "later by less than a day");
            assert_eq!(name.moment(at, DAY), at, "a moment is its own");
            assert_eq!(
                name.moment(at + 1, DAY),
                at + DAY,
                "the next is a day later"
            );
            assert_eq!(name.moment(end, 0), end);
        }
        // A bucket's names retire at one moment whenever in a period their retention ends;
        // other buckets' moments are elsewhere in the day.
        let a = names[0];
        let twin = names
            .iter()
            .find(|n| n.bucket() == a.bucket() && n.0 != a.0)
            .unwrap();
        let at = a.moment(end, DAY);
        assert_eq!(twin.moment(at - DAY + 1, DAY), at);
        let moments: std::collections::BTreeSet<i64> =
            names.iter().map(|n| n.moment(end, DAY)).collect();
        assert_eq!(moments.len(), usize::from(BUCKETS), "one moment a bucket");
        let other = RetiredName([6; 16]);
        assert_ne!(other.global_bucket(), a.global_bucket());
        assert_eq!(RetiredName([0xff; 16]).global_bucket(), 16_383);
    }

    /// Keeps `name` in `db` as the shard does (its bucket's last row read, one row written).
    fn keep(db: &rusqlite::Connection, name: &RetiredName) -> usize {
        let mut read = db.prepare_cached(LAST_PART).unwrap();
        let last: Option<(i64, Vec<u8>)> = read
            .query_map([name.bucket()], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .next();
        match plan_keep(last.as_ref(), &name.entry()) {
            KeepPlan::Held => 0,
            KeepPlan::Put { part, hashes } => db
                .execute(PUT, rusqlite::params![name.bucket(), part, hashes])
                .unwrap(),
        }
    }

    fn asks(db: &rusqlite::Connection, name: &RetiredName) -> bool {
        let mut read = db.prepare_cached(PARTS).unwrap();
        let packed = read
            .query_map([name.bucket()], |r| r.get::<_, Vec<u8>>(1))
            .unwrap()
            .any(|h| holds(&h.unwrap(), &name.entry()));
        packed
            || db
                .prepare(LEGACY_ASK)
                .unwrap()
                .exists([name.0.to_vec()])
                .unwrap()
    }

    fn bytes(db: &rusqlite::Connection) -> i64 {
        let pages: i64 = db.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
        let size: i64 = db.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
        pages * size
    }

    /// Bytes a name in `db`: the whole file, and without its free pages (`(all, used)`).
    fn per_name(db: &rusqlite::Connection, empty: i64, names: usize) -> (f64, f64) {
        let free: i64 = db
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))
            .unwrap();
        let size: i64 = db.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap();
        let all = (bytes(db) - empty) as f64 / names as f64;
        (all, all - (free * size) as f64 / names as f64)
    }

    /// Keeps `months` × `a_month` names of one shard one by one, reporting the bytes a name
    /// after each month in `report_at`.
    fn simulate(a_month: usize, months: usize, report_at: &[usize]) -> Vec<(usize, f64, f64)> {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        db.execute(DDL, []).unwrap();
        db.execute(LEGACY_DDL, []).unwrap();
        let empty = bytes(&db);
        let names = names_in(0x2a, a_month * months);
        let mut report = Vec::new();
        for (i, name) in names.iter().enumerate() {
            assert_eq!(keep(&db, name), 1);
            let month = (i + 1) / a_month;
            if (i + 1) % a_month == 0 && report_at.contains(&month) {
                let (all, used) = per_name(&db, empty, i + 1);
                report.push((month, all, used));
            }
        }
        report
    }

    /// The statements on a real SQLite: a name kept is found, kept twice writes nothing, a
    /// name in the table of shards written before the packing is found too, and the packed
    /// rows cost a few bytes more than the entry's 11 on disk (a shard's month at 1 M
    /// completions a month is about 3,900 names; `a_shard_for_three_years` runs 36 of them).
    #[test]
    fn stored_bytes_per_name() {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        db.execute(DDL, []).unwrap();
        db.execute(LEGACY_DDL, []).unwrap();
        let empty = bytes(&db);
        let old = RetiredName::of("batches/retired-before-the-packing");
        db.execute("INSERT INTO retired (hash) VALUES (?)", [old.0.to_vec()])
            .unwrap();
        let names = names_in(0x2a, 3_900);
        for name in &names {
            assert_eq!(keep(&db, name), 1);
        }
        assert_eq!(keep(&db, &names[7]), 0, "kept once");
        assert!(asks(&db, &names[7]) && asks(&db, &names[3_899]));
        assert!(asks(&db, &old), "a name kept before the packing");
        assert!(!asks(&db, &RetiredName::of("batches/never")));
        let (all, used) = per_name(&db, empty, names.len());
        println!("retired names: {all:.1} bytes a name ({used:.1} without free pages)");
        assert!((11.0..=16.0).contains(&all), "{all} bytes a name");
    }

    /// The bytes a name of one shard at 1 M completions a month (3,900 names a month), one by
    /// one, after months 1, 12 and 36 (docs/PERFORMANCE.md's bill): slow unoptimized, so run
    /// with `cargo test --release -- --ignored a_shard_for_three_years --nocapture`.
    #[test]
    #[ignore]
    fn a_shard_for_three_years() {
        let report = simulate(3_900, 36, &[1, 12, 36]);
        println!("retired names (month, bytes a name, without free pages): {report:?}");
        assert!(report.iter().all(|&(_, all, _)| all <= 16.0), "{report:?}");
    }
}

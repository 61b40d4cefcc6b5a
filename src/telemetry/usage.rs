//! What the Durable Objects use, counted in the units Cloudflare bills: SQLite statements,
//! rows read and written, alarm writes, KV writes and deletes, calls to other objects and
//! outbound fetches, and the wall time an object is active (or held in memory by a timer).
//!
//! Guarantees: counting only, nothing decides on it. With `USAGE_LOG` off (the default)
//! nothing is counted or logged. With it on, each object invocation logs one `usage` line
//! with what was counted since the object's previous line, so the lines of a run sum to
//! exactly what the run used (a line may include work of an invocation that ran during one
//! of its awaits). The bench's cost section (docs/PERFORMANCE.md) reads these lines.

use serde::Serialize;

/// Counts since the last `usage` line of one object.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// SQL statements executed (schema statements included).
    pub sql_statements: u64,
    /// Rows read, as the runtime's cursors report them (what SQLite storage bills).
    pub rows_read: u64,
    /// Rows written, as the runtime's cursors report them (index updates included).
    pub rows_written: u64,
    /// `setAlarm` and `deleteAlarm` calls (storage writes).
    pub alarm_writes: u64,
    /// KV puts and deletes.
    pub kv_writes: u64,
    /// Calls to other Durable Objects (billed as requests to them).
    pub object_calls: u64,
    /// Outbound fetches: side effects, status API, alerts.
    pub outbound_fetches: u64,
    /// How long a send this invocation scheduled holds the object in memory after it (a
    /// pending timer keeps an object from hibernating: billed as duration, like wall time).
    pub held_ms: u64,
}

/// The `usage` line (its tag is the event's name, as every line's is).
#[derive(Serialize)]
#[serde(tag = "event", rename = "usage")]
struct UsageLog<'a> {
    object: &'a str,
    invocation: Invocation,
    wall_ms: i64,
    db_bytes: u64,
    #[serde(flatten)]
    counts: &'a Usage,
}

/// Which entry point of an object ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Invocation {
    Fetch,
    Alarm,
}

impl Usage {
    /// Adds one statement and what its cursor reported.
    pub fn statement(&mut self, rows_read: u64, rows_written: u64) {
        self.sql_statements += 1;
        self.rows_read += rows_read;
        self.rows_written += rows_written;
    }

    /// The `usage` log line of one invocation: `object` is the class, `wall_ms` how long the
    /// invocation was active, `db_bytes` the object's database size after it.
    pub fn line(
        &self,
        object: &str,
        invocation: Invocation,
        wall_ms: i64,
        db_bytes: u64,
    ) -> serde_json::Value {
        let line = UsageLog {
            object,
            invocation,
            wall_ms: wall_ms.max(0),
            db_bytes,
            counts: self,
        };
        serde_json::to_value(line).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_add_up() {
        let mut u = Usage::default();
        u.statement(1, 0);
        u.statement(2, 3);
        assert_eq!(u.sql_statements, 2);
        assert_eq!(u.rows_read, 3);
        assert_eq!(u.rows_written, 3);
    }

    #[test]
    fn the_line_names_the_object_and_carries_every_count() {
        let u = Usage {
            sql_statements: 4,
            rows_read: 5,
            rows_written: 6,
            alarm_writes: 1,
            kv_writes: 2,
            object_calls: 1,
            outbound_fetches: 1,
            held_ms: 900,
        };
        let line = u.line("gate", Invocation::Alarm, 12, 8192);
        assert_eq!(line["event"], "usage");
        assert_eq!(line["object"], "gate");
        assert_eq!(line["invocation"], "alarm");
        assert_eq!(line["wall_ms"], 12);
        assert_eq!(line["db_bytes"], 8192);
        assert_eq!(line["rows_written"], 6);
        assert_eq!(line["kv_writes"], 2);
        assert_eq!(line["outbound_fetches"], 1);
        assert_eq!(line["held_ms"], 900);
    }

    #[test]
    fn a_clock_step_backwards_is_not_negative_time() {
        assert_eq!(
            Usage::default().line("gate", Invocation::Fetch, -3, 0)["wall_ms"],
            0
        );
    }
}

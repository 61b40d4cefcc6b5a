//! The progress machine driven the way the edge drives it (`edge/objects/gate/results.rs`),
//! against a file and a destination held in memory, with a kill at every point where state is
//! stored or a result is sent: every result is accepted, under one `webhook-id` each, and only
//! an in-doubt chunk or the rows being retried are ever sent again. The value is stored
//! without its rows, beside a failure row per result not delivered ([`Stored`]).

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::results::body::result_message_id;
use crate::results::item::from_piece;
use crate::results::lines::{ChunkFill, LineSplitter};

const OP: &str = "batches/b";
const FILE: &str = "files/out";
const LIMITS: Limits = Limits {
    file_wait_ms: FILE_WAIT_MS,
    retry: Backoff::new(30_000, 3_600_000),
    alert_after_ms: 3_600_000,
};
/// A small chunk, so a short file spans several.
const CHUNK: usize = 7;

/// A file of `n` results: keyed lines, a repeated key, keyless lines, an error line, a line
/// that is not JSON, a line over the cap, blank lines and a CRLF line.
fn file(n: usize) -> Vec<u8> {
    let mut out = String::new();
    for i in 0..n {
        let line = match i % 10 {
            1 => format!("{{\"key\":\"dup\",\"response\":{{\"n\":{i}}}}}"),
            2 => format!("{{\"response\":{{\"n\":{i}}}}}"),
            3 => format!("{{\"key\":\"e{i}\",\"error\":{{\"code\":3}}}}"),
            4 => "{not json".to_string(),
            5 => format!(
                "{{\"key\":\"big{i}\",\"response\":\"{}\"}}",
                "x".repeat(300)
            ),
            6 => format!("{{\"key\":\"crlf{i}\",\"response\":{{}}}}\r"),
            _ => format!("{{\"key\":\"k{i}\",\"response\":{{\"n\":{i}}}}}"),
        };
        out.push_str(&line);
        out.push('\n');
        if i % 9 == 0 {
            out.push_str("\n  \n");
        }
    }
    out.into_bytes()
}

struct Killed;

/// The world outside the machine: the durable state, the destination, the clock.
struct World {
    file: Vec<u8>,
    /// The value and its failure rows.
    stored: Stored,
    clock: i64,
    /// Every send: (webhook-id, result key).
    sent: Vec<(String, String)>,
    /// Attempts per webhook-id, as the destination counted them.
    attempts: BTreeMap<String, u32>,
    accepted: BTreeMap<String, u32>,
    settled: Option<Value>,
    points: usize,
    kill_at: Option<usize>,
    /// A claimed chunk sent again goes this many results at a time (the desk's grants).
    resend_part: Option<usize>,
    /// Steps read as many results as they ask for ([`Step::sends`]: a wave of several chunks)
    /// and send them as the fanned-out groups do, all in flight at once (interleaved), rather
    /// than [`CHUNK`] one after another.
    wave: bool,
    /// The points that were stores (the rest are sends).
    store_points: BTreeSet<usize>,
    /// In a wave, the sender of this group answers nothing for the next this many waves: it
    /// sends the first half of its group (they reach the destination) and is cut off.
    failing_sender: Option<(usize, u32)>,
}

impl World {
    fn new(n: usize, kill_at: Option<usize>) -> World {
        let mut stored = Stored::default();
        stored.save(
            &Progress::begin(Source::File { name: FILE.into() }, 0),
            Vec::new(),
        );
        World {
            file: file(n),
            stored,
            clock: 0,
            sent: Vec::new(),
            attempts: BTreeMap::new(),
            accepted: BTreeMap::new(),
            settled: None,
            points: 0,
            kill_at,
            resend_part: None,
            wave: false,
            store_points: BTreeSet::new(),
            failing_sender: None,
        }
    }

    /// A point where a kill may land.
    fn point(&mut self) -> Result<(), Killed> {
        self.points += 1;
        if self.kill_at == Some(self.points) {
            return Err(Killed);
        }
        Ok(())
    }

    /// Stores the value and its writes in one transaction.
    fn store(&mut self, progress: &Progress, writes: Vec<Write>) -> Result<(), Killed> {
        self.stored.save(progress, writes);
        assert_eq!(
            self.stored.load().unwrap().rows,
            progress.rows,
            "the waiting rows stored are the value's"
        );
        assert!(progress.rows.len() <= MAX_WAITING + self.chunk());
        self.store_points.insert(self.points + 1);
        self.point()
    }

    /// The destination: `e…` keys refuse (4xx), `dup` fails twice then accepts, every other
    /// result is accepted.
    fn send(&mut self, item: &ResultItem) -> Result<AttemptOutcome, Killed> {
        let id = result_message_id(OP, &item.result_key, item.index);
        self.sent.push((id.clone(), item.result_key.clone()));
        let n = self.attempts.entry(id.clone()).or_default();
        *n += 1;
        let outcome = if item.result_key.starts_with('e') {
            AttemptOutcome::Park("422: no".into())
        } else if item.result_key.starts_with("dup") && *n <= 2 {
            AttemptOutcome::Retry("503: busy".into())
        } else {
            *self.accepted.entry(id).or_default() += 1;
            AttemptOutcome::Delivered
        };
        self.point()?;
        Ok(outcome)
    }

    /// Results a step reads at most.
    fn chunk(&self) -> usize {
        match self.wave {
            true => WAVE_RESULTS as usize,
            false => CHUNK,
        }
    }

    /// Reads the chunk starting at `from` as the edge would: no `Range`, so the stream starts
    /// at byte 0 and the done part is discarded.
    fn read(&self, from: Checkpoint) -> (Vec<ResultItem>, Checkpoint, bool) {
        self.read_n(from, self.chunk())
    }

    /// The order the results of a step reach the destination: one after another, or, fanned
    /// out, a result of each group in turn (every group in flight at once).
    fn in_flight_order(&self, items: Vec<ResultItem>) -> Vec<ResultItem> {
        let groups = crate::results::fanout::groups(items.len());
        if !self.wave || groups.is_empty() {
            return items;
        }
        let longest = groups.iter().map(|g| g.len()).max().unwrap_or(0);
        (0..longest)
            .flat_map(|i| groups.iter().filter_map(move |g| g.clone().nth(i)))
            .map(|i| items[i].clone())
            .collect()
    }

    /// Reads at most `n` results from `from`.
    fn read_n(&self, from: Checkpoint, n: usize) -> (Vec<ResultItem>, Checkpoint, bool) {
        let mut splitter = LineSplitter::resume(256, from, 0);
        let mut fill = ChunkFill::new(n, CHUNK_BYTES);
        for bytes in self.file.chunks(13) {
            if fill.offer(splitter.push(bytes)) {
                let (pieces, to, last) = fill.close(splitter.checkpoint(), false);
                return (items(&pieces), to, last);
            }
        }
        let (tail, end) = splitter.finish();
        fill.offer(tail);
        let (pieces, to, last) = fill.close(end, true);
        (items(&pieces), to, last)
    }

    fn send_chunk(&mut self, p: &mut Progress, claim: ChunkClaim) -> Result<(), Killed> {
        let (items, to, last) = self.read(claim.from);
        assert_eq!(
            (to, last),
            (claim.to, claim.last),
            "a re-read ends where it did"
        );
        let cut = self.cut_off(&items);
        // A fanned-out wave's answers come back through its senders.
        let fanned = self.wave && !crate::results::fanout::groups(items.len()).is_empty();
        let mut answers = Vec::new();
        for item in self.in_flight_order(items) {
            let sending = match cut.get(&item.index) {
                Some(true) => {
                    self.send(&item)?;
                    Sending::Unanswered("result sender: no answer within 40000 ms".into())
                }
                Some(false) => Sending::Unanswered("result sender: no answer".into()),
                None if fanned => Sending::Carried(self.send(&item)?),
                None => Sending::Answered(self.send(&item)?),
            };
            answers.push((item, sending));
        }
        answers.sort_by_key(|(item, _)| item.index);
        let writes = p.commit(claim.chunk, answers, self.clock, &LIMITS, 0.5);
        self.store(p, writes.unwrap())
    }

    /// The results of a wave whose sender answers nothing (each with whether it left before
    /// the sender was cut off), when one fails this wave.
    fn cut_off(&mut self, items: &[ResultItem]) -> BTreeMap<u64, bool> {
        let groups = crate::results::fanout::groups(items.len());
        let Some((slot, waves)) = self.failing_sender.filter(|(_, n)| *n > 0) else {
            return BTreeMap::new();
        };
        let Some(group) = groups.get(slot) else {
            return BTreeMap::new();
        };
        self.failing_sender = Some((slot, waves - 1));
        let half = group.len() / 2;
        group
            .clone()
            .enumerate()
            .map(|(i, at)| (items[at].index, i < half))
            .collect()
    }

    /// Sends the first `part` results of a claimed chunk again and commits them alone.
    fn send_part(
        &mut self,
        p: &mut Progress,
        claim: ChunkClaim,
        part: usize,
    ) -> Result<(), Killed> {
        let (items, to, _) = self.read_n(claim.from, part);
        let reached = if to.index >= claim.to.index {
            claim.to
        } else {
            to
        };
        let mut answers = Vec::new();
        for item in items.into_iter().filter(|i| i.index < claim.to.index) {
            let outcome = self.send(&item)?;
            answers.push((item, outcome));
        }
        let writes = p.commit_through(claim.chunk, reached, answers, self.clock, &LIMITS, 0.5);
        self.store(p, writes.unwrap())
    }

    /// One step of the alarm, as the edge would perform it.
    fn step(&mut self) -> Result<bool, Killed> {
        let mut p = self.stored.load().unwrap();
        let step = p.next(self.clock);
        if let (true, Some((n, _))) = (self.wave, step.sends()) {
            assert!(n <= WAVE_RESULTS, "a step sends a wave at most");
        }
        match step {
            Step::WaitUntil(at) => self.clock = at,
            Step::ReadChunk { from, .. } => {
                assert_eq!(
                    Step::ReadChunk { chunk: 0, from }.sends(),
                    Some((WAVE_RESULTS, false))
                );
                let (_, to, last) = self.read(from);
                self.point()?;
                let claim = p.claim(to, last);
                self.store(&p, Vec::new())?;
                self.send_chunk(&mut p, claim)?;
            }
            Step::ResendChunk(claim) => match self.resend_part {
                Some(part) => self.send_part(&mut p, claim, part)?,
                None => self.send_chunk(&mut p, claim)?,
            },
            Step::RetryRows(keys) => {
                for index in keys {
                    let item = self.stored.item(index).unwrap();
                    let outcome = self.send(&item)?;
                    let write = p.finish_row(index, &outcome, self.clock, &LIMITS, 0.5);
                    self.store(&p, write.into_iter().collect())?;
                }
            }
            Step::Alert(_) => {
                p.alerted = true;
                self.store(&p, Vec::new())?;
            }
            Step::AlertFailing(_) => {
                p.failing_alerted = true;
                self.store(&p, Vec::new())?;
            }
            Step::AlertSenders(_) | Step::SendersBack => {
                p.senders_alert_marked(matches!(step, Step::AlertSenders(_)));
                self.store(&p, Vec::new())?;
            }
            Step::Settled(results) => {
                self.settled = Some(results);
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Runs to the end; a kill drops everything in memory and the next step starts from
    /// the stored state.
    fn run(&mut self) {
        for _ in 0..10_000 {
            match self.step() {
                Ok(true) | Err(Killed) => {}
                Ok(false) => return,
            }
        }
        panic!("did not settle");
    }
}

fn items(pieces: &[crate::results::lines::Piece]) -> Vec<ResultItem> {
    pieces.iter().map(|p| from_piece(p, FILE)).collect()
}

#[test]
fn a_clean_run_sends_each_result_once_and_settles_with_counts() {
    let mut world = World::new(40, None);
    world.run();
    let results = world.settled.clone().unwrap();
    assert_eq!(
        results,
        json!({"total": 40, "delivered": 36, "errors": 12, "parked": 4})
    );
    let ids: BTreeSet<&String> = world.sent.iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), 40, "every result its own webhook-id");
    let keys: BTreeSet<&String> = world.sent.iter().map(|(_, k)| k).collect();
    assert_eq!(keys.len(), 37, "the four lines keyed `dup` keep their key");
    // Each accepted once; the repeated-key results were retried twice before.
    assert!(world.accepted.values().all(|n| *n == 1));
    assert_eq!(world.accepted.len(), 36);
    let dups = world
        .sent
        .iter()
        .filter(|(_, k)| k.starts_with("dup"))
        .count();
    assert_eq!(dups, 4 * 3);
}

#[test]
fn a_kill_at_any_point_resumes_and_sends_no_result_under_a_new_id() {
    let mut clean = World::new(40, None);
    clean.run();
    let ids: BTreeSet<String> = clean.sent.iter().map(|(id, _)| id.clone()).collect();
    let by_id: BTreeMap<String, String> = clean.sent.iter().cloned().collect();
    for kill_at in 1..=clean.points {
        let mut world = World::new(40, Some(kill_at));
        world.run();
        assert_eq!(world.settled, clean.settled, "kill at {kill_at}");
        let sent: BTreeSet<String> = world.sent.iter().map(|(id, _)| id.clone()).collect();
        assert_eq!(sent, ids, "no new id after a kill at {kill_at}");
        for (id, key) in &world.sent {
            assert_eq!(&by_id[id], key, "one id, one result");
        }
        assert_eq!(world.accepted.len(), clean.accepted.len());
        // Only the results in doubt at the kill (one chunk, or one row) go again.
        let again: u32 = world.accepted.values().map(|n| n - 1).sum();
        assert!(
            again as usize <= CHUNK,
            "kill at {kill_at}: {again} sent again"
        );
    }
}

#[test]
fn a_claimed_chunk_sent_again_in_parts_sends_each_result_once_more_at_most() {
    let mut clean = World::new(40, None);
    clean.run();
    for kill_at in 1..=clean.points {
        let mut world = World::new(40, Some(kill_at));
        world.resend_part = Some(3);
        world.run();
        assert_eq!(world.settled, clean.settled, "kill at {kill_at}");
        let sent: BTreeSet<&String> = world.sent.iter().map(|(id, _)| id).collect();
        let ids: BTreeSet<&String> = clean.sent.iter().map(|(id, _)| id).collect();
        assert_eq!(sent, ids, "no new id after a kill at {kill_at}");
        let again: u32 = world.accepted.values().map(|n| n - 1).sum();
        assert!(
            again as usize <= CHUNK,
            "kill at {kill_at}: {again} sent again"
        );
    }
}

#[test]
fn a_missing_file_is_asked_for_with_backoff_then_read() {
    let mut p = Progress::begin(Source::File { name: FILE.into() }, 0);
    p.file_failed(FileTrouble::Missing, 0, &LIMITS, 1.0);
    assert_eq!(p.next(0), Step::WaitUntil(30_000));
    p.file_failed(FileTrouble::Missing, 30_000, &LIMITS, 1.0);
    assert_eq!(p.next(30_000), Step::WaitUntil(90_000));
    assert!(matches!(p.next(90_000), Step::ReadChunk { chunk: 0, .. }));
    p.claim(
        Checkpoint {
            offset: 10,
            index: 1,
        },
        true,
    );
    assert_eq!(p.phase, Phase::Reading);
}

#[test]
fn a_file_gone_past_the_wait_parks_alerts_once_and_the_job_says_so() {
    let mut p = Progress::begin(Source::File { name: FILE.into() }, 0);
    p.file_failed(FileTrouble::Missing, FILE_WAIT_MS, &LIMITS, 0.0);
    assert_eq!(
        p.next(FILE_WAIT_MS),
        Step::Alert("results file not found (404)".into())
    );
    p.alerted = true;
    let Step::Settled(results) = p.next(FILE_WAIT_MS) else {
        panic!("settled")
    };
    assert_eq!(results["file_parked"], "results file not found (404)");
    assert_eq!(results["total"], 0);
}

#[test]
fn a_file_missing_48_hours_after_the_batch_ended_parks_at_once() {
    let now = 100 * 3_600_000;
    let mut p = Progress::begin(Source::File { name: FILE.into() }, now);
    p.ended_ms = Some(now - FILE_KEPT_MS);
    p.file_failed(FileTrouble::Missing, now, &LIMITS, 0.0);
    let Step::Alert(reason) = p.next(now) else {
        panic!("parked at once, with its alert")
    };
    assert!(reason.contains("more than 48 hours ago"), "{reason}");
    // A server's trouble is not the file's age: it is asked for again.
    let mut p = Progress::begin(Source::File { name: FILE.into() }, now);
    p.ended_ms = Some(now - FILE_KEPT_MS);
    p.file_failed(FileTrouble::Unavailable("503".into()), now, &LIMITS, 0.0);
    assert!(matches!(p.phase, Phase::WaitingForFile { failures: 1, .. }));
}

#[test]
fn a_file_missing_within_48_hours_of_the_batchs_end_is_waited_for() {
    let now = 100 * 3_600_000;
    for ended in [Some(now - FILE_KEPT_MS + 1), None] {
        let mut p = Progress::begin(Source::File { name: FILE.into() }, now);
        p.ended_ms = ended;
        p.file_failed(FileTrouble::Missing, now, &LIMITS, 0.0);
        assert!(
            matches!(p.phase, Phase::WaitingForFile { failures: 1, .. }),
            "{ended:?}"
        );
    }
}

#[test]
fn an_unreadable_file_parks_at_once_and_a_server_error_waits() {
    let mut p = Progress::begin(Source::File { name: FILE.into() }, 0);
    p.file_failed(FileTrouble::Unavailable("503".into()), 0, &LIMITS, 0.0);
    assert!(matches!(p.phase, Phase::WaitingForFile { failures: 1, .. }));
    p.file_failed(
        FileTrouble::Unreadable("403: denied".into()),
        1,
        &LIMITS,
        0.0,
    );
    assert_eq!(
        p.phase,
        Phase::FileParked {
            reason: "403: denied".into()
        }
    );
}

/// A file's progress whose first chunk (40 results, to byte 4,096) was read and committed at 0.
fn first_chunk_read() -> (Progress, Checkpoint) {
    let mut p = Progress::begin(Source::File { name: FILE.into() }, 0);
    let at = Checkpoint {
        offset: 4_096,
        index: 40,
    };
    p.claim(at, false);
    p.commit(0, Vec::<(ResultItem, Sending)>::new(), 0, &LIMITS, 0.0);
    (p, at)
}

#[test]
fn an_operators_retry_reads_a_parked_file_again_from_where_it_stopped() {
    let (mut p, at) = first_chunk_read();
    p.file_failed(
        FileTrouble::Unreadable("206 from byte 0".into()),
        5,
        &LIMITS,
        0.0,
    );
    assert_eq!(p.next(5), Step::Alert("206 from byte 0".into()));
    p.alerted = true;
    let later = FILE_WAIT_MS * 10;
    assert_eq!(
        p.retry_parked(Vec::new(), later),
        (Vec::new(), true),
        "the file is taken"
    );
    assert_eq!(
        p.next(later),
        Step::ReadChunk { chunk: 1, from: at },
        "read again from where it stopped"
    );
    // The wait starts anew: a server's trouble right after the retry is asked for again.
    p.file_failed(FileTrouble::Unavailable("503".into()), later, &LIMITS, 0.0);
    assert!(matches!(p.phase, Phase::WaitingForFile { .. }));
    assert_eq!(p.job_results()["file_parked"], Value::Null);
    assert!(!p.reopen_file(later), "a file not parked is not taken");
}

#[test]
fn a_retry_of_results_whose_source_was_never_found_asks_for_it_again() {
    let mut p = Progress::begin(Source::Inline, 0);
    p.unlocated = true;
    p.phase = Phase::FileParked {
        reason: "status answer: 404".into(),
    };
    assert!(!p.wants_locating(), "parked: nothing is asked");
    assert_eq!(p.retry_parked(Vec::new(), 9), (Vec::new(), true));
    assert!(p.wants_locating());
}

#[test]
fn a_stale_commit_for_another_chunk_changes_nothing() {
    let mut p = Progress::begin(Source::Inline, 0);
    p.claim(
        Checkpoint {
            offset: 0,
            index: 3,
        },
        true,
    );
    let before = p.clone();
    assert!(p
        .commit(5, Vec::<(ResultItem, Sending)>::new(), 0, &LIMITS, 0.0)
        .is_none());
    assert_eq!(p, before);
}

#[test]
fn parked_results_retried_by_an_operator_go_once_under_their_first_id() {
    let mut world = World::new(20, None);
    world.run();
    let mut p = world.stored.load().unwrap();
    assert_eq!(p.counts.parked, 2);
    let page = world.stored.parked(p.room());
    assert_eq!(page.len(), 2, "parked rows are stored, not held");
    assert!(p.rows.is_empty());
    let (writes, file) = p.retry_parked(page, world.clock);
    assert_eq!((writes.len(), file), (2, false));
    world.stored.save(&p, writes);
    assert!(world.stored.parked(10).is_empty(), "waiting again");
    let Step::RetryRows(keys) = p.next(world.clock) else {
        panic!("rows due")
    };
    for index in keys {
        let item = &world.stored.item(index).unwrap();
        let id = result_message_id(OP, &item.result_key, item.index);
        assert!(world.sent.iter().any(|(sent, _)| *sent == id), "first id");
        let write = p.finish_row(index, &AttemptOutcome::Delivered, world.clock, &LIMITS, 0.0);
        assert_eq!(write, Some(Write::Forget(index)));
    }
    let Step::Settled(results) = p.next(world.clock) else {
        panic!("settled")
    };
    assert_eq!(results["parked"], 0);
    assert_eq!(results["delivered"], 20);
}

#[test]
fn a_row_retry_waits_the_jobs_backoff() {
    let mut p = Progress::begin(Source::Inline, 0);
    let claim = p.claim(
        Checkpoint {
            offset: 0,
            index: 1,
        },
        true,
    );
    let item = ResultItem {
        result_key: "a".into(),
        index: 0,
        payload: crate::results::item::Payload::Response(json!({})),
    };
    let busy = AttemptOutcome::Retry("503".into());
    assert!(may_have_reached(&busy));
    assert!(!may_have_reached(&AttemptOutcome::Park("400".into())));
    let writes = p.commit(
        claim.chunk,
        vec![(item.clone(), busy.clone())],
        1_000,
        &LIMITS,
        1.0,
    );
    assert_eq!(writes, Some(vec![Write::Keep(p.rows[&0].clone(), item)]));
    let wait = LIMITS.retry.after(1);
    assert_eq!(p.next(1_000), Step::WaitUntil(1_000 + wait));
    // When it was answered is kept with what answered, in the row the failure writes anyway.
    assert_eq!(p.rows[&0].last_attempt_ms, Some(1_000));
    let write = p.finish_row(0, &busy, 2_000, &LIMITS, 1.0);
    assert_eq!(write, Some(Write::Update(p.rows[&0].clone())), "its row");
    let wait = LIMITS.retry.after(2);
    assert_eq!(p.next(2_000), Step::WaitUntil(2_000 + wait));
    assert_eq!(p.rows[&0].attempts, 2);
    assert_eq!(p.rows[&0].last_attempt_ms, Some(2_000));
    assert_eq!(p.rows[&0].last_error, "503");
}

#[test]
fn a_parked_row_keeps_when_it_was_last_answered_through_an_operators_retry() {
    let mut p = Progress::begin(Source::Inline, 0);
    let claim = p.claim(
        Checkpoint {
            offset: 0,
            index: 1,
        },
        true,
    );
    let refused = AttemptOutcome::Park("422: page template missing".into());
    let writes = p
        .commit(
            claim.chunk,
            failed(0..1)
                .into_iter()
                .map(|(i, _)| (i, refused.clone()))
                .collect(),
            7_000,
            &LIMITS,
            0.0,
        )
        .unwrap();
    let [Write::Keep(row, _)] = &writes[..] else {
        panic!("parked: {writes:?}")
    };
    assert_eq!(row.last_attempt_ms, Some(7_000));
    assert_eq!((row.attempts, row.next_at_ms), (1, None));
    assert!(row.parked() && p.rows.is_empty(), "parked, not waiting");
    // Waiting again after an operator's retry, it still says when it was last answered.
    p.retry_parked(vec![row.clone()], 9_000);
    assert_eq!(p.rows[&0].last_attempt_ms, Some(7_000));
    assert_eq!(p.rows[&0].next_at_ms, Some(9_000));
    // An operator's retry sends a waiting row now, keeping its attempts and last answer.
    p.rows.get_mut(&0).unwrap().next_at_ms = Some(60_000);
    assert_eq!(p.waiting_later(10_000), 1);
    let hurried = p.hurry_waiting(10_000);
    assert_eq!(hurried, [Write::Update(p.rows[&0].clone())]);
    assert_eq!(p.next(10_000), Step::RetryRows(vec![0]));
    assert_eq!(
        (p.rows[&0].attempts, p.rows[&0].last_attempt_ms),
        (1, Some(7_000))
    );
    assert!(p.hurry_waiting(10_000).is_empty(), "due already");
    // A row stored before the field was kept reads as not known.
    let old: Row = serde_json::from_value(
        json!({"result_key": "a", "index": 0, "attempts": 1, "last_error": "503", "next_at_ms": 5}),
    )
    .unwrap();
    assert_eq!(old.last_attempt_ms, None);
}

/// Results `indexes`, each answered 503 by the destination.
fn failed(indexes: std::ops::Range<u64>) -> Vec<(ResultItem, AttemptOutcome)> {
    let busy = AttemptOutcome::Retry("503".into());
    indexes
        .map(|i| {
            let item = ResultItem {
                result_key: format!("r{i}"),
                index: i,
                payload: crate::results::item::Payload::Response(json!({})),
            };
            (item, busy.clone())
        })
        .collect()
}

#[test]
fn a_release_with_nothing_due_sends_the_soonest_waiting_result() {
    let mut p = Progress::begin(Source::Inline, 0);
    p.claim(
        Checkpoint {
            offset: 0,
            index: 3,
        },
        true,
    );
    p.commit(0, failed(0..3), 0, &LIMITS, 0.0).unwrap();
    p.rows.get_mut(&1).unwrap().next_at_ms = Some(500);
    p.rows.get_mut(&0).unwrap().next_at_ms = Some(900);
    p.rows.get_mut(&2).unwrap().next_at_ms = Some(700);
    assert_eq!(p.next(100), Step::WaitUntil(500));
    assert_eq!(p.next_released(100), Step::RetryRows(vec![1]));
    assert_eq!(p.next_released(100).sends(), Some((1, true)));
    // Nothing waits (the file is not there yet): the release finds nothing to send.
    let mut waiting = Progress::begin(Source::Inline, 0);
    waiting.file_failed(FileTrouble::Missing, 0, &LIMITS, 0.0);
    assert!(matches!(waiting.next_released(1), Step::WaitUntil(_)));
    assert_eq!(waiting.next_released(1).sends(), None);
}

#[test]
fn a_destination_failing_everything_stops_the_reading_not_the_memory() {
    let mut p = Progress::begin(Source::Inline, 0);
    let mut chunk = 0;
    while let Step::ReadChunk { .. } = p.next(0) {
        let from = p.done_through;
        let to = Checkpoint {
            offset: from.offset + 100,
            index: from.index + CHUNK_RESULTS,
        };
        let claim = p.claim(to, false);
        p.commit(claim.chunk, failed(from.index..to.index), 0, &LIMITS, 0.0)
            .unwrap();
        chunk += 1;
        assert!(chunk < 1_000, "reading stopped");
    }
    assert!(p.rows.len() >= MAX_WAITING && p.rows.len() < MAX_WAITING + CHUNK_RESULTS as usize);
    assert!(matches!(p.next(0), Step::WaitUntil(_)));
    assert!(matches!(p.next(i64::MAX / 2), Step::RetryRows(_)));
}

/// Finding 3 of issue 48: a waiting row keeps a bounded part of its key, so the stored value
/// stays far below SQLite's 2 MB row with every row waiting on keys of 60 KB (whole, 400 of
/// them were 24 MB: the commit failed after the sends, and the same ids went again for ever).
#[test]
fn the_stored_progress_is_bounded_whatever_the_keys_sizes() {
    let mut p = Progress::begin(Source::File { name: FILE.into() }, 0);
    let long = |i: u64| format!("{i}-{}", "k".repeat(60 * 1024));
    let long_error = AttemptOutcome::Retry(format!("network: {}", "e".repeat(10_000)));
    while let Step::ReadChunk { .. } = p.next(0) {
        let from = p.done_through;
        let to = Checkpoint {
            offset: from.offset + 100,
            index: from.index + CHUNK_RESULTS,
        };
        let claim = p.claim(to, false);
        let answers = failed(from.index..to.index)
            .into_iter()
            .map(|(mut item, _)| {
                item.result_key = long(item.index);
                (item, long_error.clone())
            })
            .collect();
        let writes = p.commit(claim.chunk, answers, 0, &LIMITS, 0.0).unwrap();
        // The whole key stays in the result kept to be sent again; its row keeps a part.
        assert!(writes.iter().all(|w| matches!(w, Write::Keep(r, i)
            if i.result_key.len() > 60 * 1024 && serde_json::to_string(r).unwrap().len() < 1_024)));
    }
    assert!(p.rows.len() >= MAX_WAITING);
    let stored = serde_json::to_string(&p).unwrap();
    assert!(
        stored.len() < 1_024,
        "{} bytes: no row in the value",
        stored.len()
    );
    let row = &p.rows[&0];
    assert!(
        row.result_key.starts_with("0-kkk")
            && row.result_key.chars().count() == KEY_SHOWN_CHARS + 1
    );
    assert!(row.last_error.chars().count() <= ERROR_KEPT_CHARS + 1);
}

/// Finding 4 of issue 48: a result that keeps failing is parked at its first failure past
/// the alert threshold, the batch alerts once naming how many, and the job's effect goes
/// with them counted parked; an operator's retry gives them a whole window again.
#[test]
fn a_result_failing_past_the_alert_threshold_is_parked_and_alerted_once() {
    let limits = Limits {
        alert_after_ms: 10_000,
        retry: Backoff::new(1_000, 2_000),
        ..LIMITS
    };
    let mut p = Progress::begin(Source::Inline, 0);
    let claim = p.claim(
        Checkpoint {
            offset: 0,
            index: 3,
        },
        true,
    );
    let mut answers = failed(0..3);
    answers[2].1 = AttemptOutcome::Delivered;
    p.commit(claim.chunk, answers, 0, &limits, 0.0).unwrap();
    let busy = AttemptOutcome::Retry("503".into());
    let mut clock = 0;
    let mut parked = Vec::new();
    loop {
        match p.next(clock) {
            Step::RetryRows(due) => {
                for index in due {
                    let write = p.finish_row(index, &busy, clock, &limits, 0.0);
                    parked.extend(write.filter(|w| matches!(w, Write::Update(r) if r.parked())));
                }
            }
            Step::WaitUntil(at) => clock = at,
            _ => break,
        }
        assert!(
            clock < 60_000,
            "parked within the threshold and one backoff"
        );
    }
    assert!(clock >= 10_000, "not before the threshold");
    assert_eq!(parked.len(), 2);
    let Write::Update(row) = &parked[0] else {
        panic!("parked")
    };
    assert!(
        row.last_error.starts_with("failing for"),
        "{}",
        row.last_error
    );
    assert!(row.last_error.contains("503"));
    assert_eq!(p.next(clock), Step::AlertFailing(2));
    p.failing_alerted = true;
    let Step::Settled(results) = p.next(clock) else {
        panic!("the job's effect goes")
    };
    assert_eq!(results["parked"], 2);
    assert_eq!(results["delivered"], 1);
    // An operator's retry: a whole window again, and no second alert.
    let rows = parked
        .into_iter()
        .map(|w| match w {
            Write::Update(row) => row,
            _ => unreachable!(),
        })
        .collect();
    p.retry_parked(rows, clock);
    assert!(p.rows.values().all(|r| r.failing_since_ms.is_none()));
    assert!(matches!(p.next(clock), Step::RetryRows(_)));
    assert!(
        matches!(p.finish_row(0, &busy, clock + 1, &limits, 0.0), Some(Write::Update(r)) if !r.parked()),
        "retried, not parked"
    );
}

/// Results `indexes` claimed in one chunk (the last) and committed at `now` with `answers`
/// (a 503 for each result past them).
fn committed(
    p: &mut Progress,
    indexes: std::ops::Range<u64>,
    answers: &[AttemptOutcome],
    now: i64,
) {
    let claim = p.claim(
        Checkpoint {
            offset: 0,
            index: indexes.end,
        },
        true,
    );
    let mut items = failed(indexes);
    for ((_, outcome), answer) in items.iter_mut().zip(answers) {
        *outcome = answer.clone();
    }
    p.commit(claim.chunk, items, now, &LIMITS, 0.0).unwrap();
}

/// A refused result (a 400, a 410, a body over a queue's limit) is parked at once, and the
/// batch's one `results_failing` of the spell is raised at the next step, long before the
/// threshold, as the job's refused effect alerts at once; it is not sent again, and a second
/// refusal after the alert raises nothing more in that spell. A refusal of a waiting row's
/// retry alerts the same way.
#[test]
fn a_refused_result_is_parked_and_alerted_at_the_next_step_and_never_sent_again() {
    let mut p = Progress::begin(Source::Inline, 0);
    let refused = AttemptOutcome::Park("400: bad request".into());
    let busy = AttemptOutcome::Retry("503".into());
    let answers = [AttemptOutcome::Delivered, refused, busy];
    committed(&mut p, 0..3, &answers, 1_000);
    assert_eq!(
        p.rows.keys().collect::<Vec<_>>(),
        [&2],
        "the refused one does not wait"
    );
    assert_eq!(
        p.next(1_000),
        Step::AlertFailing(1),
        "at once, not after the threshold"
    );
    p.failing_alerted = true;
    // The waiting one is refused at its retry: counted in the spell, no second alert, and
    // the refused ones are never sent again.
    let at = p.rows[&2].next_at_ms.unwrap();
    assert_eq!(p.next(1_000), Step::WaitUntil(at));
    assert_eq!(p.next(at), Step::RetryRows(vec![2]));
    let gone = AttemptOutcome::Park("410: gone".into());
    let write = p.finish_row(2, &gone, at, &LIMITS, 0.0);
    assert!(
        matches!(write, Some(Write::Update(r)) if r.parked()),
        "parked"
    );
    assert_eq!(p.gave_up, 2, "counted in the spell");
    let Step::Settled(results) = p.next(at) else {
        panic!("no second alert in the spell: the job's effect goes")
    };
    assert_eq!(
        (&results["parked"], &results["delivered"]),
        (&json!(2), &json!(1))
    );
    // A refusal of a retry, in a spell not yet alerted: alerted at the next step.
    let mut p = Progress::begin(Source::Inline, 0);
    committed(&mut p, 0..1, &[], 0);
    let at = p.rows[&0].next_at_ms.unwrap();
    p.finish_row(0, &gone, at, &LIMITS, 0.0).unwrap();
    assert_eq!(p.next(at), Step::AlertFailing(1));
}

/// Refused results and results given up past the threshold in one spell: one alert, naming
/// them all (never one per result).
#[test]
fn refusals_and_results_given_up_in_one_spell_raise_one_alert_naming_them_all() {
    let limits = Limits {
        alert_after_ms: 10_000,
        ..LIMITS
    };
    let mut p = Progress::begin(Source::Inline, 0);
    let busy = AttemptOutcome::Retry("503".into());
    committed(&mut p, 0..5, &[], 0);
    assert_eq!(p.rows.len(), 5, "all waiting");
    // One step retries all five past the threshold: two fail again, three are refused.
    let clock = 20_000;
    for row in p.rows.values_mut() {
        row.next_at_ms = Some(clock);
    }
    assert_eq!(p.next(clock), Step::RetryRows(vec![0, 1, 2, 3, 4]));
    for index in 0..5 {
        let answer = match index {
            0 | 1 => busy.clone(),
            _ => AttemptOutcome::Park("422: no".into()),
        };
        let write = p.finish_row(index, &answer, clock, &limits, 0.0);
        assert!(
            matches!(write, Some(Write::Update(r)) if r.parked()),
            "{index} parked"
        );
    }
    assert_eq!(p.next(clock), Step::AlertFailing(5));
    p.failing_alerted = true;
    let Step::Settled(results) = p.next(clock) else {
        panic!("the job's effect goes")
    };
    assert_eq!(results["parked"], 5);
}

/// The spell's `results_failing` raised for a refusal resolves as for results given up: not
/// when the job's effect goes, and not when an operator's retry is refused again (that new
/// spell alerts again), but once a retry's spell parks none (`results_recovered`).
#[test]
fn a_refusals_alert_resolves_once_an_operators_retry_parks_none() {
    use crate::operation::alert::AlertKind;
    use crate::operation::Operation;
    use crate::results::marks::{gave_up, retried, settled, tests::succeeded};

    let queued = |op: &Operation| -> Vec<&'static str> {
        let alerts = op.due_alerts(i64::MAX);
        alerts.iter().map(|a| a.kind.as_str()).collect()
    };
    let op = succeeded();
    let mut p = Progress::begin(Source::Inline, 10);
    let refused = AttemptOutcome::Park("400: bad request".into());
    committed(
        &mut p,
        0..2,
        &[AttemptOutcome::Delivered, refused.clone()],
        20,
    );
    let Step::AlertFailing(n) = p.next(20) else {
        panic!("alerted at once")
    };
    let mut op = gave_up(op, &mut p, n, 3_600, 20).record.unwrap();
    assert_eq!(queued(&op), ["results_failing"]);
    op.alert_delivered(&op.queued_id(AlertKind::ResultsFailing));
    let Step::Settled(counts) = p.next(20) else {
        panic!("the job's effect goes")
    };
    let op = settled(op, counts, p.gave_up, 30).record.unwrap();
    assert!(queued(&op).is_empty(), "not resolved by the job's effect");
    // An operator's retry, refused again: a new spell, alerted again, not resolved.
    let parked = || Row {
        result_key: "r1".into(),
        index: 1,
        attempts: 1,
        last_error: "400: bad request".into(),
        ..Row::default()
    };
    let row = parked();
    let op = retried(op, &mut p, vec![row], ("fixed".into(), None), 40)
        .record
        .unwrap();
    assert_eq!(p.next(40), Step::RetryRows(vec![1]));
    p.finish_row(1, &refused, 40, &LIMITS, 0.0).unwrap();
    assert_eq!(
        p.next(40),
        Step::AlertFailing(1),
        "a new spell alerts again"
    );
    let mut op = gave_up(op, &mut p, 1, 3_600, 40).record.unwrap();
    assert_eq!(queued(&op), ["results_failing"]);
    op.alert_delivered(&op.queued_id(AlertKind::ResultsFailing));
    let Step::Settled(counts) = p.next(40) else {
        panic!("settled again")
    };
    let op = settled(op, counts, p.gave_up, 45).record.unwrap();
    assert!(queued(&op).is_empty(), "still open: refused again");
    // A retry whose spell parks none: resolved.
    let row = parked();
    let op = retried(op, &mut p, vec![row], ("fixed".into(), None), 50)
        .record
        .unwrap();
    p.finish_row(1, AttemptOutcome::Delivered, 50, &LIMITS, 0.0)
        .unwrap();
    let Step::Settled(counts) = p.next(50) else {
        panic!("settled, none parked")
    };
    assert_eq!(counts["parked"], 0);
    let op = settled(op, counts, p.gave_up, 60).record.unwrap();
    assert_eq!(queued(&op), ["results_recovered"]);
}

/// `/metrics` hears of delivered results a thousand at a time on the happy path (one record
/// write, not one per chunk), of a failure or a park with its commit, and of the rest when
/// nothing is left to send.
#[test]
fn the_results_are_metered_in_bulk_on_the_happy_path_and_at_once_off_it() {
    let mut p = Progress::begin(Source::Inline, 0);
    let mut metered = Vec::new();
    let total = 2 * METER_EVERY + 3 * CHUNK_RESULTS;
    while let Step::ReadChunk { .. } = p.next(0) {
        let from = p.done_through;
        let to = Checkpoint {
            offset: 0,
            index: from.index + CHUNK_RESULTS,
        };
        let claim = p.claim(to, to.index == total);
        let before = p.counts;
        let mut answers = failed(from.index..to.index);
        for (_, outcome) in answers.iter_mut() {
            *outcome = AttemptOutcome::Delivered;
        }
        let writes = p.commit(claim.chunk, answers, 0, &LIMITS, 0.0).unwrap();
        assert!(writes.is_empty(), "a delivered result takes no row");
        metered.extend(p.meter(before));
    }
    let delivered: Vec<u64> = metered.iter().map(|m| m.delivered).collect();
    assert_eq!(delivered, vec![METER_EVERY, METER_EVERY, 3 * CHUNK_RESULTS]);
    assert_eq!(p.unmetered, 0);
    // Off the happy path: a failure and a park are counted with their commit.
    let mut p = Progress::begin(Source::Inline, 0);
    let claim = p.claim(
        Checkpoint {
            offset: 0,
            index: 3,
        },
        false,
    );
    let mut answers = failed(0..3);
    answers[0].1 = AttemptOutcome::Delivered;
    answers[1].1 = AttemptOutcome::Park("400".into());
    let before = p.counts;
    let writes = p.commit(claim.chunk, answers, 0, &LIMITS, 0.0).unwrap();
    let kept: Vec<(u64, bool)> = writes
        .iter()
        .map(|w| match w {
            Write::Keep(row, _) => (row.index, row.parked()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kept,
        [(1, true), (2, false)],
        "a row each, parked or waiting"
    );
    assert_eq!(
        p.meter(before),
        Some(Metered {
            delivered: 1,
            failed: 1,
            parked: 1,
            unanswered: 0,
        })
    );
    assert_eq!(p.meter(p.counts), None, "nothing new");
}

/// A pause is not the destination failing: a result that failed before its destination was
/// paused for longer than the alert threshold is not parked at its first failure after the
/// resume, but gets a whole window again.
#[test]
fn a_pause_longer_than_the_alert_threshold_parks_nothing_after_the_resume() {
    let limits = Limits {
        alert_after_ms: 10_000,
        retry: Backoff::new(1_000, 2_000),
        ..LIMITS
    };
    let mut p = Progress::begin(Source::Inline, 0);
    let claim = p.claim(
        Checkpoint {
            offset: 0,
            index: 1,
        },
        true,
    );
    p.commit(claim.chunk, failed(0..1), 0, &limits, 0.0)
        .unwrap();
    let busy = AttemptOutcome::Retry("503".into());
    let waits = |w: Option<Write>| matches!(w, Some(Write::Update(r)) if !r.parked());
    // A second failure a second later: its clock runs from the first.
    assert!(waits(p.finish_row(0, &busy, 1_000, &limits, 0.0)));
    assert!(p.rows[&0].failing_since_ms.is_some());
    // Paused for an hour: the clock stops, its row stored (once: nothing more after that).
    assert_eq!(
        p.held_by_pause(),
        Some(vec![Write::Update(p.rows[&0].clone())])
    );
    assert_eq!(p.held_by_pause(), None);
    // Resumed an hour later, and the destination still answers 503: retried, not parked.
    let resumed = 3_600_000;
    assert!(
        waits(p.finish_row(0, &busy, resumed, &limits, 0.0)),
        "retried, not parked"
    );
    // Without the pause, the same failure would have parked it.
    let mut q = Progress::begin(Source::Inline, 0);
    let claim = q.claim(
        Checkpoint {
            offset: 0,
            index: 1,
        },
        true,
    );
    q.commit(claim.chunk, failed(0..1), 0, &limits, 0.0)
        .unwrap();
    assert!(waits(q.finish_row(0, &busy, 1_000, &limits, 0.0)));
    assert!(matches!(
        q.finish_row(0, &busy, resumed, &limits, 0.0),
        Some(Write::Update(r)) if r.parked()
    ));
}

/// Several chunks in flight at once (a wave fanned out to the senders, interleaved), killed at
/// every point: every result is accepted, no result goes under a new id, and only the wave in
/// doubt (or one row) goes again.
#[test]
fn a_wave_of_chunks_in_flight_at_once_killed_anywhere_sends_only_the_wave_again() {
    let n = WAVE_RESULTS as usize + 45;
    let mut clean = World::new(n, None);
    clean.wave = true;
    clean.run();
    let ids: BTreeSet<String> = clean.sent.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(ids.len(), n, "every result its own webhook-id");
    let by_id: BTreeMap<String, String> = clean.sent.iter().cloned().collect();
    // Every storage point, and every fifth send (each wave's sends interleave its groups).
    let kills = (1..=clean.points).filter(|p| clean.store_points.contains(p) || p % 5 == 0);
    for kill_at in kills {
        let mut world = World::new(n, Some(kill_at));
        world.wave = true;
        world.run();
        assert_eq!(world.settled, clean.settled, "kill at {kill_at}");
        let sent: BTreeSet<String> = world.sent.iter().map(|(id, _)| id.clone()).collect();
        assert_eq!(sent, ids, "no new id after a kill at {kill_at}");
        for (id, key) in &world.sent {
            assert_eq!(&by_id[id], key, "one id, one result");
        }
        assert!(world.accepted.values().all(|n| *n >= 1));
        let again: u32 = world.accepted.values().map(|n| n - 1).sum();
        assert!(
            again as usize <= WAVE_RESULTS as usize,
            "kill at {kill_at}: {again} sent again"
        );
    }
}

#[test]
fn a_group_whose_sender_answered_nothing_is_kept_to_send_again_and_the_others_are_committed() {
    let mut p = Progress::begin(Source::Inline, 0);
    let claim = p.claim(
        Checkpoint {
            offset: 0,
            index: 12,
        },
        true,
    );
    // Two groups of 6: the first's sender answered, the second's did not.
    let mut answers: Vec<(ResultItem, Sending)> = failed(0..12)
        .into_iter()
        .map(|(item, _)| (item, Sending::Answered(AttemptOutcome::Delivered)))
        .collect();
    for (_, sending) in answers.iter_mut().skip(6) {
        *sending = Sending::Unanswered("result sender: no answer within 40000 ms".into());
    }
    let before = p.counts;
    let writes = p.commit(claim.chunk, answers, 1_000, &LIMITS, 0.5).unwrap();
    // The chunk is committed: its answered group delivered, the other kept to send again.
    assert_eq!(p.claim, None);
    assert_eq!(
        (p.counts.total, p.counts.delivered, p.counts.parked),
        (12, 6, 0)
    );
    let kept: Vec<u64> = writes
        .iter()
        .map(|w| match w {
            Write::Keep(row, item) if row.index == item.index => item.index,
            other => panic!("only kept results: {other:?}"),
        })
        .collect();
    assert_eq!(kept, (6..12).collect::<Vec<_>>());
    assert_eq!(p.rows.keys().copied().collect::<Vec<_>>(), kept);
    for row in p.rows.values() {
        assert_eq!(row.failing_since_ms, None, "no failing clock starts");
        assert_eq!(row.attempts, 1, "it may have left");
        assert!(
            row.next_at_ms.is_some_and(|at| at > 1_000),
            "after the backoff"
        );
        assert!(row.last_error.starts_with("result sender: "));
    }
    let counted = p
        .meter(before)
        .map(|m| (m.delivered, m.failed, m.unanswered));
    assert_eq!(counted, Some((6, 0, 6)), "none failed; 6 unanswered");
    assert!(matches!(p.next(1_000), Step::WaitUntil(_)));
    // Long past EFFECT_ALERT_AFTER_SECONDS, a sender that answers nothing again parks nothing.
    let late = 1_000 + LIMITS.alert_after_ms * 3;
    let Step::RetryRows(due) = p.next(late) else {
        panic!("the rows are due");
    };
    assert_eq!(due, kept);
    for index in &due {
        let unanswered = Sending::Unanswered("result sender: object answered 500".into());
        let write = p.finish_row(*index, unanswered, late, &LIMITS, 0.5);
        assert_eq!(write, Some(Write::Update(p.rows[index].clone())), "waiting");
    }
    assert_eq!((p.gave_up, p.counts.parked, p.rows.len()), (0, 0, 6));
    assert!(p
        .rows
        .values()
        .all(|r| r.attempts == 2 && r.failing_since_ms.is_none()));
    // Then sent and answered: delivered, forgotten, settled.
    for index in &due {
        let write = p.finish_row(*index, &AttemptOutcome::Delivered, late + 1, &LIMITS, 0.5);
        assert_eq!(write, Some(Write::Forget(*index)));
    }
    assert_eq!(
        p.next(late + 1),
        Step::Settled(json!({"total": 12, "delivered": 12, "errors": 0, "parked": 0}))
    );
}

#[test]
fn a_sender_that_answers_nothing_for_its_group_loses_nothing_and_sends_no_new_id() {
    let mut clean = World::new(600, None);
    clean.wave = true;
    clean.run();
    let mut world = World::new(600, None);
    world.wave = true;
    world.failing_sender = Some((2, 2));
    world.run();
    assert_eq!(
        world.failing_sender,
        Some((2, 0)),
        "two waves' sender was cut off"
    );
    assert_eq!(world.settled, clean.settled, "the same counts");
    let ids = |w: &World| {
        w.sent
            .iter()
            .map(|(id, _)| id.clone())
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(ids(&world), ids(&clean), "no new id");
    assert_eq!(
        world.accepted.keys().collect::<Vec<_>>(),
        clean.accepted.keys().collect::<Vec<_>>(),
        "every result accepted"
    );
    // Only a send that left before its sender was cut off reaches the destination twice.
    let repeats = world
        .accepted
        .iter()
        .filter(|(id, n)| **n > clean.accepted[*id])
        .count();
    assert!(repeats > 0 && repeats <= 2 * WAVE_RESULTS as usize / SENDERS / 2);
    assert!(world.accepted.values().all(|n| *n <= 2));
}

/// Rows a fanned-out step sends, committed with the same `sending` each (a wave's results
/// whose senders all answered nothing, or all answered): the waiting results at `now`.
fn fanned(p: &mut Progress, sending: Sending, now: i64) {
    let due: Vec<u64> = p.rows.keys().copied().collect();
    for index in due {
        assert!(p
            .finish_row(index, sending.clone(), now, &LIMITS, 0.5)
            .is_some());
    }
}

/// A wave of 12 results whose senders answered nothing, committed at `now`.
fn unanswered_wave(now: i64) -> Progress {
    let mut p = Progress::begin(Source::Inline, now);
    let to = Checkpoint {
        offset: 0,
        index: 12,
    };
    let claim = p.claim(to, true);
    let answers = failed(0..12).into_iter().map(|(item, _)| (item, silent()));
    p.commit(claim.chunk, answers.collect(), now, &LIMITS, 0.5);
    p
}

fn silent() -> Sending {
    Sending::Unanswered("result sender: no answer within 1 ms".into())
}

/// Senders that answer nothing past `EFFECT_ALERT_AFTER_SECONDS` raise one alert naming how
/// many results wait, park nothing, and keep sending; a sender's answer resolves it, and a
/// later spell alerts again.
#[test]
fn senders_answering_nothing_past_the_threshold_alert_once_and_resolve_when_one_answers() {
    let after = LIMITS.alert_after_ms;
    let mut p = unanswered_wave(0);
    assert_eq!(p.unanswered_since_ms, Some(0));
    assert_eq!(p.meter(Counts::default()).unwrap().unanswered, 12);
    // Within the threshold, and past it at the first attempt only: no alert.
    fanned(&mut p, silent(), after - 1);
    assert!(matches!(p.next(after), Step::WaitUntil(_)));
    fanned(&mut p, silent(), after);
    assert_eq!(p.next(after), Step::AlertSenders(12));
    p.senders_alert_marked(true);
    assert!(!matches!(p.next(after), Step::AlertSenders(_)), "once");
    fanned(&mut p, silent(), 3 * after);
    assert!(!matches!(p.next(3 * after), Step::AlertSenders(_)));
    // Nothing parked, nothing failed, and they are sent again after the backoff.
    assert_eq!((p.counts.parked, p.gave_up, p.rows.len()), (0, 0, 12));
    assert!(p.rows.values().all(|r| r.failing_since_ms.is_none()));
    assert_eq!(p.meter(p.counts).unwrap().failed, 0);
    // The gate's own sends (no sender) say nothing of the senders.
    let index = *p.rows.keys().next().unwrap();
    let retry = Sending::Answered(AttemptOutcome::Retry("503".into()));
    p.finish_row(index, retry, 3 * after, &LIMITS, 0.5);
    assert_eq!(p.unanswered_since_ms, Some(0));
    // A sender answers: resolved, once.
    let carried = Sending::Carried(AttemptOutcome::Retry("503".into()));
    fanned(&mut p, carried, 3 * after + 1);
    assert_eq!(p.unanswered_since_ms, None);
    assert_eq!(p.next(3 * after + 1), Step::SendersBack);
    p.senders_alert_marked(false);
    assert!(matches!(p.next(3 * after + 1), Step::WaitUntil(_)));
    // A later spell alerts again.
    let t = 4 * after;
    fanned(&mut p, silent(), t);
    fanned(&mut p, silent(), 2 * t);
    assert_eq!(p.next(2 * t), Step::AlertSenders(12));
}

/// A sender's answer before the threshold stops the clock: no alert. One that begins answering
/// nothing again starts it anew.
#[test]
fn a_sender_answering_before_the_threshold_clears_the_clock() {
    let after = LIMITS.alert_after_ms;
    let mut p = unanswered_wave(0);
    fanned(&mut p, silent(), after / 2);
    let carried = Sending::Carried(AttemptOutcome::Retry("503".into()));
    let index = *p.rows.keys().next().unwrap();
    p.finish_row(index, carried, after / 2 + 1, &LIMITS, 0.5);
    assert_eq!(p.unanswered_since_ms, None);
    fanned(&mut p, silent(), after + 1);
    assert_eq!(p.unanswered_since_ms, Some(after + 1));
    assert!(!matches!(p.next(after + 1), Step::AlertSenders(_)));
}

/// Once no result waits on a silent sender (the gate answered each itself), the senders' clock
/// stops: a later silence is timed from its own start, not from the old spell's.
#[test]
fn the_senders_clock_stops_once_no_result_waits_on_a_sender() {
    let after = LIMITS.alert_after_ms;
    let mut p = unanswered_wave(0);
    let indexes: Vec<u64> = p.rows.keys().copied().collect();
    let (delivered, failing) = indexes.split_at(6);
    for (i, index) in indexes.iter().enumerate() {
        let answer = match delivered.contains(index) {
            true => AttemptOutcome::Delivered,
            false => AttemptOutcome::Retry("503".into()),
        };
        p.finish_row(*index, Sending::Answered(answer), 10, &LIMITS, 0.5);
        let last = i + 1 == indexes.len();
        assert_eq!(p.unanswered_since_ms.is_none(), last, "after {}", i + 1);
    }
    // The results the destination failed go through silent senders, long after the old
    // spell began: their silence has just begun.
    fanned(&mut p, silent(), 2 * after);
    assert_eq!(p.rows.len(), failing.len());
    assert_eq!(p.unanswered_since_ms, Some(2 * after));
    assert!(!matches!(p.next(2 * after), Step::AlertSenders(_)));
    fanned(&mut p, silent(), 3 * after);
    assert_eq!(p.next(3 * after), Step::AlertSenders(6));
}

/// An alert raised while results waited for senders resolves before the job's effect once
/// nothing waits (the gate sent them itself); a pause stops the clock.
#[test]
fn the_senders_alert_resolves_once_nothing_waits_and_a_pause_stops_the_clock() {
    let after = LIMITS.alert_after_ms;
    let mut p = unanswered_wave(0);
    assert_eq!(
        p.held_by_pause(),
        Some(Vec::new()),
        "the clock stopped: stored"
    );
    assert_eq!(p.unanswered_since_ms, None);
    fanned(&mut p, silent(), after);
    assert!(!matches!(p.next(after), Step::AlertSenders(_)), "paused");
    fanned(&mut p, silent(), 2 * after);
    assert_eq!(p.next(2 * after), Step::AlertSenders(12));
    p.senders_alert_marked(true);
    fanned(&mut p, AttemptOutcome::Delivered.into(), 2 * after);
    assert_eq!(p.next(2 * after), Step::SendersBack);
    p.senders_alert_marked(false);
    assert!(matches!(p.next(2 * after), Step::Settled(_)));
}

/// A progress stored by the earlier build reads, and the new fields are not stored while
/// quiet.
#[test]
fn the_senders_clock_is_not_stored_while_quiet() {
    let p = Progress::begin(Source::Inline, 0);
    let text = serde_json::to_string(&p).unwrap();
    assert!(
        !text.contains("unanswered") && !text.contains("senders"),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<Progress>(&text).unwrap(), p);
    let mut p = unanswered_wave(0);
    p.senders_alert_marked(true);
    let mut back: Progress = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert!(back.rows.is_empty(), "the rows are stored as failure rows");
    back.rows = p.rows.clone();
    assert_eq!(back, p);
}

/// A value an earlier build stored with its waiting rows reads them (the edge moves them to
/// their failure rows), and is stored without them: the stored value is one bounded row.
#[test]
fn a_value_stored_with_its_rows_by_an_earlier_build_reads_them_and_is_stored_without() {
    let mut p = unanswered_wave(0);
    p.rows.get_mut(&3).unwrap().attempts = 7;
    let mut earlier = serde_json::to_value(&p).unwrap();
    let rows = serde_json::to_value(&p.rows).unwrap();
    earlier["rows"] = rows;
    earlier["rows"]["3"]["in_doubt"] = true.into();
    let read: Progress = serde_json::from_value(earlier).unwrap();
    assert_eq!(read, p, "its rows read, an earlier field ignored");
    let stored = serde_json::to_string(&read).unwrap();
    assert!(!stored.contains("\"rows\""), "{stored}");
}

#[test]
fn a_file_that_fails_after_a_long_read_is_waited_for_from_its_first_trouble() {
    let (mut p, _) = first_chunk_read();
    // The read went on for longer than the wait; then the server fails once.
    let late = 2 * FILE_WAIT_MS;
    p.file_failed(FileTrouble::Unavailable("503".into()), late, &LIMITS, 0.0);
    assert!(matches!(p.phase, Phase::WaitingForFile { failures: 1, .. }));
    p.file_failed(
        FileTrouble::Unavailable("503".into()),
        late + FILE_WAIT_MS - 1,
        &LIMITS,
        0.0,
    );
    assert!(matches!(p.phase, Phase::WaitingForFile { failures: 2, .. }));
    // Past the wait counted from that first trouble, the results are parked.
    p.file_failed(
        FileTrouble::Unavailable("503".into()),
        late + FILE_WAIT_MS,
        &LIMITS,
        0.0,
    );
    assert_eq!(
        p.phase,
        Phase::FileParked {
            reason: "503".into()
        }
    );
}

/// A claimed chunk whose read fails waits on the file's backoff (a waiting row still goes on
/// its own time), not sent again at once, over and over; past the wait the file is parked and
/// the claim dropped: one alert, the batch settles, and an operator's retry reads again from
/// the claim's start under its same chunk number, so none of its results is skipped.
#[test]
fn a_claimed_chunk_whose_file_fails_waits_its_backoff_then_parks_once() {
    let mut p = Progress::begin(Source::File { name: FILE.into() }, 0);
    p.claim(
        Checkpoint {
            offset: 100,
            index: 1,
        },
        false,
    );
    p.commit(0, failed(0..1), 0, &LIMITS, 0.0).unwrap();
    let row_at = p.rows[&0].next_at_ms.unwrap();
    let end = Checkpoint {
        offset: 900,
        index: 9,
    };
    let claim = p.claim(end, true);
    // A part of the claim goes again and is committed; the read of the rest fails.
    let reached = Checkpoint {
        offset: 400,
        index: 4,
    };
    let none = Vec::<(ResultItem, Sending)>::new();
    p.commit_through(1, reached, none, 5, &LIMITS, 0.0).unwrap();
    let rest = ChunkClaim {
        from: reached,
        ..claim
    };
    assert_eq!(
        p.done_through, rest.from,
        "a claim starts where the done part ends"
    );
    p.file_failed(FileTrouble::Unavailable("503".into()), 10, &LIMITS, 0.0);
    let Phase::WaitingForFile { next_at_ms, .. } = p.phase else {
        panic!("{:?}", p.phase);
    };
    assert!(next_at_ms > row_at && row_at > 10);
    assert_eq!(p.next(10), Step::WaitUntil(row_at), "no later than the row");
    assert_eq!(p.next_released(10), Step::RetryRows(vec![0]));
    assert_eq!(p.next(row_at), Step::RetryRows(vec![0]));
    let delivered = p.finish_row(0, &AttemptOutcome::Delivered, row_at, &LIMITS, 0.0);
    assert_eq!(delivered, Some(Write::Forget(0)));
    assert_eq!(p.next(row_at), Step::WaitUntil(next_at_ms));
    assert_eq!(p.next_released(row_at), Step::WaitUntil(next_at_ms));
    assert_eq!(
        p.next(next_at_ms),
        Step::ResendChunk(rest),
        "read again then"
    );
    // Still failing past the wait: parked, the claim dropped, one alert, then settled.
    let over = 10 + FILE_WAIT_MS;
    p.file_failed(FileTrouble::Unavailable("503".into()), over, &LIMITS, 0.0);
    assert_eq!(p.claim, None);
    assert_eq!(p.next(over), Step::Alert("503".into()));
    p.alerted = true;
    let Step::Settled(counts) = p.next(over + 1) else {
        panic!("{:?}", p.next(over + 1));
    };
    assert_eq!(counts["file_parked"], "503");
    // An operator's retry reads from the claim's start, as the same chunk.
    assert!(p.retry_parked(Vec::new(), over + 2).1, "the file is taken");
    let again = Step::ReadChunk {
        chunk: claim.chunk,
        from: rest.from,
    };
    assert_eq!(p.next(over + 2), again);
    assert_eq!(p.claim(end, true), rest);
}

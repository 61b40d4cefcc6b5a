//! One destination's desk as a pure state machine: its health (healthy, open, draining), its
//! probe, its pace, and the alerts it owes.
//!
//! Guarantees (docs/DESIGN.md, invariant 8):
//! - After [`DeskSettings::open_after`] health failures in a row (each within
//!   [`FAILURE_RUN_GAP_MS`] of the last: a first attempt's success is not reported, an asked
//!   retry's is) the destination is **open**:
//!   every effect that asks or reports a failure waits (its key queued, soonest due first),
//!   and the desk's alarm releases one key at a time as a **probe**, on a backoff from
//!   [`PROBE_FIRST_MS`] doubling to [`DeskSettings::probe_max_ms`].
//! - A success closes it: one "recovered" alert (how many waited, for how long), and the
//!   waiting keys are **drained** soonest first at the route's pace, or at [`DRAIN_PER_SECOND`]
//!   for an unpaced one, in batches of at most [`MAX_RELEASES_PER_RUN`] per alarm run.
//! - A paced route's releases follow a token bucket (`per_second`, [`Pace::burst`] tokens) and
//!   its attempts in flight stay within `concurrency`; each slot lapses after
//!   [`DeskSettings::slot_ttl_ms`], so a gate that died never holds one.
//! - A probe rotates over the waiting keys: a probe that fails (or any attempt that fails while
//!   the destination is open, a lapsed probe's late report included) queues its key behind
//!   every key that waited before it (due at the failure), and a key keeps that place when its
//!   gate asks again ([`Desk::queue_place`]), so one throttled or refused key is not probed twice in
//!   a row while others wait. A key that could not send (its release found
//!   nothing to send: a results file missing, a download refused) leaves the queue, and is
//!   not a failed probe: it asks again, on its own schedule, once it can send (its gate tries
//!   the file first, [`crate::results::turn::reads_first`]), and the next key is probed at once.
//! - An operator may **pause** it by hand ([`Desk::pause`], stored with who and why): every
//!   ask and report is then answered [`DeskReply::Paused`] and its key queued in its place,
//!   nothing is released and no probe goes until [`Desk::resume`], which drains what waited
//!   soonest first. A pause is not health: it never opens the desk nor closes it, counts no
//!   failure, raises no alert, and drops nothing.
//! - One alert when it opens, one when it recovers (its resolution: `resolves`
//!   `destination_open`); both are kept until the sink takes them, at most
//!   [`MAX_OWED_ALERTS`] (beyond that the oldest is dropped and counted), and a sink that
//!   refuses is tried again [`ALERT_RETRY_MS`] later, never holding a release back.
//!
//! The edge keeps the waiting keys and the slots in SQLite tables and gives this machine their
//! counts ([`Facts`]); the machine says what to do with the key at hand ([`Decision`]) and how
//! many to release ([`Wake`]). Time is an input.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::alert_line::{hashed_id, text};
use crate::destination::protocol::{DeskReply, DeskSettings, DeskView, Pace, PauseNote, Sent};
use crate::destination_label::destination_parts;
use crate::retry::Backoff;

/// The first wait between probes: short, so a blip is over in seconds.
pub const PROBE_FIRST_MS: i64 = 2_000;
/// An unpaced destination's drain rate: recovering at once would be a stampede, an hour
/// later too late; 50 a second drains 10,000 waiting effects in under four minutes.
pub const DRAIN_PER_SECOND: u32 = 50;
/// Releases (one gate call each) per alarm run: within a Durable Object's subrequests, with
/// room for the alerts.
pub const MAX_RELEASES_PER_RUN: u32 = 50;

/// What the edge's tables hold, counted before a decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// Keys waiting (`waiting` table).
    pub waiting: u64,
    /// Live slots (`slots` table, lapsed ones deleted first).
    pub in_flight: u64,
    /// The soonest waiting key's due (0 when none waits): a key whose gate could not be
    /// reached is due again only after its own backoff, and no run releases it sooner.
    pub next_due_ms: i64,
}

/// What the edge does with the key at hand, beside answering `reply`.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub reply: DeskReply,
    /// Queue the key (keeping the sooner due if it is already queued).
    pub enqueue: bool,
    /// Queue it due at this time rather than when it became owed: a key whose attempt failed
    /// while the destination is open goes behind every key that waited before it (and stays
    /// there, [`Desk::queue_place`]).
    pub queue_at_ms: Option<i64>,
    /// Take this many slots for the key until `slot_ttl_ms` from now (one for an effect, one
    /// a result for a batch's chunk).
    pub slots: u32,
    /// Set the alarm at this time (sooner alarms stand).
    pub alarm_at_ms: Option<i64>,
}

impl Decision {
    fn reply(reply: DeskReply) -> Decision {
        Decision {
            reply,
            enqueue: false,
            queue_at_ms: None,
            slots: 0,
            alarm_at_ms: None,
        }
    }
}

/// What one alarm run does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Release the soonest waiting key as a probe.
    Probe,
    /// Release up to this many waiting keys, soonest first.
    Drain(u32),
    /// Nothing to release now.
    Idle,
}

/// The attempt let go while the destination is open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeOut {
    pub key: String,
    pub sent_ms: i64,
}

/// The desk's stored state (one row).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Desk {
    pub settings: Option<DeskSettings>,
    pub failures_in_row: u32,
    /// When the last health failure was reported.
    #[serde(default)]
    pub last_failure_ms: i64,
    pub opened_at_ms: Option<i64>,
    pub last_error: Option<String>,
    pub probe: Option<ProbeOut>,
    pub probe_wait_ms: i64,
    pub next_probe_ms: i64,
    /// The token bucket: the earliest time the next release may leave (GCRA).
    pub next_slot_ms: i64,
    /// Effects that waited through the last outage (counted when it closed).
    pub waited: u64,
    /// Alerts owed to the sink, oldest first.
    #[serde(default)]
    pub alerts: Vec<Value>,
    /// Owed alerts dropped (the oldest, past [`MAX_OWED_ALERTS`]) and not yet logged.
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub alerts_dropped: u64,
    /// When the owed alerts may be tried again (after the sink refused one).
    #[serde(default, skip_serializing_if = "crate::is_default")]
    pub alerts_due_ms: i64,
    /// Asks and reports received: what the destination's health and pace cost in calls (the
    /// happy path's first attempt makes none).
    #[serde(default)]
    pub calls: u64,
    /// A pause an operator set by hand: nothing is released until it is resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<PauseNote>,
}

impl Desk {
    /// Whether the destination is open (failing).
    pub fn is_open(&self) -> bool {
        self.opened_at_ms.is_some()
    }

    /// The route's pace (none before the first command names it).
    pub fn pace(&self) -> Pace {
        self.settings.as_ref().map(|s| s.pace).unwrap_or_default()
    }

    /// The destination's label (empty before the first command names it).
    pub fn label(&self) -> String {
        let settings = self.settings.as_ref();
        settings.map(|s| s.label.clone()).unwrap_or_default()
    }

    /// Takes the route's next token if it falls due by `by`: when it may be used (`now` at the
    /// soonest). Tokens taken ahead hold everyone else's back as if spent at their time.
    fn take_token_by(&mut self, pace: Pace, in_flight: u64, now: i64, by: i64) -> Option<i64> {
        if pace.concurrency.is_some_and(|c| in_flight >= u64::from(c)) {
            return None;
        }
        let Some(rate) = pace.per_second else {
            return Some(now);
        };
        let interval = interval_ms(rate);
        let floor = now - i64::from(pace.burst() - 1) * interval;
        let next = self.next_slot_ms.max(floor);
        if next > by {
            return None;
        }
        self.next_slot_ms = next + interval;
        Some(next.max(now))
    }

    /// A key asks for `n` attempts (a job's effect for one, a batch's step for its
    /// results): they wait as one key (queued, soonest owed first) while the destination is
    /// open or others wait before it; an unpaced route lets them all go; a paced one as many as
    /// its slots allow and its tokens within [`PACED_SPREAD_MS`] (a slot each, each attempt
    /// made when its token is due), and the key waits its turn when none is free now.
    pub fn ask(&mut self, n: u32, facts: Facts, now: i64) -> Decision {
        if self.paused.is_some() {
            return Self::hold();
        }
        if self.is_open() || facts.waiting > 0 {
            return self.wait(now);
        }
        let pace = self.pace();
        if !pace.limits() {
            let (n, after_ms) = (n.max(1), Vec::new());
            return Decision::reply(DeskReply::Granted { n, after_ms });
        }
        let mut after_ms = Vec::new();
        let in_flight = |taken: usize| facts.in_flight + taken as u64;
        // The first token must be due now: a batch ahead of its turn waits in the queue.
        let mut by = now;
        while after_ms.len() < n as usize {
            let Some(at) = self.take_token_by(pace, in_flight(after_ms.len()), now, by) else {
                break;
            };
            after_ms.push(at - now);
            by = now + PACED_SPREAD_MS;
        }
        match after_ms.len() as u32 {
            0 => self.wait(now),
            n => Decision {
                slots: n,
                ..Decision::reply(DeskReply::Granted { n, after_ms })
            },
        }
    }

    /// Paused: the key is queued in its place; only a resume releases it (no alarm).
    fn hold() -> Decision {
        Decision {
            enqueue: true,
            ..Decision::reply(DeskReply::Paused)
        }
    }

    fn wait(&mut self, now: i64) -> Decision {
        Decision {
            enqueue: true,
            alarm_at_ms: Some(self.next_wake_ms(now)),
            ..Decision::reply(DeskReply::Wait)
        }
    }

    /// Wait, queued behind every key that waited before (due now).
    fn behind(&mut self, now: i64) -> Decision {
        Decision {
            queue_at_ms: Some(now),
            ..self.wait(now)
        }
    }

    /// `reply`, and the alarm runs now (a freed slot or probe lets the next go).
    fn alarm_now(reply: DeskReply, now: i64) -> Decision {
        Decision {
            alarm_at_ms: Some(now),
            ..Decision::reply(reply)
        }
    }

    /// When the alarm should next run while keys wait.
    fn next_wake_ms(&self, now: i64) -> i64 {
        if self.is_open() {
            return match &self.probe {
                Some(p) => p.sent_ms + self.probe_lapse_ms(),
                None => self.next_probe_ms.max(now),
            };
        }
        self.next_slot_ms.max(now)
    }

    /// How long a probe may go without its report before another is sent: a gate that lost
    /// its release (an operator forgot the operation, a report that never arrived) must not
    /// hold the destination shut for a whole claim TTL.
    fn probe_lapse_ms(&self) -> i64 {
        self.slot_ttl_ms().min(PROBE_LAPSE_MS)
    }

    /// How long a slot the desk hands out is held without its report.
    pub fn slot_ttl_ms(&self) -> i64 {
        self.settings.as_ref().map_or(600_000, |s| s.slot_ttl_ms)
    }

    /// The attempts the desk let go for `key` ended ([`Sent`]: one, a job's effect; a step's, a
    /// batch's results, sent at once and back in no order, so "in a row" is read as "all of them").
    /// Its slots (if any) are freed by the edge. When every one was a health failure, each counts
    /// (a chunk that fails whole opens the destination); when none was, it is a success; a chunk of
    /// both says neither (its failures back off on their own, and a run of failures the job's
    /// effects built stands). None sent: it could not send (a results file missing, a download
    /// refused), says nothing of health and leaves the queue until it can (it asks again then); a
    /// probe that sent nothing is not a failed one, and the next key is probed at once. An answer
    /// that asked for a wait (`asked_wait_ms`, from `Retry-After`) holds the next probe, once open,
    /// no sooner than that (up to [`DeskSettings::asked_max_ms`]).
    pub fn report(&mut self, key: &str, sent: Sent, facts: Facts, now: i64) -> Decision {
        let failures = sent.failures;
        // A probe that reports is over (a failed one backs off below), but for a chunk that
        // was neither on a desk that is not open: that report leaves the desk as it stands.
        let was_probe = self.probe.as_ref().is_some_and(|p| p.key == key);
        let mixed = failures > 0 && failures < sent.sent;
        if was_probe && (self.paused.is_some() || !mixed || self.is_open()) {
            self.probe = None;
        }
        if sent.sent == 0 {
            // It could not send: it leaves the queue until it can (it asks again then), and
            // says nothing of the destination, so the next key is probed at once.
            return Self::alarm_now(DeskReply::OwnSchedule, now);
        }
        if self.paused.is_some() {
            // A report while paused says nothing of health (a pause is not a failure, nor is
            // an answer a recovery): the key waits in its place for the resume.
            return Self::hold();
        }
        if mixed {
            // A chunk that was neither (a probe's or not): while open its key goes behind the
            // rest; else its slots are freed, and what waits may go.
            return match self.is_open() {
                true => self.behind(now),
                false => Self::alarm_now(DeskReply::OwnSchedule, now),
            };
        }
        let failed = sent.failure.filter(|_| failures > 0).map(|f| (f, failures));
        let decision = self.report_inner(was_probe, failed, facts, now);
        if let Some(asked) = sent.asked_wait_ms.filter(|_| self.is_open()) {
            let cap = self.settings.as_ref().map_or(3_600_000, |s| s.asked_max_ms);
            self.next_probe_ms = self.next_probe_ms.max(now + asked.clamp(0, cap.max(0)));
            if decision.enqueue {
                return Decision {
                    queue_at_ms: decision.queue_at_ms,
                    ..self.wait(now)
                };
            }
        }
        decision
    }

    fn report_inner(
        &mut self,
        was_probe: bool,
        failed: Option<(String, u32)>,
        facts: Facts,
        now: i64,
    ) -> Decision {
        let Some((error, count)) = failed else {
            self.failures_in_row = 0;
            if self.is_open() {
                // What waited: the queue, and the probe (or other attempt) that just succeeded.
                self.close(facts.waiting + 1, now);
            }
            // Closing starts the drain; a freed slot lets the next waiting key go.
            return Self::alarm_now(DeskReply::Noted, now);
        };
        // First attempts that succeed are never reported (the happy path pays nothing), so
        // "in a row" also means close together: a failure long after the last starts a new run.
        if now - self.last_failure_ms > FAILURE_RUN_GAP_MS {
            self.failures_in_row = 0;
        }
        self.last_failure_ms = now;
        self.failures_in_row = self.failures_in_row.saturating_add(count);
        self.last_error = Some(error);
        if was_probe {
            // Behind every key that waited before it: the next probe tries another.
            self.probe_failed(now);
            return self.behind(now);
        }
        if self.is_open() {
            // Not the probe (a probe that lapsed and reported late, an attempt that was in
            // flight when it opened): it failed all the same, and goes behind as a probe would.
            return self.behind(now);
        }
        let open_after = self.settings.as_ref().map_or(5, |s| s.open_after);
        if self.failures_in_row >= open_after {
            self.open(now);
            return self.wait(now);
        }
        Decision::reply(DeskReply::OwnSchedule)
    }

    fn open(&mut self, now: i64) {
        self.opened_at_ms = Some(now);
        self.probe = None;
        self.probe_wait_ms = PROBE_FIRST_MS;
        self.next_probe_ms = now + PROBE_FIRST_MS;
        let label = self.label();
        let what = format!(
            "{} is failing ({} failures in a row, last: {}): its side effects wait and one probe at a time tries it",
            destination_parts(&label).1,
            self.failures_in_row,
            self.last_error.as_deref().unwrap_or("?")
        );
        self.owe(json!({
            "alert": "destination_open",
            "alert_id": hashed_id(&format!("destination_open#{label}#{now}")),
            "key": label,
            "name": destination_parts(&label).0,
            "age_seconds": 0,
            "destination": label,
            "last_error": self.last_error,
            "text": text("destination_open", destination_parts(&label).0, "destination", &what),
        }));
    }

    fn probe_failed(&mut self, now: i64) {
        self.probe_wait_ms = self.probe_backoff().following(self.probe_wait_ms);
        // A wait the destination asked for (already in `next_probe_ms`) stands.
        self.next_probe_ms = self.next_probe_ms.max(now + self.probe_wait_ms);
    }

    /// The probes' backoff, from [`PROBE_FIRST_MS`] doubling to [`DeskSettings::probe_max_ms`]:
    /// also how far a key whose gate could not be reached for its probe moves back, by its
    /// misses in a row (`after(misses)`), so the keys behind it are probed first.
    pub fn probe_backoff(&self) -> Backoff {
        let max_ms = self.settings.as_ref().map_or(15_000, |s| s.probe_max_ms);
        Backoff::new(PROBE_FIRST_MS, max_ms)
    }

    /// An alarm run owed a probe and released none, because no waiting key was due or the
    /// gates it tried could not be reached: counts as a failed probe, so the next run is
    /// at least [`PROBE_FIRST_MS`] away (a desk never spins on a gate it cannot reach).
    pub fn probe_missed(&mut self, now: i64) {
        self.probe = None;
        self.probe_failed(now);
    }

    fn close(&mut self, waited: u64, now: i64) {
        let opened = self.opened_at_ms.take().unwrap_or(now);
        let secs = (now - opened) / 1_000;
        self.probe = None;
        self.waited = waited;
        let label = self.label();
        let (name, shown) = destination_parts(&label);
        let what = format!(
            "{shown} recovered after {secs} s; {waited} side effects waited and are being drained"
        );
        self.owe(json!({
            "alert": "destination_recovered",
            "resolves": "destination_open",
            "alert_id": hashed_id(&format!("destination_recovered#{label}#{now}")),
            "key": label,
            "name": name,
            "age_seconds": secs,
            "destination": label,
            "waited": self.waited,
            "outage_seconds": secs,
            "text": text("destination_recovered", name, "destination", &what),
        }));
    }

    /// What an alarm run releases, given the tables' counts: a probe while open (when its
    /// backoff is over and no probe is out, or the one out lapsed), else as many as the pace
    /// allows. Takes the tokens it hands out.
    pub fn wake(&mut self, facts: Facts, now: i64) -> Wake {
        if self.paused.is_some() || facts.waiting == 0 || facts.next_due_ms > now {
            return Wake::Idle;
        }
        if self.is_open() {
            if let Some(p) = &self.probe {
                if p.sent_ms + self.probe_lapse_ms() > now {
                    return Wake::Idle;
                }
                // A probe that never reported counts as a failed one.
                self.probe_missed(now);
            }
            return match now >= self.next_probe_ms {
                true => Wake::Probe,
                false => Wake::Idle,
            };
        }
        let pace = self.pace();
        let cap = facts.waiting.min(u64::from(MAX_RELEASES_PER_RUN)) as u32;
        if !pace.limits() {
            // Unpaced: a batch a run, spaced so the drain runs at DRAIN_PER_SECOND.
            if now < self.next_slot_ms {
                return Wake::Idle;
            }
            self.next_slot_ms = now + i64::from(cap) * 1_000 / i64::from(DRAIN_PER_SECOND);
            return Wake::Drain(cap);
        }
        let mut n = 0;
        let in_flight = |n: u32| facts.in_flight + u64::from(n);
        while n < cap && self.take_token_by(pace, in_flight(n), now, now).is_some() {
            n += 1;
        }
        match n {
            0 => Wake::Idle,
            n => Wake::Drain(n),
        }
    }

    /// Where `key` goes in the queue (its `due_ms`, soonest released first) after `decision`,
    /// given where it waits now (`waiting`, if it does) and when its effect became owed
    /// (`owed_ms`, what the gate sends). A key keeps its place: an ask (a gate's fallback, a
    /// pass's retry) never moves it ahead of where it waits. Only a failure while open moves
    /// it, behind every key that waited before (`queue_at_ms`); and a key out as the probe
    /// that asks again (its release and its own fallback crossed) goes behind too, its probe
    /// judged by its report. So a key that keeps failing is not probed again while others
    /// wait, however often its gate asks. `None`: it is not queued.
    pub fn queue_place(
        &self,
        key: &str,
        waiting: Option<i64>,
        owed_ms: i64,
        decision: &Decision,
        now: i64,
    ) -> Option<i64> {
        if !decision.enqueue {
            return None;
        }
        let out = self.probe.as_ref().is_some_and(|p| p.key == key);
        let owed = if out { now } else { owed_ms };
        Some(decision.queue_at_ms.or(waiting).unwrap_or(owed))
    }

    /// A key the alarm released was made due by its gate; a probe is remembered until it reports.
    pub fn released(&mut self, key: &str, probe: bool, sent_ms: i64) {
        if probe {
            let key = key.to_string();
            self.probe = Some(ProbeOut { key, sent_ms });
        }
    }

    /// Owes the sink `alert`, dropping (and counting) the oldest beyond [`MAX_OWED_ALERTS`]:
    /// a sink down for days must not grow the desk's row without end.
    fn owe(&mut self, alert: Value) {
        self.alerts.push(alert);
        while self.alerts.len() > MAX_OWED_ALERTS {
            self.alerts.remove(0);
            self.alerts_dropped += 1;
        }
    }

    /// Whether the owed alerts are to be sent now (some are owed, and the sink did not refuse
    /// within the last [`ALERT_RETRY_MS`]).
    pub fn alerts_due(&self, now: i64) -> bool {
        !self.alerts.is_empty() && now >= self.alerts_due_ms
    }

    /// The sink accepted the first `sent` owed alerts and refused the next, if `refused`.
    pub fn alerts_tried(&mut self, sent: usize, refused: bool, now: i64) {
        self.alerts.drain(..sent.min(self.alerts.len()));
        self.alerts_due_ms = if refused { now + ALERT_RETRY_MS } else { 0 };
    }

    /// When the alarm should run next, after a run (`None`: nothing waits and nothing is owed):
    /// the releases' schedule, or the alerts' retry when that is sooner; owed alerts never
    /// push a release back.
    pub fn next_alarm_ms(&self, facts: Facts, now: i64) -> Option<i64> {
        let release = self.release_alarm_ms(facts, now);
        if self.alerts.is_empty() {
            return release;
        }
        let alerts = self.alerts_due_ms.max(now + MIN_ALARM_GAP_MS);
        Some(release.map_or(alerts, |r| r.min(alerts)))
    }

    fn release_alarm_ms(&self, facts: Facts, now: i64) -> Option<i64> {
        if facts.waiting == 0 || self.paused.is_some() {
            return None;
        }
        let full = |c| facts.in_flight >= u64::from(c);
        if !self.is_open() && self.pace().concurrency.is_some_and(full) {
            // Slots free on reports (which set the alarm); a lapsed one frees with its TTL.
            return Some(now + self.slot_ttl_ms().min(ALERT_RETRY_MS));
        }
        Some(
            self.next_wake_ms(now)
                .max(facts.next_due_ms)
                .max(now + MIN_ALARM_GAP_MS),
        )
    }

    /// A check before a first attempt: it must ask while the destination is paused or open.
    pub fn check(&self) -> DeskReply {
        let ask = self.paused.is_some() || self.is_open();
        DeskReply::Checked { ask }
    }

    /// An operator pauses the destination: stored with who and why (a pause already set
    /// stands, with its first author). True when this changed it.
    pub fn pause(&mut self, by: Value, reason: String, at_ms: i64) -> bool {
        if self.paused.is_some() {
            return false;
        }
        self.paused = Some(PauseNote { by, reason, at_ms });
        true
    }

    /// An operator resumes it: what waited is released from the next alarm, soonest first
    /// (a probe first, if it was open before the pause). True when it was paused.
    pub fn resume(&mut self) -> bool {
        self.paused.take().is_some()
    }

    /// The view `/v1/stats` shows.
    pub fn view(&self, facts: Facts) -> DeskView {
        let state = match (self.paused.is_some(), self.is_open(), facts.waiting) {
            (true, _, _) => "paused",
            (false, true, _) => "open",
            (false, false, 0) => "healthy",
            (false, false, _) => "draining",
        };
        DeskView {
            label: self.label(),
            state: state.to_string(),
            waiting: facts.waiting,
            in_flight: facts.in_flight,
            failures_in_row: self.failures_in_row,
            last_error: self.last_error.clone(),
            opened_at_ms: self.opened_at_ms,
            pace: self.pace(),
            calls: self.calls,
            paused: self.paused.clone(),
        }
    }
}

/// How far ahead a batch's chunk may take a paced route's tokens: its results then go spaced at
/// the pace within one run of the batch's alarm (a chunk of 40 at 10 a second), so a slow pace
/// does not cost an alarm run, two desk calls and two rows a result.
pub const PACED_SPREAD_MS: i64 = 4_000;
/// Failures further apart than this are not "in a row": successes in between go unreported.
pub const FAILURE_RUN_GAP_MS: i64 = 30_000;
/// The longest a probe goes unreported before the next: well past an attempt's timeout
/// (`EFFECT_TIMEOUT_MS`, 5 s by default) and the runtime's 30 s grace.
pub const PROBE_LAPSE_MS: i64 = 60_000;
/// How soon the desk tries an alert sink again after a failure.
pub const ALERT_RETRY_MS: i64 = 30_000;
/// Alerts a desk keeps for a sink that is down: ten outages, each opened and recovered.
pub const MAX_OWED_ALERTS: usize = 20;

/// The shortest wait between alarm runs that release nothing (no spin on a clock edge).
const MIN_ALARM_GAP_MS: i64 = 10;

/// Milliseconds between releases at `per_second`.
fn interval_ms(per_second: u32) -> i64 {
    (1_000 / i64::from(per_second.max(1))).max(1)
}

#[cfg(test)]
mod tests;

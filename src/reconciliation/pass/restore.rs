//! Gemini's bad day: a pass that finds the webhook `disabled_due_to_failed_deliveries`
//! enables it again through the WebhookService (`PATCH v1beta/webhooks/{id}?update_mask=state`
//! with `{"state":"enabled"}`, the call `npm run connect` makes), sweeps every open operation's
//! poll onto the fan-out queue instead of walking in its usual order, and alerts what it did.
//! This module decides (what is restored, what the alert says) and announces; `webhook.rs`
//! makes the call, and `walk.rs` sweeps.
//!
//! Guarantees: only that state is restored. `disabled` (a person's doing), `not_found` and any
//! other state are left alone, as is every state with `GEMINI_WEBHOOK_AUTO_ENABLE=false`;
//! each is alerted once per state change (`webhook.rs`), saying why it was left.
//! The pass restores only when it shows the worker answering, and what it shows is this: it
//! runs in the deployed worker, the same script that answers `/webhooks/gemini`, so the
//! configuration parses (otherwise every route, the webhook's included, answers 503 and no pass
//! runs); it holds the lease (a Durable Object answered, as the intake's gates must); and KV,
//! which the intake writes, is bound. It cannot show that Gemini reaches the worker's URL: if
//! Gemini still cannot, it disables the webhook again, and the next pass restores and alerts
//! again, so a loop is seen.
//! One enabling call per pass at most, made only with room for it, the alert and the release;
//! a call that fails changes nothing, is alerted once per state with its error (and logged
//! `webhook_enable_failed`), and is made again by the next pass.
//! Once Gemini answers that the webhook is enabled, the mark the lease keeps is cleared (a
//! later disabling alerts and restores again), and, with the queue bound, the routine walk
//! starts at the index's start and hands the whole window to the fan-out queue whatever its
//! size (`RECONCILE_FANOUT_ABOVE` aside), without waiting for copies of earlier passes still
//! queued (an entry among them may be polled twice), still after the slots already taken, at
//! `RECONCILE_POLL_RATE`, and at most one cron interval ahead: what does not fit is scheduled
//! by the next passes from where it stopped. Without a queue the walk keeps its usual order.
//! The `webhook_reenabled` alert is sent once the walk has scheduled (so it says how many),
//! once and best effort; the `webhook_enabled` line is logged whatever becomes of it.

use crate::operation::alert::webhook_reenabled;
use crate::reconciliation::pass::stop::Stop;
use crate::reconciliation::status::DISABLED_FOR_FAILURES;

use super::{Awaiting, Fanout, Intent, Pass, Phase};

/// What a pass does about a webhook that is not `enabled`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Enable webhook `id` again.
    Restore { id: String },
    /// Leave it as it is: `why`, for the alert.
    Leave { why: String },
}

/// What to do about a webhook in `state` (not `enabled`), known by `id`, with
/// `GEMINI_WEBHOOK_AUTO_ENABLE` at `auto_enable`, given whether the pass shows the worker
/// answering (`Err`: what it lacks).
pub(super) fn verdict(
    state: &str,
    id: Option<&str>,
    auto_enable: bool,
    answering: Result<(), String>,
) -> Verdict {
    let leave = |why: String| Verdict::Leave { why };
    match (state, id, answering) {
        (DISABLED_FOR_FAILURES, _, _) if !auto_enable => leave(
            "GEMINI_WEBHOOK_AUTO_ENABLE=false: left disabled; npm run connect enables it.".into(),
        ),
        (DISABLED_FOR_FAILURES, _, Err(lacking)) => leave(format!(
            "Left disabled: this pass cannot show the worker answering ({lacking})."
        )),
        (DISABLED_FOR_FAILURES, None, Ok(())) => leave(
            "Left disabled: the listing gives no id to enable it by; npm run connect enables it."
                .into(),
        ),
        (DISABLED_FOR_FAILURES, Some(id), Ok(())) => Verdict::Restore { id: id.to_string() },
        ("disabled", _, _) => {
            leave("Disabled by a person: left alone; npm run connect enables it again.".into())
        }
        ("not_found", _, _) => {
            leave("Not in the project's webhook listing: npm run connect creates it.".into())
        }
        _ => leave("An unknown state: left as it is.".into()),
    }
}

/// What the `webhook_reenabled` alert says was done about the completions missed meanwhile:
/// with the queue (`fanout`), how many entries the sweep scheduled (`fed`) and, from why the
/// walk stopped, whether that was all of them.
pub(super) fn swept_text(fanout: Option<&Fanout>, fed: u64, stop: Option<Stop>) -> String {
    let Some(fanout) = fanout else {
        return "No fan-out queue is bound (RECONCILE_QUEUE): the open operations are polled in the passes' usual order.".into();
    };
    let swept = format!(
        "Swept: {fed} open operations scheduled for a poll on the fan-out queue, {} a second.",
        fanout.rate_per_s
    );
    let rest = match stop {
        Some(Stop::Complete | Stop::HeldForBackoff) => " That is every open operation the index lists (the youngest wait out RECONCILE_GRACE_SECONDS).".to_string(),
        Some(Stop::Window) => " The index's next window follows in the next pass.".to_string(),
        Some(Stop::Scheduled) => " The rest, past one cron interval of polls, is scheduled by the next passes.".to_string(),
        Some(other) => format!(
            " The pass stopped early ({}): the next passes go on from where it stopped.",
            crate::telemetry::log_event::name_of(&other)
        ),
        None => String::new(),
    };
    swept + &rest
}

/// A webhook this pass enabled again, and its sweep.
#[derive(Debug)]
pub(super) struct Sweep {
    pub(super) webhook: String,
    /// The state it was in.
    pub(super) was: String,
    /// Whether its alert has been asked for.
    pub(super) announced: bool,
}

impl Pass {
    /// Whether this pass shows the worker answering (see the module documentation): it holds
    /// the lease by now, and its configuration parsed, or it would not run; KV must be bound.
    pub(super) fn answering(&self) -> Result<(), String> {
        self.kv_unbound
            .as_ref()
            .map_or(Ok(()), |e| Err(format!("KV: {e}")))
    }

    /// Whether the routine walk sweeps: a webhook was enabled again and a queue is bound.
    pub(super) fn sweeping(&self) -> bool {
        self.sweep.is_some() && self.books.limits.fanout.is_some()
    }

    /// The routine walk has ended: the webhook enabled again is alerted before what comes next.
    pub(super) fn announce_after_walk(&mut self) {
        if let Some(sweep) = self.sweep.as_mut().filter(|s| !s.announced) {
            sweep.announced = true;
            let next = std::mem::replace(&mut self.phase, Phase::Done);
            self.phase = Phase::Announce(Box::new(next));
        }
    }

    /// Posts the `webhook_reenabled` alert, then goes on to `next`.
    pub(super) fn announce_step(&mut self, next: Phase) -> Option<Intent> {
        let Some(sweep) = &self.sweep else {
            self.phase = next;
            return None;
        };
        let stop = super::walked(&next).map(|w| w.end.1);
        let fanout = self.books.limits.fanout.as_ref();
        let done = swept_text(fanout, self.books.report.fed, stop);
        let alert = Intent::PostAlert(webhook_reenabled(&sweep.webhook, &sweep.was, &done));
        self.call(Phase::Announce(Box::new(next)), Awaiting::Announce, alert)
    }

    /// Whether the `webhook_reenabled` alert was sent (once, best effort: the
    /// `webhook_enabled` line says it all the same).
    pub(super) fn on_announced(&mut self, sent: bool) {
        self.books.report.alerts += u64::from(sent);
        self.phase = match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Announce(next) => *next,
            other => other,
        };
    }
}

//! Where a batch's results are, asked once when they begin (and again after an operator's
//! retry when it could not be said): the outcome's `responsesFile`, else the status answer's
//! file or inline items.
//!
//! Guarantees: the status call takes a slot of the project's one status budget from the
//! reconciliation lease first (as a nudge's confirmation does), and a 429 or 5xx backs every
//! status call off for its `Retry-After` ([`crate::results::source::unlocated`] decides); an
//! answer that names no results in a usable form parks them with the reason, never zero
//! results; inline items are stored as the answer streams in (never held whole), then their
//! stable order, once.

use worker::Result;

use crate::operation::gate::alarm::slot_wait;
use crate::operation::key::Collection;
use crate::operation::Operation;
use crate::reconciliation::status::status_url;
use crate::results::item::Source;
use crate::results::progress::{Phase, Progress};
use crate::results::source::{file_of_details, unlocated, Found, StatusTrouble, Unlocated};

use crate::edge::objects::call::{status_backoff, status_slot};
use crate::edge::outbound::results_file::status_results;
use crate::edge::runtime::{now_ms, random_unit};

use super::Driver;

/// What the results' status call said.
enum Located {
    /// The results' source, and when the batch ended (when the answer says).
    Found(Source, Option<i64>),
    /// The status budget said to wait until then: nothing was asked.
    WaitForSlot(i64),
    /// No usable answer.
    Failed(StatusTrouble),
}

impl Driver<'_> {
    /// Where the results are: the outcome's `responsesFile`, else the status answer's file or
    /// inline items (stored once, in their stable order). `Err(at)` when the status API is to be
    /// asked again then: its budget said wait, or it gave no answer yet (within the file's wait;
    /// counted from `since`, an operator's retry, when it is asked again after one).
    pub(super) async fn begin(
        &self,
        op: &Operation,
        now: i64,
        since: Option<i64>,
    ) -> Result<std::result::Result<Progress, i64>> {
        let since = since.unwrap_or_else(|| op.settled_at_ms().unwrap_or(now));
        let mut progress = Progress::begin(Source::Inline, since);
        progress.ended_ms = Some(op.update_time_ms()).filter(|&t| t > 0);
        match file_of_details(op.details()) {
            Some(name) => progress.source = Source::File { name },
            None => match self.source_in_status(op).await? {
                Located::Found(source, ended) => {
                    progress.source = source;
                    progress.ended_ms = ended.or(progress.ended_ms);
                }
                Located::WaitForSlot(at) => return Ok(Err(at)),
                Located::Failed(trouble) => {
                    let (next, backoff) = unlocated(&trouble, now_ms(), since, &self.limits);
                    status_backoff(self.env, self.storage.meter(), backoff).await;
                    match next {
                        Unlocated::AskAt(at) => return Ok(Err(at)),
                        // Gemini cannot say where the results are: they are parked, with the reason.
                        Unlocated::Park(reason) => {
                            progress.phase = Phase::FileParked { reason };
                            progress.unlocated = true;
                        }
                    }
                }
            },
        }
        // A step whose record is unchanged (no await since the inline order was stored).
        self.store_progress(op.clone(), progress.clone()).await?;
        Ok(Ok(progress))
    }

    /// The status answer's results (a file, or inline items stored here) and when the batch
    /// ended, asked in a slot of the project's one status budget (the reconciliation lease's,
    /// as a nudge's confirmation takes one). An answer that names neither in a usable form is
    /// unreadable (parked, alerted).
    async fn source_in_status(&self, op: &Operation) -> Result<Located> {
        let meter = self.storage.meter();
        let slot = status_slot(self.env, meter, self.config.reconcile_poll_rate).await;
        if let Some(at) = slot_wait(slot, now_ms(), &self.gate, random_unit()) {
            return Ok(Located::WaitForSlot(at));
        }
        let base = &self.config.gemini_api_base;
        let url = status_url(base, Collection::Batches, op.key(), op.name());
        self.storage.meter().add(|u| u.outbound_fetches += 1);
        // Inline items are stored as the answer streams in, never held whole: a staging outside
        // the gate's commit, cleared before every read and read only once a committed progress
        // names `Source::Inline`.
        self.store.clear_inline()?;
        let store = |entries| self.store.put_entries(entries);
        let located = match status_results(self.config, &url, store).await {
            Ok(located) => located,
            Err(trouble) => return Ok(Located::Failed(trouble)),
        };
        let source = match located.found {
            Found::File(name) => Source::File { name },
            Found::Inline { .. } => {
                self.store.put_order(located.places)?;
                Source::Inline
            }
        };
        Ok(Located::Found(source, located.ended_ms))
    }
}

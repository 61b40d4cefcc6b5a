//! Where a batch's results are, asked of the status API when the plan says
//! ([`crate::results::plan`]: when they begin and the outcome names no `responsesFile`, and
//! again after an operator's retry when it could not be said): the status answer's file or
//! inline items.
//!
//! Guarantees: the status call takes a slot of the project's one status budget from the
//! reconciliation lease first (as a nudge's confirmation does); what its answer makes (a 429
//! or 5xx backs every status call off for its `Retry-After`; an answer that names no results
//! in a usable form parks them with the reason, never zero results) is the plan's, through
//! [`crate::results::source::unlocated`]; inline items are stored as the answer streams in
//! (never held whole), then their stable order, once.

use worker::Result;

use crate::operation::gate::alarm::slot_wait;
use crate::operation::key::Collection;
use crate::operation::Operation;
use crate::reconciliation::status::status_url;
use crate::results::item::Source;
use crate::results::plan::Located;
use crate::results::source::Found;

use crate::edge::objects::call::status_slot;
use crate::edge::outbound::results_file::status_results;
use crate::edge::runtime::{now_ms, random_unit};

use super::Driver;

impl Driver<'_> {
    /// The status answer's results (a file, or inline items stored here) and when the batch
    /// ended, asked in a slot of the project's one status budget (the reconciliation lease's,
    /// as a nudge's confirmation takes one). An answer that names neither in a usable form is
    /// unreadable (parked, alerted).
    pub(super) async fn source_in_status(&self, op: &Operation) -> Result<Located> {
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

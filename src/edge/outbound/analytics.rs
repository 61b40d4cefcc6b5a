//! Writes Workers Analytics Engine data points ([`crate::telemetry::analytics`]) when the
//! `ANALYTICS` binding is declared in wrangler.toml.
//!
//! Guarantees: without the binding nothing is written and nothing else changes; a write is
//! never awaited (Analytics Engine takes it in the background), so it adds no wait to a
//! delivery or an attempt; a write that fails is ignored: the points are a view, never the
//! source of truth.

use worker::{AnalyticsEngineDataPointBuilder, AnalyticsEngineDataset, Env};

use crate::operation::gate::alarm::Attempt;
use crate::operation::{AttemptOutcome, Operation};
use crate::telemetry::analytics::{effect_attempt, AttemptSeen, DataPoint};

/// The binding's name in wrangler.toml (`[[analytics_engine_datasets]]`).
pub const ANALYTICS_BINDING: &str = "ANALYTICS";

/// The dataset, when the binding is declared.
pub fn dataset(env: &Env) -> Option<AnalyticsEngineDataset> {
    env.analytics_engine(ANALYTICS_BINDING).ok()
}

/// Writes `point` to `dataset`, without waiting.
pub fn write(dataset: &AnalyticsEngineDataset, point: DataPoint) {
    let mut builder = AnalyticsEngineDataPointBuilder::new()
        .indexes([point.index.as_str()])
        .doubles(point.doubles);
    for blob in point.blobs {
        builder = builder.add_blob(blob);
    }
    let _ = dataset.write_data_point(&builder.build());
}

/// Writes the point of one side-effect attempt of `op`, when the binding is declared.
pub fn attempt(env: &Env, attempt: &Attempt, op: &Operation) {
    let Some(dataset) = dataset(env) else { return };
    let seen = AttemptSeen {
        destination: &attempt.target.destination,
        kind: op.kind(),
        result: match attempt.outcome {
            AttemptOutcome::Delivered => "delivered",
            AttemptOutcome::Retry(_) => "retry",
            AttemptOutcome::Park(_) => "refused",
        },
        http_status: attempt.target.http_status,
        started_ms: attempt.started_ms,
        finished_ms: attempt.finished_ms,
        settled_at_ms: op.settled_at_ms(),
    };
    write(&dataset, effect_attempt(&seen));
}

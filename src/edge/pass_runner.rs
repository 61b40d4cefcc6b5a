//! One reconciliation pass at the edge, and the fan-out queue's consumer: both carry out
//! what their pure machine ([`crate::reconciliation::pass`]'s `Pass` and `Consumer`) decides,
//! and hand back what each intent got.
//!
//! Guarantees: every decision (what to list, poll, ask a gate, when to stop, what to save) is
//! the pass's; this file only reads the clock, calls KV, the lease object, the gates, Gemini's
//! API and the alert sink, and logs the pass's lines in the order it wrote them. The heartbeat
//! runs beside the work under the lease, and only then: it is dropped when the work ends (the
//! release is not raced by a renewal), and when it ends first the work finishes the entry in
//! hand and stops. A consumer acknowledges a message only once its entries are polled, sent
//! back to the queue for after Gemini's wait, or dropped as the pass decides (too old, or no
//! lease to record them); a failed send back leaves the message to the queue's retries.
//! Each status call is counted in the isolate's tally, by who asked (`pass` or `queue`) and
//! how it ended; the handler that ran it flushes the tally (`edge/mod.rs`).

use std::cell::RefCell;
use std::time::Duration;

use futures_util::future::{select, Either};
use worker::wasm_bindgen::JsValue;
use worker::{
    Delay, Env, KvStore, MessageBatch, MessageExt, Method, Queue, QueueContentType,
    RawMessageBuilder,
};

use crate::config::Config;
use crate::reconciliation::entry_decision::Thresholds;
use crate::reconciliation::pass::{
    Consumer, Fanout, Intent, Limits, Machine, Pass, PassLog, Performed, PollJob, QueuedJob,
};

use crate::edge::objects::call::{call_gate, call_lease};
use crate::edge::objects::stats_shard::count_at_edge;
use crate::edge::outbound::fetch::post_alert;
use crate::edge::outbound::ledger_kv::{list_page, KV_BINDING};
use crate::edge::outbound::status_api::{self, webhook_call};
use crate::edge::runtime::{log, now_ms, random_unit};
use crate::operation::ledger::open_key;
use crate::reconciliation::status::call_answer;
use crate::refusal::Refusal;
use crate::telemetry::counters::{status_call, AskedBy};

/// The fan-out queue's producer binding; without it every pass polls by itself.
pub const QUEUE_BINDING: &str = "RECONCILE_QUEUE";

/// What a pass may spend and how it decides, from the configuration.
fn limits(config: &Config, queue: Option<&Queue>) -> Limits {
    Limits {
        budget: config.reconcile_budget,
        deadline_ms: config.reconcile_deadline_secs * 1_000,
        lease_ttl_ms: config.reconcile_lease_secs * 1_000,
        audit_interval_ms: config.reconcile_audit_secs * 1_000,
        thresholds: Thresholds {
            grace_secs: config.reconcile_grace_secs,
            stuck_after_secs: config.stuck_after_secs,
            effect_alert_after_secs: config.effect_alert_after_secs,
        },
        webhook_name: config.gemini_webhook_name.clone(),
        webhook_auto_enable: config.gemini_webhook_auto_enable,
        api_base: config.gemini_api_base.clone(),
        unregistered_hold_ms: config.unregistered_hold_ms(),
        fanout: queue.map(|_| Fanout {
            rate_per_s: config.reconcile_poll_rate,
            above: config.reconcile_fanout_above,
        }),
        poll_rate: config.reconcile_poll_rate,
    }
}

/// What the executor reaches, and the machine it drives.
struct Io<'a, M> {
    env: &'a Env,
    config: &'a Config,
    kv: Option<KvStore>,
    queue: Option<Queue>,
    machine: RefCell<M>,
    /// Whose status calls these are, for their counter.
    asked_by: AskedBy,
}

/// Runs one pass and logs its lines. Never panics; errors are counted and logged.
pub async fn run(env: &Env, config: &Config) {
    let started = now_ms();
    let tag = (random_unit() * f64::from(u32::MAX)) as u32;
    let holder = format!("pass-{started}-{tag:08x}");
    let queue = env.queue(QUEUE_BINDING).ok();
    let mut pass = Pass::new(limits(config, queue.as_ref()), holder, started);
    let kv = env
        .kv(KV_BINDING)
        .map_err(|e| pass.on_kv_unbound(e.to_string()))
        .ok();
    let io = Io {
        env,
        config,
        kv,
        queue,
        machine: RefCell::new(pass),
        asked_by: AskedBy::Pass,
    };
    // The lease first: until it is granted there is nothing for a heartbeat to renew.
    let acquire = io.next();
    let mut intent = io.perform(acquire).await;
    if intent.under_lease() {
        let work = io.perform_while(intent, Intent::under_lease);
        // The heartbeat runs beside the work; it ends only to stop the work (which then
        // finishes its entry in hand), and is dropped when the work ends first.
        intent = match select(Box::pin(work), Box::pin(io.heartbeat())).await {
            Either::Left((next, _)) => next,
            Either::Right(((), work)) => work.await,
        };
    }
    io.perform_while(intent, |i| *i != Intent::Done).await;
}

/// Works through a batch of the fan-out queue's messages, one after the other.
pub async fn consume(batch: MessageBatch<JsValue>, env: &Env, config: &Config) {
    let queue = env.queue(QUEUE_BINDING).ok();
    let kv = env.kv(KV_BINDING).ok();
    let limits = limits(config, queue.as_ref());
    for message in batch.raw_iter() {
        let job = message
            .body()
            .as_string()
            .ok_or_else(|| "not a text message".to_string())
            .and_then(|body| PollJob::from_body(&body));
        let job = match job {
            Ok(job) => job,
            Err(error) => {
                // It will not parse on a retry either; its entries, if any, are still in the
                // index and the next coverage schedules them again.
                log(PassLog::error(format!("queue message: {error}")).to_value());
                message.ack();
                continue;
            }
        };
        let io = Io {
            env,
            config,
            kv: kv.clone(),
            queue: queue.clone(),
            machine: RefCell::new(Consumer::new(limits.clone(), job, now_ms())),
            asked_by: AskedBy::Queue,
        };
        let first = io.next();
        io.perform_while(first, |i| *i != Intent::Done).await;
        // Its entries are polled, dropped, or sent back (after the lease recorded them): done.
        if io.machine.borrow().retry() {
            message.retry();
        } else {
            message.ack();
        }
    }
}

/// Sends `jobs` to the fan-out queue in one batch, each held for its delay.
async fn send(queue: Option<&Queue>, jobs: Vec<QueuedJob>) -> Result<(), String> {
    let Some(queue) = queue else {
        return Err(format!("{QUEUE_BINDING}: not bound"));
    };
    let messages: Vec<_> = jobs
        .into_iter()
        .map(|job| {
            RawMessageBuilder::new(JsValue::from_str(&job.body))
                .delay_seconds(job.delay_secs)
                .build_with_content_type(QueueContentType::Text)
        })
        .collect();
    queue
        .send_raw_batch(messages)
        .await
        .map_err(|e| e.to_string())
}

impl<M: Machine> Io<'_, M> {
    /// The machine's next intent, its lines logged.
    fn next(&self) -> Intent {
        let mut machine = self.machine.borrow_mut();
        let intent = machine.next(now_ms());
        flush(&mut *machine);
        intent
    }

    /// Performs intents from `intent` on while `go_on` holds; returns the first that does not.
    async fn perform_while(&self, mut intent: Intent, go_on: fn(&Intent) -> bool) -> Intent {
        while go_on(&intent) {
            intent = self.perform(intent).await;
        }
        intent
    }

    /// Performs one intent, hands what it got to the machine, and returns the next intent.
    async fn perform(&self, intent: Intent) -> Intent {
        let performed = match intent {
            Intent::Lease(command) => Performed::Lease(text(call_lease(self.env, &command).await)),
            Intent::ListWebhooks { url } => {
                Performed::WebhookPage(webhook_call(self.config, Method::Get, &url, None).await)
            }
            Intent::EnableWebhook { url, body } => Performed::WebhookEnabled(
                webhook_call(self.config, Method::Patch, &url, Some(&body)).await,
            ),
            Intent::PostAlert(body) => Performed::AlertPosted(post_alert(self.config, &body).await),
            Intent::List { prefix, cursor } => Performed::Listed(match self.kv.as_ref() {
                Some(kv) => text(list_page(kv, prefix, cursor).await),
                None => Err(format!("{KV_BINDING}: not bound")),
            }),
            Intent::Poll { key, url } => {
                let answer = status_api::read(self.config, &key, &url).await;
                count_at_edge(&status_call(self.asked_by, call_answer(&answer)));
                Performed::Status(answer)
            }
            Intent::CallGate { key, command } => {
                Performed::Gate(text(call_gate(self.env, &key, &command).await))
            }
            Intent::DeleteIndex { key } => Performed::IndexDeleted(match self.kv.as_ref() {
                Some(kv) => kv
                    .delete(&open_key(&key))
                    .await
                    .map_err(|e| format!("KV: {e:?}")),
                None => Err(format!("{KV_BINDING} binding: not bound")),
            }),
            Intent::Enqueue { jobs } => Performed::Enqueued(send(self.queue.as_ref(), jobs).await),
            Intent::Sleep { until_ms } => {
                let wait = (until_ms - now_ms()).max(0);
                if wait > 0 {
                    Delay::from(Duration::from_millis(wait as u64)).await;
                }
                Performed::Slept
            }
            Intent::Done => return Intent::Done,
        };
        self.machine.borrow_mut().answer(performed, now_ms());
        self.next()
    }
}

impl Io<'_, Pass> {
    /// Renews the lease every quarter of its TTL, as the pass asks, until the pass says the
    /// work must stop.
    async fn heartbeat(&self) {
        let interval = self.machine.borrow().heartbeat_interval_ms();
        loop {
            Delay::from(Duration::from_millis(interval as u64)).await;
            let Some(renew) = self.machine.borrow_mut().on_heartbeat() else {
                return;
            };
            let reply = text(call_lease(self.env, &renew).await);
            let mut pass = self.machine.borrow_mut();
            let go_on = pass.on_renewed(reply, now_ms());
            flush(&mut *pass);
            if !go_on {
                return;
            }
        }
    }
}

/// A call's failure as the machine reads it: text.
fn text<T>(called: Result<T, Refusal>) -> Result<T, String> {
    called.map_err(|e| e.to_string())
}

/// Logs the machine's lines written since the last flush.
fn flush(machine: &mut impl Machine) {
    for line in machine.drain_logs() {
        log(line.to_value());
    }
}

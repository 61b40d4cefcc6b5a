//! How the rest of the worker calls a Durable Object: the stub of a named object, one JSON
//! command posted to it and its JSON reply, a command to an operation's gate, one to a
//! destination's desk, and one to a retired names' shard.
//!
//! Guarantees: a missing binding, a failed call, an answer other than 200 and a reply that
//! does not decode are all [`Refusal::Unavailable`] (a 503 to whoever waits, who retries);
//! the reply is read whole with the runtime's own `text()`.

use futures_util::future::join_all;
use serde_json::{json, Value};
use worker::wasm_bindgen::{JsCast, JsValue};
use worker::wasm_bindgen_futures::JsFuture;
use worker::{js_sys, web_sys, Env};

use crate::config::Config;
use crate::destination::protocol::{DeskCommand, DeskReply, DeskSettings};
use crate::destination_label::destination_parts;
use crate::operation::gate::protocol::{GateCommand, GateReply};
use crate::operation::observation::SlotAnswer;
use crate::operation::retired_names::{RetiredCommand, RetiredName, RetiredReply, RETIRED_BINDING};
use crate::reconciliation::lease_protocol::{LeaseCommand, LeaseReply};
use crate::refusal::Refusal;

use crate::edge::objects::lease_object::{LEASE_BINDING, LEASE_NAME};
use crate::edge::objects::usage_meter::Meter;
use crate::edge::runtime::js_error;

/// The Durable Object binding.
pub const GATE_BINDING: &str = "OPERATION_GATE";
/// The destinations' desks' binding (one object per destination label).
pub const DESK_BINDING: &str = "DESTINATION_DESK";

/// A Durable Object stub, as the runtime hands it out.
pub type ObjectStub = worker::worker_sys::DurableObject;

/// An object's reply, or why there is none.
type Called<T> = std::result::Result<T, Refusal>;

/// The stub of the Durable Object named `name` in namespace `binding`. Uses the runtime's
/// `getByName` directly: one call where worker-rs makes two.
pub fn stub_for(env: &Env, binding: &str, name: &str) -> Called<ObjectStub> {
    let namespace = js_sys::Reflect::get(env, &JsValue::from_str(binding))
        .ok()
        .filter(|ns| !ns.is_undefined())
        .ok_or_else(|| Refusal::Unavailable(format!("{binding} binding: not bound")))?
        .unchecked_into::<worker::worker_sys::DurableObjectNamespace>();
    namespace
        .get_by_name(name)
        .map_err(|e| Refusal::Unavailable(format!("{binding} binding: {}", js_error(&e))))
}

/// Sends a command to the gate of `key` and returns its reply.
pub async fn call_gate(env: &Env, key: &str, command: &GateCommand) -> Called<GateReply> {
    post_json(&stub_for(env, GATE_BINDING, key)?, command).await
}

/// Sends a command to the desk of the destination `settings` names and returns its reply.
pub async fn call_desk(
    env: &Env,
    settings: &DeskSettings,
    command: &DeskCommand,
) -> Called<DeskReply> {
    post_json(&stub_for(env, DESK_BINDING, &settings.label)?, command).await
}

/// Sends a command to the reconciliation lease (the pass's lease, and the project's status
/// budget).
pub async fn call_lease(env: &Env, command: &LeaseCommand) -> Called<LeaseReply> {
    post_json(&stub_for(env, LEASE_BINDING, LEASE_NAME)?, command).await
}

/// A slot of the one status budget, from the lease (one object call, on `meter`): `None`
/// when the lease could not be reached.
pub async fn status_slot(env: &Env, meter: &Meter, rate_per_s: u32) -> Option<SlotAnswer> {
    meter.add(|u| u.object_calls += 1);
    match call_lease(env, &LeaseCommand::Slot { rate_per_s }).await {
        Ok(LeaseReply::Slot { answer }) => Some(answer),
        _ => None,
    }
}

/// Tells the lease that every status call waits until `until` (a 429 or 5xx answered one),
/// so the pass and its consumers back off too; best effort. Nothing when `until` is `None`.
pub async fn status_backoff(env: &Env, meter: &Meter, until: Option<i64>) {
    let Some(until_ms) = until else { return };
    meter.add(|u| u.object_calls += 1);
    let backoff = LeaseCommand::Backoff {
        until_ms,
        fed_until_ms: 0,
    };
    let _ = call_lease(env, &backoff).await;
}

/// Asks (or tells) the retired names' shard that holds `name`.
pub async fn call_retired(
    env: &Env,
    name: RetiredName,
    command: &RetiredCommand,
) -> Called<RetiredReply> {
    post_json(&stub_for(env, RETIRED_BINDING, &name.shard())?, command).await
}

/// Each configured destination's health, as `/v1/stats` shows it: one desk call each (the
/// routes are known from the configuration), all at once, with its short `name` (what
/// `/metrics` and the dashboard's links call it). A desk that cannot be reached is shown as
/// `unknown` with why.
pub async fn destinations_health(env: &Env, config: &Config) -> Value {
    let desks = config.destinations();
    let views = join_all(desks.iter().map(|settings| async move {
        let command = DeskCommand::Status {
            settings: settings.clone(),
        };
        let mut view = match call_desk(env, settings, &command).await {
            Ok(DeskReply::View(view)) => json!(view),
            Ok(other) => json!({"label": settings.label, "state": "unknown", "last_error": format!("{other:?}")}),
            Err(e) => json!({"label": settings.label, "state": "unknown", "last_error": e.to_string()}),
        };
        view["name"] = destination_parts(&settings.label).0.into();
        view
    }))
    .await;
    Value::Array(views)
}

/// POSTs `command` as JSON to a Durable Object and decodes its JSON reply. The reply is read
/// with the runtime's own `text()`: worker-rs reads a fetched body chunk by chunk through a
/// stream reader, a measurable share of a duplicate delivery's time (docs/PERFORMANCE.md).
pub async fn post_json<C: serde::Serialize, R: serde::de::DeserializeOwned>(
    stub: &ObjectStub,
    command: &C,
) -> Called<R> {
    let body = serde_json::to_string(command).map_err(|e| Refusal::Unavailable(e.to_string()))?;
    let init = web_sys::RequestInit::new();
    init.set_method("POST");
    init.set_body(&JsValue::from_str(&body));
    let request = web_sys::Request::new_with_str_and_init("https://object/command", &init)
        .map_err(|e| Refusal::Unavailable(format!("object call: {}", js_error(&e))))?;
    let call = async {
        let promise = stub.fetch_with_request(&request)?;
        let response: web_sys::Response = JsFuture::from(promise).await?.unchecked_into();
        let text = JsFuture::from(response.text()?).await?;
        Ok::<_, JsValue>((response.status(), text.as_string().unwrap_or_default()))
    };
    let (status, text) = call
        .await
        .map_err(|e| Refusal::Unavailable(format!("object call: {}", js_error(&e))))?;
    if status != 200 {
        return Err(Refusal::Unavailable(format!(
            "object answered {status}: {text}"
        )));
    }
    serde_json::from_str(&text).map_err(|e| Refusal::Unavailable(format!("object reply: {e}")))
}

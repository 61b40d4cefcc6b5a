//! The delivery's path counted from the code (docs/DESIGN.md, "From the webhook to the
//! destination's POST"): which calls a signed first delivery crosses from one file of `src/`
//! into another, from the Worker's fetch handler to the destination's POST.
//!
//! Guarantees: the count is the code's, read by one stated rule. From each invocation's
//! entry ([`INVOCATIONS`]), every call written in a function's body (`name(`, `x.name(`,
//! `Path::name(`, `name::<T>(`) that names a production function of `src/` is followed:
//! into the caller's own file when it defines that name (a file's own business, not
//! counted; for `Type::name(`, or `x.name(` with `x` a parameter or field declared of a
//! type ours, only in an `impl` of that type of its own); else, for `Type::name(`, into the
//! files holding `name` in an `impl Type`; for `x.name(`, into the files holding it in an
//! `impl` of the type the parameter `x` (or, for `self.x.name(`, the field `x` of the
//! caller's file) declares when one holds it, else of any type the caller's file mentions;
//! for a bare `name(` the file imports, or `module::name(` whose module it imports (under
//! its name or another: `use a::{self as b}` then `b::name(`), where its `use` says; for
//! another `module::name(` or bare call, into the files the caller's file names whose
//! module is that one. A crossing is a pair of files, counted once in each invocation, as
//! DESIGN.md's rule says. Not followed: the files of [`OUTSIDE`] and the callees of
//! [`LABELS`] (what the rule leaves out), and the calls of [`STOPS`] (and, in one
//! invocation only, of [`STOPS_IN`]), each with its reason; a stop that no longer matches a
//! call fails, so the list cannot hide a layer that came back. DESIGN.md shows the
//! crossings as read, and a test fails when they differ.
//!
//! Limits: it reads text, not types. A function passed as a value (`map(f)`), a trait
//! object or a macro's expansion is not seen as a call (a closure's body is read where it
//! is written); a method on anything but a parameter or a field of `self` (a local, a
//! call's value) is matched by its name and the types the caller's file mentions, so a name
//! std shares (`parse`, `is_none`) can be read as ours: such calls are stopped by name,
//! with the reason. The branch a delivery takes is stated by the stops, not proven: a stop
//! that cuts a call the delivery does make hides it, which is why each says why the
//! delivery does not go there. The path ends at the destination's POST: what follows (its
//! answer's step, the upkeep) is stopped.

use std::collections::BTreeSet;

use super::{body_of_all, load, Crate, DELIVERY_PATH, MAX_PATH_CALLS, MAX_PATH_FILES};

/// The three invocations that carry a delivery, each from its entry: (name, file, function,
/// the one call the entry makes for a delivery, when the entry dispatches between routes).
pub const INVOCATIONS: &[(&str, &str, &str, Option<&str>)] = &[
    (
        "the Worker's fetch",
        "edge/mod.rs",
        "route",
        Some("receive"),
    ),
    (
        "the gate's fetch",
        "edge/objects/gate/mod.rs",
        "fetch",
        None,
    ),
    (
        "the gate's alarm",
        "edge/objects/gate/mod.rs",
        "alarm",
        None,
    ),
];

/// Calls not followed, one a line: `caller's file callee: why` a first delivery does not
/// take it (or DESIGN.md's rule does not count it).
pub const STOPS: &[&str] = &[
    "edge/http/webhook/mod.rs verify: a token's signature: the delivery is HMAC-signed",
    "edge/http/webhook/mod.rs verify_v1a: a `v1a` body: the delivery is HMAC-signed",
    "edge/http/webhook/mod.rs ask_unheld: a `v1a` body no gate holds",
    "edge/http/webhook/mod.rs tally: a nudge for an operation not held",
    "edge/http/webhook/mod.rs write_dead_letter: a refused body's dead letter",
    "edge/http/webhook/mod.rs answer: the shaping of the answer to the sender",
    "edge/objects/gate/mod.rs repair: an operator's `Repair`",
    "edge/objects/gate/mod.rs annotate: a found operation's reply",
    "edge/objects/gate/mod.rs fetch>list: a results command's listing (the fetch dispatches by command)",
    "edge/objects/gate/mod.rs fetch>retry: an operator's retry of results (the fetch dispatches by command)",
    "edge/objects/gate/mod.rs fetch>registration: a `Register` (the fetch dispatches by command)",
    "edge/objects/gate/desk_turn.rs check>call: a desk's check, made when this isolate has not heard from the destination's desk lately; the drawn delivery's has",
    "edge/objects/gate/desk_turn.rs turn>call: an ask: a retry, a paced route or a destination remembered open",
    "edge/objects/gate/desk_turn.rs report>tell: a report: a first attempt's success to an unpaced destination makes none",
    "edge/objects/gate/storage.rs recover: a stored record that does not parse",
    "operation/gate/mod.rs register_again: a `Register`",
    "operation/gate/mod.rs register_new: a `Register`",
    "operation/gate/mod.rs nudge: a token-signed nudge",
    "inbound/intake.rs refused: a refusal",
    "inbound/intake.rs jwt::parse: a token: the delivery is HMAC-signed",
    "inbound/intake.rs declared_length>parse: `str::parse` of the declared length (read by name as `Status::parse`)",
    "inbound/intake.rs dead_key: a refused body's dead letter",
    "edge/objects/gate/mod.rs limit_new_records: a configuration value the command threads",
    "edge/objects/gate/mod.rs limit_alerts: a configuration value the command threads",
    "edge/objects/gate/mod.rs meter: metering",
    "edge/objects/gate/mod.rs end: metering (the invocation's usage log)",
    "edge/objects/gate/mod.rs limits: a configuration value the steps read",
    "edge/objects/gate/mod.rs alarm>key: a run after failed ones (its log line's key)",
    "operation/record/mod.rs apply>resolve_alert: an open `stuck` alert: the record the delivery creates has none",
    "operation/record/mod.rs is_none: `Option::is_none` (read by name as `ResultsMode::is_none`)",
    "inbound/intake.rs vouch: a token's claims: the delivery is HMAC-signed",
    "inbound/intake.rs nudge: a token-signed nudge",
    "edge/objects/gate/results.rs outcome: after the POST: its answer",
    "edge/objects/gate/results.rs limits: a configuration value the steps read",
    "edge/objects/gate/results.rs perform>meter: metering",
    "edge/objects/gate/results.rs ResultsStore::new: a batch's results' tables: the job's effect has none",
    "edge/objects/gate/results.rs perform>load: a batch's results' progress, or its record after its step (the job's effect reads it in its commits)",
    "edge/objects/gate/results.rs source_in_status: where a batch's results are",
    "edge/objects/gate/results.rs status_backoff: a batch's results' status call",
    "edge/objects/gate/results.rs perform>read: a batch's results' file",
    "edge/objects/gate/results.rs kept: a batch's results' waiting rows",
    "edge/objects/gate/results.rs perform>send_results: a batch's results' sends (the job's effect: `send_effect`)",
    "edge/objects/gate/results.rs tell: a batch's release with nothing to send",
    "results/marks.rs decide>ProgressWrite::of: a batch's results' write (the job's effect's are the `Effect` markings)",
    "results/marks.rs decide>progress: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>claimed: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>committed: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>read_failed: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>file_parked: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>gave_up: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>senders: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>settled: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>due_at: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>desk_spent: a batch's results' write (as `ProgressWrite::of`)",
    "results/marks.rs decide>wait_on_destination: a wait on the desk (a batch's, or the job's `EffectWaits`): the drawn destination is neither paced, open nor paused and its isolate heard so lately, so its turn goes without asking",
    "results/marks.rs decide>Step::new: an effect no longer owed, due or free when its claim is committed: a first delivery's is",
    "results/marks.rs decide>attempt_finished: after the POST: its answer's commit",
    "results/marks.rs decide>sets_alarm_at_once: after the POST: its answer's commit",
    "results/plan.rs next>stored: a batch's results' stage (the job's effect takes the plan's `effect` stages)",
    "results/plan.rs next>located: a batch's results' stage (as `stored`)",
    "results/plan.rs next>unlocated: a batch's results' stage (as `stored`)",
    "results/plan.rs next>chosen: a batch's results' stage (as `stored`)",
    "results/plan.rs next>held_by_pause: a batch's results' stage (as `stored`)",
    "results/plan.rs next>ask_turn: a batch's results' stage (as `stored`)",
    "results/plan.rs next>at_desk: a batch's results' stage (as `stored`)",
    "results/plan.rs next>granted: a batch's results' stage (as `stored`)",
    "results/plan.rs next>act: a batch's results' stage (as `stored`)",
    "results/plan.rs next>read: a batch's results' stage (as `stored`)",
    "results/plan.rs next>answered: a batch's results' stage (as `stored`)",
    "operation/gate/mod.rs retry_effect: reconciliation's command",
    "operation/gate/mod.rs destination_ready: a desk's command",
    "operation/gate/mod.rs alert: reconciliation's command",
    "operation/gate/mod.rs status_unusable: reconciliation's command",
    "operation/gate/mod.rs operator_action: an operator's command",
    "operation/gate/mod.rs count_delivery: counters",
    "edge/objects/gate/desk_turn.rs meter: metering",
    "edge/objects/gate/desk_turn.rs send_through_senders: more than one round trip's worth of results: a job's effect is one request",
    "edge/objects/gate/desk_turn.rs answered: after the POST: its answers, for the attempt and the desk",
    "edge/objects/gate/results.rs generation: after the POST: its `webhook-id`, for the history row",
    "edge/objects/gate/results.rs send_effect>key: after the POST: its `webhook-id`, for the history row",
    "edge/objects/gate/results.rs send_effect>effect: after the POST: its `webhook-id`, for the history row",
    "edge/objects/gate/results.rs attempt: after the POST: its analytics point",
    "edge/outbound/fetch.rs to_queue: a queue destination; the drawn one is a URL",
    "edge/outbound/fetch.rs to_service: a service binding; the drawn one is a URL",
    "edge/outbound/fetch.rs kept_answer: after the POST: its answer",
    "edge/outbound/fetch.rs next_hop: after the POST: a redirect, followed only for a keyed `GET` to Gemini",
    "operation/record/mod.rs retires_at_ms>of: retention's end, of a closed operation: up to the POST the delivery's effect is owed, so `expires_at_ms` is none",
    "operation/record/mod.rs retires_at_ms>moment: retention's end, of a closed operation (as `of`)",
    "operation/record/mod.rs retires_at_ms>moment_period_ms: retention's end, of a closed operation (as `of`)",
    "edge/objects/gate/mod.rs alarm_failed: a run that failed",
    "edge/objects/gate/mod.rs alarm_recovered: a run after failed ones",
    "operation/gate/alarm.rs retire_if_over>key: retention's end (the step that ends it, once `retention_over` says so: the delivery's record is not over)",
    "operation/gate/alarm.rs retire_if_over>Step::new: retention's end (as `key`)",
    "operation/gate/alarm.rs retire_if_over>log: retention's end (as `key`)",
    "edge/objects/gate/alarm.rs retire: retention's end",
    "edge/objects/gate/alarm.rs ask_retired: a record recreated after retention: a first delivery's is new",
    "edge/objects/gate/alarm.rs step: a batch's results: the operation registered none",
    "edge/objects/gate/alarm.rs confirm: a nudge's confirmation",
    "edge/objects/gate/alarm.rs send_alert: an alert",
    "edge/objects/gate/alarm.rs settle_storage: the ledger's upkeep after the effect",
];

/// Calls not followed in one invocation only, as [`STOPS`]: (the invocation, the stop).
pub const STOPS_IN: &[(&str, &str)] = &[
    (
        "the gate's fetch",
        "edge/objects/gate/storage.rs stored_body>decode: a stored record's history: the gate a first delivery of an unregistered operation opens has no record (its row is read and not found; a registered one's is, and the pair shows anyway by the history row the step appends); the alarm's may read it back",
    ),
    (
        "the gate's fetch",
        "edge/objects/gate/storage.rs stored_body>from_rows: a stored record's history (as `decode`)",
    ),
];

/// A stop's caller's file and callee.
fn stop(line: &str) -> (&str, &str) {
    let (file, rest) = line.split_once(' ').unwrap();
    (file, rest.split_once(": ").unwrap().0)
}

/// Whether a stop's callee (`name`, `module::name` or `caller>name`) is this call.
fn stops_call(stopped: &str, caller: &str, call: &Call) -> bool {
    let (by, callee) = match stopped.split_once('>') {
        Some((by, callee)) => (Some(by), callee),
        None => (None, stopped),
    };
    let written = match &call.qualifier {
        Some(q) => format!("{q}::{}", call.name),
        None => call.name.clone(),
    };
    by.is_none_or(|by| by == caller) && (callee == call.name || callee == written)
}

/// Files not followed nor counted: what DESIGN.md's rule leaves out (the runtime,
/// configuration, logs, counters, metering, errors' and answers' shapes).
pub const OUTSIDE: &[(&str, &str)] = &[
    (
        "edge/runtime.rs",
        "the runtime: the clock, the configuration, the log",
    ),
    ("config.rs", "configuration reads"),
    ("edge/error.rs", "an error's answer"),
    ("refusal.rs", "an error's answer"),
    ("edge/raw_response.rs", "the shaping of an answer"),
    ("edge/objects/usage_meter.rs", "metering"),
    ("edge/objects/stats_shard.rs", "counters"),
    ("telemetry/", "logs, counters, metering"),
    (
        "operation/record/outbox.rs",
        "counters waiting for their flush",
    ),
    ("operation/gate/log.rs", "log lines"),
    ("inbound/route_log.rs", "log lines"),
    ("timestamp.rs", "the shaping of a time for a reply or a log"),
];

/// Callees never followed, whoever calls them: labels for logs, history rows and replies.
pub const LABELS: &[&str] = &["as_str", "to_value", "view", "label"];

/// One crossing: (caller's file, caller, callee's file, callee).
pub type Crossing = (String, String, String, String);

/// What the reading found: per invocation its crossings (first seen per pair of files), and
/// the stops that matched a call.
pub struct Path {
    pub legs: Vec<(&'static str, Vec<Crossing>)>,
    pub stops_used: BTreeSet<(String, String)>,
}

/// One call written in a body.
struct Call {
    /// The callee's name.
    name: String,
    /// The qualifier before `::` (`Type`, `module`, `Self`).
    qualifier: Option<String>,
    /// A method, `.name(`.
    method: bool,
    /// For `x.name(` whose `x` is a parameter of the function: the type it declares.
    receiver: Option<String>,
    /// For `self.x.name(`: the field `x`.
    field: Option<String>,
}

/// Calls written in `body` (a function's, from its name: its parameters' declared types
/// name the receivers they are).
fn calls_in(body: &str) -> Vec<Call> {
    let chars: Vec<char> = body.chars().collect();
    let words = super::words(body);
    let params = parameters(body);
    let mut out = Vec::new();
    for (k, (at, word)) in words.iter().enumerate() {
        let after = at + word.chars().count();
        let rest: String = chars[after..chars.len().min(after + 3)].iter().collect();
        if !(rest.starts_with('(') || rest.starts_with("::<")) {
            continue;
        }
        if k > 0 && words[k - 1].1 == "fn" {
            continue; // a definition, not a call
        }
        let before = |n: usize| at.checked_sub(n).map(|i| chars[i]);
        let method = before(1) == Some('.');
        let qualifier = (before(1) == Some(':') && before(2) == Some(':') && k > 0)
            .then(|| words[k - 1].1.clone());
        // `x.name(` with `x` a bare name (not `a.x`, not `x()`): a parameter's type, if it is.
        let receiver = (method && k > 0)
            .then(|| &words[k - 1])
            .filter(|(r, w)| r + w.chars().count() + 1 == *at)
            .filter(|(r, _)| !matches!(r.checked_sub(1).map(|i| chars[i]), Some('.' | ':')))
            .and_then(|(_, w)| params.iter().find(|(p, _)| p == w))
            .map(|(_, ty)| ty.clone());
        // `self.x.name(`: the field `x`.
        let field = (method && k > 1 && words[k - 2].1 == "self")
            .then(|| (&words[k - 2], &words[k - 1]))
            .filter(|(s, x)| s.0 + 5 == x.0 && x.0 + x.1.chars().count() + 1 == *at)
            .map(|(_, x)| x.1.clone());
        out.push(Call {
            name: word.clone(),
            qualifier,
            method,
            receiver,
            field,
        });
    }
    out
}

/// The type `code` declares its field (or any binding) `field` of: the first type named
/// after the first `field:`.
fn field_type(code: &str, field: &str) -> Option<String> {
    let chars: Vec<char> = code.chars().collect();
    let words = super::words(code);
    let at = words.iter().find_map(|(at, w)| {
        let after = at + w.chars().count();
        let rest: String = chars[after..chars.len().min(after + 3)].iter().collect();
        let rest = rest.trim_start();
        (w == field && rest.starts_with(':') && !rest.starts_with("::")).then_some(after)
    })?;
    let declared: String = chars[at..]
        .iter()
        .take_while(|c| !matches!(c, ',' | '}' | ';' | '\n'))
        .collect();
    let ty = super::words(&declared).into_iter().map(|(_, w)| w);
    ty.into_iter().find(|w| w.starts_with(char::is_uppercase))
}

/// The parameters `body` (a function's, from its name) declares, each with the first type
/// its declaration names (`plan: &mut Plan`, `mut plan: Plan`: `Plan`).
fn parameters(body: &str) -> Vec<(String, String)> {
    let Some(open) = body.find('(') else {
        return Vec::new();
    };
    let mut depth = 0;
    let mut list = String::new();
    for c in body[open..].chars() {
        match c {
            '>' if list.ends_with('-') => {}
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 1 => {
                list.push('\n');
                continue;
            }
            _ => {}
        }
        if depth == 0 {
            break;
        }
        list.push(c);
    }
    list.trim_start_matches('(')
        .split('\n')
        .filter_map(|p| p.split_once(':'))
        .filter_map(|(name, ty)| {
            let name = name.trim().trim_start_matches("mut ").trim().to_string();
            let ty = super::words(ty)
                .into_iter()
                .map(|(_, w)| w)
                .find(|w| w.starts_with(char::is_uppercase))?;
            Some((name, ty))
        })
        .collect()
}

/// What each file defines and mentions, read once.
struct Index {
    /// Per file: the files its code names (its enclosing modules' included).
    named: Vec<BTreeSet<usize>>,
    /// Per file: its production functions, each with the type of the `impl` holding it.
    fns: Vec<Vec<(String, Option<String>)>>,
    /// Per file: every word its code mentions.
    mentions: Vec<BTreeSet<String>>,
}

/// The `impl` blocks of `code`: (char range, the type implemented: after `for` when a trait's).
fn impl_blocks(code: &str) -> Vec<((usize, usize), String)> {
    let chars: Vec<char> = code.chars().collect();
    let words = super::words(code);
    let mut out = Vec::new();
    for (at, word) in &words {
        if word != "impl" {
            continue;
        }
        let end = super::item_end(&chars, *at);
        let head: String = chars[*at..end].iter().take_while(|c| **c != '{').collect();
        // `impl<R> Step<R>`: the type follows the impl's own generics.
        let own = match head[4..].trim_start().strip_prefix('<') {
            Some(rest) => skip_generics(rest),
            None => &head[4..],
        };
        let after_for = head.split(" for ").nth(1).unwrap_or(own).to_string();
        let ty = super::words(&after_for)
            .into_iter()
            .map(|(_, w)| w)
            .find(|w| w.starts_with(char::is_uppercase));
        if let Some(ty) = ty {
            out.push(((*at, end), ty));
        }
    }
    out
}

/// What follows the generics `<…>` whose `<` was just read.
fn skip_generics(text: &str) -> &str {
    let mut depth = 1;
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return &text[i + 1..];
        }
    }
    ""
}

impl Crate {
    fn index(&self) -> Index {
        let mut fns = Vec::new();
        let mut mentions = Vec::new();
        for f in &self.files {
            let words = super::words(&f.code);
            let mut here = Vec::new();
            if !self.test_files.contains(&f.rel) {
                let blocks = impl_blocks(&f.code);
                let chars: Vec<char> = f.code.chars().collect();
                for w in words.windows(2) {
                    let at = w[1].0 + w[1].1.chars().count();
                    let next = chars[at..].iter().find(|c| !c.is_whitespace());
                    let has_body = || {
                        let end = super::item_end(&chars, w[1].0);
                        chars[..end].last() == Some(&'}')
                    };
                    if w[0].1 == "fn" && matches!(next, Some('(' | '<')) && has_body() {
                        let ty = blocks
                            .iter()
                            .find(|((a, b), _)| *a <= w[0].0 && w[0].0 < *b)
                            .map(|(_, t)| t.clone());
                        here.push((w[1].1.clone(), ty));
                    }
                }
            }
            fns.push(here);
            mentions.push(words.into_iter().map(|(_, w)| w).collect());
        }
        let named = (0..self.files.len())
            .map(|from| {
                let paths = self.named_paths(from);
                paths.iter().filter_map(|p| self.resolve(p, 0)).collect()
            })
            .collect();
        Index {
            named,
            fns,
            mentions,
        }
    }

    /// Where a call written in file `from` goes (see the module's doc): `from` itself when it
    /// defines the name (for `Type::name(` or a receiver of a declared type, in an `impl` of
    /// that type); for `Type::name(` the files holding `name` in an `impl Type`; for `x.name(`
    /// the files holding it in an `impl` of the type `x` is declared as a parameter, when one
    /// does, else of a type `from` mentions; for `name(` and `module::name(` where the file's
    /// `use` of `name` or of `module` says, else the files `from` names that define a free
    /// `name`.
    fn callees(&self, index: &Index, from: usize, call: &Call) -> Vec<usize> {
        let (name, qualifier, method) = (&call.name, &call.qualifier, call.method);
        let defines = |g: usize, ty: Option<&str>| {
            index.fns[g].iter().any(|(n, t)| {
                n == name
                    && match ty {
                        Some("*") => t.is_some(),
                        Some(ty) => t.as_deref() == Some(ty),
                        None => t.is_none(),
                    }
            })
        };
        let typed = qualifier
            .as_deref()
            .filter(|q| q.starts_with(char::is_uppercase) && *q != "Self");
        // A method's receiver declared (a parameter, or a field of the file's) of a type
        // whose `impl` holds the name somewhere.
        let field = || {
            let f = call.field.as_deref()?;
            field_type(&self.files[from].code, f)
        };
        let declared = call.receiver.clone().or_else(field);
        let declared =
            (declared.as_deref()).filter(|ty| (0..self.files.len()).any(|g| defines(g, Some(ty))));
        // The file's own name; for `Type::name(` (or a receiver of a declared type), only when
        // an `impl` of that type here holds it (`Box::new(` in a file with its own `new` is
        // not that `new`).
        let named_type = typed.or(declared);
        let own = index.fns[from]
            .iter()
            .any(|(n, t)| n == name && named_type.is_none_or(|ty| t.as_deref() == Some(ty)));
        if own {
            return vec![from];
        }
        let reachable = |g: usize| index.named[from].contains(&g);
        // A bare `name(` the file imports by name, or `module::name(` whose module it imports
        // (`use a::{self as b}` then `b::name(`), goes where its `use` says.
        let brought = match qualifier.as_deref() {
            None => Some((name.as_str(), false)),
            Some("self" | "super" | "crate") => None,
            Some(q) if typed.is_none() => Some((q, true)),
            Some(_) => None,
        };
        let imported = brought
            .filter(|_| !method)
            .and_then(|(alias, module)| {
                super::uses(&self.files[from].code)
                    .into_iter()
                    .flat_map(|u| u.paths)
                    .find(|(_, a)| a.as_deref() == Some(alias))
                    .map(|(path, _)| match module {
                        true => [path, vec![name.clone()]].concat(),
                        false => path,
                    })
            })
            .and_then(|path| self.absolute(from, &path))
            .and_then(|path| self.resolve(&path, 0));
        (0..self.files.len())
            .filter(|&g| g != from)
            .filter(|&g| match (typed, method) {
                (Some(ty), _) => defines(g, Some(ty)),
                (None, true) if declared.is_some() => defines(g, declared),
                (None, true) => index.fns[g].iter().any(|(n, t)| {
                    n == name && t.as_ref().is_some_and(|t| index.mentions[from].contains(t))
                }),
                (None, false) if imported.is_some() => imported == Some(g),
                (None, false) => {
                    let module_named = qualifier.as_deref().is_none_or(|q| {
                        matches!(q, "self" | "super" | "crate")
                            || self.files[g].module.last().is_some_and(|m| m == q)
                    });
                    defines(g, None) && reachable(g) && module_named
                }
            })
            .collect()
    }

    /// Reads the path from the code.
    pub fn delivery_path(&self) -> Path {
        let index = self.index();
        let file = |rel: &str| {
            self.files
                .iter()
                .position(|f| f.rel == rel)
                .unwrap_or_else(|| panic!("{rel}: no such file"))
        };
        let mut stops_used = BTreeSet::new();
        let mut legs = Vec::new();
        for (name, rel, entry, only) in INVOCATIONS {
            let mut crossings: Vec<Crossing> = Vec::new();
            let mut pairs = BTreeSet::new();
            let mut seen = BTreeSet::new();
            let mut todo = vec![(file(rel), entry.to_string(), *only)];
            while let Some((at, function, only)) = todo.pop() {
                if !seen.insert((at, function.clone())) {
                    continue;
                }
                let code = &self.files[at].code;
                let mut next = Vec::new();
                for body in body_of_all(code, &function) {
                    for call in calls_in(&body) {
                        let callee = call.name.clone();
                        if only.is_some_and(|o| o != callee) {
                            continue;
                        }
                        if LABELS.contains(&callee.as_str()) {
                            continue;
                        }
                        let caller_rel = &self.files[at].rel;
                        let leg = STOPS_IN.iter().filter(|(leg, _)| leg == name);
                        let hit = (STOPS.iter().chain(leg.map(|(_, l)| l)))
                            .map(|l| stop(l))
                            .find(|(f, c)| f == caller_rel && stops_call(c, &function, &call));
                        if let Some((f, c)) = hit {
                            stops_used.insert((f.to_string(), c.to_string()));
                            continue;
                        }
                        for to in self.callees(&index, at, &call) {
                            let to_rel = &self.files[to].rel;
                            if OUTSIDE.iter().any(|(f, _)| to_rel.starts_with(f)) {
                                continue;
                            }
                            if to != at && pairs.insert((at, to)) {
                                crossings.push((
                                    caller_rel.clone(),
                                    function.clone(),
                                    self.files[to].rel.clone(),
                                    callee.clone(),
                                ));
                            }
                            next.push((to, callee.clone(), None));
                        }
                    }
                }
                // Depth first, in the order the calls are written.
                todo.extend(next.into_iter().rev());
            }
            legs.push((*name, crossings));
        }
        Path { legs, stops_used }
    }
}

impl Path {
    /// (calls, files): the crossings of every invocation, and the files they join.
    pub fn count(&self) -> (usize, usize) {
        let calls = self.legs.iter().map(|(_, c)| c.len()).sum();
        let files: BTreeSet<&str> = self
            .legs
            .iter()
            .flat_map(|(_, c)| c.iter())
            .flat_map(|(from, _, to, _)| [from.as_str(), to.as_str()])
            .collect();
        (calls, files.len())
    }

    /// The crossings, one line each, under their invocation.
    pub fn drawing(&self) -> String {
        let mut out = String::new();
        for (name, crossings) in &self.legs {
            out.push_str(&format!("{name}: {} calls\n", crossings.len()));
            for (from, caller, to, callee) in crossings {
                out.push_str(&format!("  {from}::{caller} → {to}::{callee}\n"));
            }
        }
        out
    }
}

/// Every stop still matches a call the reading met: a stale stop would hide nothing today
/// and something tomorrow.
#[test]
fn every_stop_of_the_path_matches_a_call() {
    let path = load().delivery_path();
    let stale: Vec<_> = (STOPS.iter().chain(STOPS_IN.iter().map(|(_, l)| l)))
        .filter(|l| {
            let (f, c) = stop(l);
            !path.stops_used.contains(&(f.to_string(), c.to_string()))
        })
        .collect();
    assert!(stale.is_empty(), "stops no call needs: {stale:#?}");
}

/// The code crosses at least every pair of files DESIGN.md's drawing shows: the drawing is a
/// lower bound read from the same code.
#[test]
fn the_code_crosses_every_pair_design_md_draws() {
    let path = load().delivery_path();
    let found: BTreeSet<(&str, &str)> = path
        .legs
        .iter()
        .flat_map(|(_, c)| c.iter())
        .map(|(from, _, to, _)| (from.as_str(), to.as_str()))
        .collect();
    let missing: Vec<_> = DELIVERY_PATH
        .iter()
        .filter(|(from, _, to, _)| !found.contains(&(*from, *to)))
        .collect();
    assert!(
        missing.is_empty(),
        "drawn but not found in the code: {missing:#?}\n{}",
        path.drawing()
    );
}

/// DESIGN.md states the count read from the code and shows its crossings as read, so a
/// crossing added or removed anywhere on the path changes the page in the same commit.
#[test]
fn design_md_states_the_count_read_from_the_code() {
    let path = load().delivery_path();
    let (calls, files) = path.count();
    let legs: Vec<String> = path
        .legs
        .iter()
        .map(|(name, c)| format!("{name} {}", c.len()))
        .collect();
    let stated = format!("Read from the code, {calls} calls over {files} files");
    let design = std::fs::read_to_string(super::src_dir().join("../docs/DESIGN.md")).unwrap();
    assert!(
        design.contains(&stated) && design.contains(&path.drawing()),
        "DESIGN.md should say \"{stated}\" ({}) and show, in a block of its own:\n{}",
        legs.join(", "),
        path.drawing()
    );
}

/// The delivery's path counted from the code, at most 20 calls over 20 files. Ignored while
/// the code's count is above the bound (DESIGN.md states it): run it with
/// `cargo test --test structure -- --ignored --nocapture` to see each crossing.
#[test]
#[ignore]
fn the_delivery_path_counted_from_the_code_is_at_most_20_calls_over_20_files() {
    let path = load().delivery_path();
    let (calls, files) = path.count();
    println!("{calls} calls over {files} files\n{}", path.drawing());
    assert!(
        calls <= MAX_PATH_CALLS && files <= MAX_PATH_FILES,
        "{calls} calls over {files} files:\n{}",
        path.drawing()
    );
}

/// A made-up crate of `(path under src/, text)` files.
#[cfg(test)]
fn made_up(files: &[(&str, &str)]) -> Crate {
    super::crate_of(files.iter().map(|(r, t)| (r.to_string(), t.to_string())))
}

/// Where the reader takes `call` (as [`calls_in`] reads it) written in `from`: the files.
#[cfg(test)]
fn read_into(krate: &Crate, from: &str, call: &str) -> Vec<String> {
    let index = krate.index();
    let at = krate.files.iter().position(|f| f.rel == from).unwrap();
    let call = calls_in(call).pop().unwrap();
    let to = krate.callees(&index, at, &call);
    to.into_iter().map(|g| krate.files[g].rel.clone()).collect()
}

/// `Box::new(` in a file with its own `new` (of another type) is std's, not the file's: it
/// was read into the file's `new` and on through its calls.
#[test]
fn a_type_qualified_call_is_the_files_own_only_in_that_types_impl() {
    let krate = made_up(&[
        ("lib.rs", "mod plan;\n"),
        (
            "plan.rs",
            "pub struct Plan;\nimpl Plan {\n    pub fn new() -> Plan { Plan }\n    fn again() -> Plan { Self::new() }\n}\n",
        ),
    ]);
    assert!(read_into(&krate, "plan.rs", "Box::new(x)").is_empty());
    assert_eq!(read_into(&krate, "plan.rs", "Plan::new()"), ["plan.rs"]);
    assert_eq!(read_into(&krate, "plan.rs", "Self::new()"), ["plan.rs"]);
    assert_eq!(read_into(&krate, "plan.rs", "new()"), ["plan.rs"]);
}

/// `plan.next(` with `plan: Plan` a parameter is `Plan::next`, not the caller's file's own
/// `next` nor that of another type the file mentions (`Seen::Progress` read it as
/// `Progress::next`).
#[test]
fn a_parameters_method_is_its_declared_types() {
    let krate = made_up(&[
        ("lib.rs", "mod plan;\nmod progress;\nmod edge;\n"),
        (
            "plan.rs",
            "pub struct Plan;\nimpl Plan {\n    pub fn next(&mut self) {}\n}\n",
        ),
        (
            "progress.rs",
            "pub struct Progress;\nimpl Progress {\n    pub fn next(&self) {}\n}\n",
        ),
        (
            "edge.rs",
            "use crate::plan::Plan;\nuse crate::progress::Progress;\nfn next() {}\nfn seen(p: Progress) {}\n",
        ),
    ]);
    let call = "perform(mut plan: &mut Plan, n: u32) { plan.next() }";
    assert_eq!(read_into(&krate, "edge.rs", call), ["plan.rs"]);
    // Not a parameter, and a field no struct of the file declares: the file's own `next`.
    let field = "perform(&self) { self.plan.next() }";
    assert_eq!(read_into(&krate, "edge.rs", field), ["edge.rs"]);
    let progress = "perform(p: Progress) { p.next() }";
    assert_eq!(read_into(&krate, "edge.rs", progress), ["progress.rs"]);
}

/// `on_record::decide(` after `use crate::marks::{self as on_record}` is `marks::decide`: it
/// was followed nowhere (no module is named `on_record`).
#[test]
fn a_call_through_a_modules_alias_goes_where_its_use_says() {
    let krate = made_up(&[
        ("lib.rs", "mod marks;\nmod edge;\n"),
        ("marks.rs", "pub fn decide() {}\n"),
        (
            "edge.rs",
            "use crate::marks::{self as on_record};\nfn commit() { on_record::decide() }\n",
        ),
    ]);
    let call = "on_record::decide()";
    assert_eq!(read_into(&krate, "edge.rs", call), ["marks.rs"]);
}

/// `self.storage.commit(` in a file with its own `commit`, whose struct declares
/// `storage: &Storage`, is `Storage::commit`: it was read as the file's own.
#[test]
fn a_fields_method_is_its_declared_types() {
    let krate = made_up(&[
        ("lib.rs", "mod storage;\nmod driver;\n"),
        (
            "storage.rs",
            "pub struct Storage;\nimpl Storage {\n    pub fn commit(&self) {}\n}\n",
        ),
        (
            "driver.rs",
            "use crate::storage::Storage;\nstruct Driver<'a> {\n    storage: &'a Storage,\n}\nimpl Driver<'_> {\n    fn commit(&self) { self.storage.commit() }\n}\n",
        ),
    ]);
    let call = "commit(&self) { self.storage.commit() }";
    assert_eq!(read_into(&krate, "driver.rs", call), ["storage.rs"]);
    assert_eq!(
        read_into(&krate, "driver.rs", "commit(&self) { self.commit() }"),
        ["driver.rs"]
    );
}

//! The tables of a driver file as serde reads them (the format is documented in
//! `balancers/README.md`); [`super::file`] checks and uses them.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// The file's tables, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Spec {
    pub(super) name: String,
    #[serde(default)]
    pub(super) about: String,
    pub(super) config: ConfigSpec,
    pub(super) start: StartSpec,
    #[serde(default)]
    pub(super) reload: Option<Action>,
    #[serde(default)]
    pub(super) drain: Option<Action>,
    #[serde(default)]
    pub(super) maintenance: Option<Action>,
    #[serde(default)]
    pub(super) view: Option<View>,
    #[serde(default)]
    pub(super) retries: Option<View>,
    #[serde(default)]
    pub(super) log: Option<LogSpec>,
    #[serde(default)]
    pub(super) unsupported: BTreeMap<Spanned<String>, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConfigSpec {
    /// The file written into the run's directory.
    pub(super) file: String,
    /// Its text, a template.
    pub(super) template: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StartSpec {
    pub(super) command: Spanned<Vec<String>>,
    #[serde(default)]
    pub(super) ready_url: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) version: Option<Vec<String>>,
    #[serde(default = "sigterm")]
    pub(super) stop_signal: String,
}

fn sigterm() -> String {
    "TERM".into()
}

/// Something done to the product: a line on its admin socket, an HTTP request, a
/// command, a signal, or (`reload = true`) its configuration written again and
/// reloaded.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// A Unix socket to send `send` to; the answer is read to its end.
    #[serde(default)]
    pub socket: Option<Spanned<String>>,
    /// The line sent on `socket` (a newline is added).
    #[serde(default)]
    pub send: Option<Spanned<String>>,
    /// An HTTP URL.
    #[serde(default)]
    pub url: Option<Spanned<String>>,
    /// Its method (default GET).
    #[serde(default)]
    pub method: Option<String>,
    /// Its body.
    #[serde(default)]
    pub body: Option<Spanned<String>>,
    /// A command; its standard output is the answer.
    #[serde(default)]
    pub command: Option<Spanned<Vec<String>>>,
    /// A signal to the product's process (HUP, USR2 …).
    #[serde(default)]
    pub signal: Option<String>,
    /// Write the configuration again (a drained backend has `draining` set), then
    /// reload the product by the file's `[reload]`.
    #[serde(default)]
    pub reload: bool,
    /// In `[reload]`: nothing to send, the product watches its configuration file.
    #[serde(default)]
    pub watched: bool,
    /// After the action, wait for this URL to answer 200 with a body for which
    /// `applied_when` renders `true`: the product took the new configuration.
    #[serde(default)]
    pub applied_url: Option<Spanned<String>>,
    /// A template of the context and `answer` (the body of `applied_url`).
    #[serde(default)]
    pub applied_when: Option<Spanned<String>>,
    /// The answer, trimmed, must be this; otherwise the action failed with it.
    #[serde(default)]
    pub expect: Option<String>,
}

/// A reading of the product: its view of each backend (`[view]`), or a count it
/// keeps (`[retries]`: csv or prometheus, summed) — a query and a rule that reads
/// its answer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct View {
    /// How often it is read, in ms.
    #[serde(default = "every_50")]
    pub every_ms: u64,
    /// A Unix socket to ask on, with `send`.
    #[serde(default)]
    pub socket: Option<Spanned<String>>,
    /// The line sent on `socket`.
    #[serde(default)]
    pub send: Option<Spanned<String>>,
    /// Or an HTTP URL, GET.
    #[serde(default)]
    pub url: Option<Spanned<String>>,
    /// Or a command; its standard output is the answer.
    #[serde(default)]
    pub command: Option<Spanned<Vec<String>>>,
    /// How the answer is read.
    #[serde(default)]
    pub csv: Option<CsvRule>,
    /// See `csv`.
    #[serde(default)]
    pub json: Option<JsonRule>,
    /// See `csv`.
    #[serde(default)]
    pub prometheus: Option<PromRule>,
    /// Or no query: the product's output (standard output and error), a JSON object per line.
    #[serde(default)]
    pub log: Option<LogRule>,
    /// The product's state words (the first word of its status) in snag's: UP,
    /// DOWN, DRAIN, MAINT. Words not listed are taken as they are, in capitals.
    #[serde(default)]
    pub states: BTreeMap<String, String>,
}

fn every_50() -> u64 {
    50
}

/// Rows of comma-separated fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsvRule {
    /// Only rows starting with this.
    #[serde(default)]
    pub rows: String,
    /// The backend's field (0-based).
    #[serde(default)]
    pub id: usize,
    /// The status field.
    #[serde(default)]
    pub status: usize,
    /// Rows whose id is one of these are skipped (`BACKEND`, `FRONTEND` …).
    #[serde(default)]
    pub skip: Vec<String>,
    /// For a counter: the fields summed over the rows.
    #[serde(default)]
    pub sum: Vec<usize>,
    /// In a view: the fields summed into each backend's count of requests served
    /// (HAProxy's hrsp_1xx … hrsp_other), for `snag watch`'s figures.
    #[serde(default)]
    pub requests: Vec<usize>,
}

/// A JSON document.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonRule {
    /// A JSON pointer to an object of status by backend, or to an array of objects.
    #[serde(default)]
    pub at: String,
    /// For an array: the member naming the backend.
    #[serde(default)]
    pub id: Option<String>,
    /// For an array: the member with its status.
    #[serde(default)]
    pub status: Option<String>,
}

/// A log of JSON lines: a line with both members is a backend's new status (only
/// the statuses named in `states` count).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogRule {
    /// A JSON pointer to the member naming the backend.
    pub key: String,
    /// A JSON pointer to its status.
    pub status: String,
}

/// Prometheus' text format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromRule {
    /// The metric.
    pub metric: String,
    /// Its label naming the backend (a view); absent for a counter, which sums
    /// every series.
    #[serde(default)]
    pub label: Option<String>,
}

impl View {
    /// What it asks, as an action.
    pub fn query(&self) -> Action {
        Action {
            socket: self.socket.clone(),
            send: self.send.clone(),
            url: self.url.clone(),
            command: self.command.clone(),
            ..Action::default()
        }
    }
}

/// Lines of the product's output worth a place in the timeline.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSpec {
    /// Lines containing this, from it on.
    pub contains: String,
}

//! HTTP faults: they act on requests and responses in `mode = "http"`, one exchange
//! at a time, where the TCP stages act on bytes. `http.rs` applies them; this file
//! holds what each one is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `http_status`: answer in the backend's place, without contacting it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpStatus {
    /// The status code, 100–999.
    pub status: u16,
    /// The response body.
    pub body: String,
    /// Extra response headers.
    pub headers: BTreeMap<String, String>,
}

impl Default for HttpStatus {
    fn default() -> Self {
        HttpStatus {
            status: 503,
            body: String::new(),
            headers: BTreeMap::new(),
        }
    }
}

/// How `bad_body` breaks the body; the status and headers stay the backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadBodyMode {
    /// The first `bytes` bytes, then the connection closes (a short body).
    #[default]
    Truncate,
    /// Random bytes of the same length.
    Garbage,
    /// No body at all (Content-Length 0).
    Empty,
    /// `text` instead of the body, e.g. `{"status":"degraded"}`.
    Replace,
    /// The whole body under a Content-Length `bytes` larger, then a close.
    WrongLength,
}

/// `bad_body`: the backend's status with a broken body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BadBody {
    /// How.
    pub mode: BadBodyMode,
    /// `truncate`: bytes kept; `wrong_length`: bytes promised beyond the real length.
    pub bytes: u64,
    /// `replace`: the new body.
    pub text: String,
}

/// Where `http_delay` waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DelayAt {
    /// Before the response head goes to the client.
    #[default]
    Headers,
    /// After the head, before the first body byte.
    Body,
    /// Before every body chunk.
    Chunk,
}

/// `http_delay`: hold the response.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpDelay {
    /// How long, ms.
    pub delay: u64,
    /// Where.
    pub at: DelayAt,
}

/// `drop_request`: forward nothing and answer nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DropRequest {
    /// Reset the connection after this many ms; 0 = wait until the client gives up.
    pub timeout: u64,
}

/// `reset_mid_response`: the head and the first `bytes` of the body, then RST.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResetMidResponse {
    /// Body bytes that pass before the reset.
    pub bytes: u64,
}

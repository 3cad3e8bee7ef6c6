//! `drop_request`: forward nothing and answer nothing.

use std::time::Duration;

use hyper::http::request;
use serde::{Deserialize, Serialize};

use super::{Exchange, HttpFault, Reply};

/// `drop_request` attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DropRequest {
    /// Reset the connection after this many ms; 0 = wait until the client gives up.
    pub timeout: u64,
}

impl HttpFault for DropRequest {
    fn type_name(&self) -> &'static str {
        "drop_request"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    fn request(&self, _req: &request::Parts, _cx: &mut Exchange) -> Option<Reply> {
        let after = (self.timeout > 0).then(|| Duration::from_millis(self.timeout));
        Some(Reply::Drop(after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::exchange;

    #[test]
    fn drops_and_resets_after_its_timeout_or_holds_until_the_client_gives_up() {
        let req = hyper::Request::post("/").body(()).unwrap().into_parts().0;
        let reset = DropRequest { timeout: 250 }.request(&req, &mut exchange());
        assert!(matches!(reset, Some(Reply::Drop(Some(d))) if d == Duration::from_millis(250)));
        let hold = DropRequest { timeout: 0 }.request(&req, &mut exchange());
        assert!(matches!(hold, Some(Reply::Drop(None))));
    }
}

//! `grpc_status`: answer a gRPC call in the backend's place with a status and no
//! message — a trailers-only response, `grpc-status` in the head.

use hyper::http::request;
use serde::{Deserialize, Serialize};

use super::{Exchange, HttpFault, Reply, grpc};

/// `grpc_status` attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcStatus {
    /// The status code, 0–16 (14: UNAVAILABLE).
    pub code: u32,
    /// `grpc-message`, the status's text.
    pub message: String,
}

impl Default for GrpcStatus {
    fn default() -> Self {
        GrpcStatus {
            code: 14,
            message: String::new(),
        }
    }
}

impl HttpFault for GrpcStatus {
    fn type_name(&self) -> &'static str {
        "grpc_status"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    fn validate(&self) -> Result<(), String> {
        if self.code > 16 {
            return Err(format!(
                "code {} is not a gRPC status (0–16, e.g. 14 UNAVAILABLE)",
                self.code
            ));
        }
        Ok(())
    }

    /// Requests that are not gRPC calls pass.
    fn request(&self, req: &request::Parts, _cx: &mut Exchange) -> Option<Reply> {
        grpc::is_call(req).then(|| {
            Reply::Answer(grpc::head(
                Default::default(),
                grpc::status(self.code, &self.message),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::exchange;

    fn call(content_type: &str) -> request::Parts {
        hyper::Request::post("/shop.Cart/Add")
            .header("content-type", content_type)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn answers_grpc_calls_trailers_only_and_lets_other_requests_pass() {
        let fault = GrpcStatus {
            code: 8,
            message: "quota".into(),
        };
        let Some(Reply::Answer(reply)) = fault.request(&call("application/grpc"), &mut exchange())
        else {
            panic!("no answer");
        };
        assert_eq!(reply.status(), 200);
        assert_eq!(reply.headers()["content-type"], "application/grpc");
        assert_eq!(reply.headers()["grpc-status"], "8");
        assert_eq!(reply.headers()["grpc-message"], "quota");
        assert!(reply.body().is_empty());
        assert!(
            fault
                .request(&call("application/json"), &mut exchange())
                .is_none()
        );
        assert!(
            GrpcStatus {
                code: 17,
                ..GrpcStatus::default()
            }
            .validate()
            .is_err()
        );
    }
}

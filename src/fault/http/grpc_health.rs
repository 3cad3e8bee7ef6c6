//! `grpc_health`: answer gRPC health checks (`grpc.health.v1.Health/Check`) with a
//! status of its choosing, in the backend's place, while other calls pass: the
//! gRPC form of a backend that reports itself unhealthy.

use hyper::http::request;
use serde::{Deserialize, Serialize};

use super::{Exchange, HttpFault, Reply, grpc};

/// The health status a check gets (grpc.health.v1's ServingStatus).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServingStatus {
    /// 0.
    Unknown,
    /// 1.
    Serving,
    /// 2.
    NotServing,
    /// 3 (the protocol gives it to Watch; some checkers read it from Check too).
    ServiceUnknown,
}

/// `grpc_health` attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcHealth {
    /// What the check is told.
    pub status: ServingStatus,
}

impl Default for GrpcHealth {
    fn default() -> Self {
        GrpcHealth {
            status: ServingStatus::NotServing,
        }
    }
}

impl HttpFault for GrpcHealth {
    fn type_name(&self) -> &'static str {
        "grpc_health"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    /// Only health checks: every other request passes.
    fn request(&self, req: &request::Parts, _cx: &mut Exchange) -> Option<Reply> {
        if !grpc::is_call(req) || req.uri.path() != grpc::HEALTH_CHECK {
            return None;
        }
        // HealthCheckResponse { status = 1 }: field 1, varint.
        let message = [0x08, self.status as u8];
        Some(Reply::AnswerWithTrailers(
            grpc::head(grpc::frame(&message), Default::default()),
            grpc::status(0, ""),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::exchange;

    fn call(path: &str) -> request::Parts {
        hyper::Request::post(path)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn health_checks_get_the_status_other_calls_pass() {
        let fault = GrpcHealth::default();
        let Some(Reply::AnswerWithTrailers(reply, trailers)) =
            fault.request(&call(grpc::HEALTH_CHECK), &mut exchange())
        else {
            panic!("no answer");
        };
        assert_eq!(reply.body().as_ref(), [0, 0, 0, 0, 2, 0x08, 2]);
        assert_eq!(trailers["grpc-status"], "0");
        assert!(
            fault
                .request(&call("/shop.Cart/Add"), &mut exchange())
                .is_none()
        );
        let attrs: GrpcHealth =
            serde_json::from_value(serde_json::json!({ "status": "SERVICE_UNKNOWN" })).unwrap();
        assert_eq!(attrs.status as u8, 3);
    }
}

//! KubeVirt's answers for the subresources: a `metav1.Status` with the API machinery's message
//! shapes (v1.9.0 `writeError`), or plain text where v1.9.0 writes plain text.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The kinds v1.9.0 names in its errors (`v1.Resource(...)`: group `kubevirt.io`, singular).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    VirtualMachine,
    VirtualMachineInstance,
}

impl Kind {
    pub fn singular(self) -> &'static str {
        match self {
            Kind::VirtualMachine => "virtualmachine",
            Kind::VirtualMachineInstance => "virtualmachineinstance",
        }
    }
}

/// An error answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
    /// v1.9.0 writes some errors as plain text (`response.WriteError`), not as a Status.
    pub plain: bool,
}

impl ApiError {
    pub fn not_found(kind: Kind, name: &str) -> Self {
        ApiError {
            code: 404,
            reason: "NotFound",
            message: format!("{}.kubevirt.io \"{name}\" not found", kind.singular()),
            details: Some(json!({"name": name, "group": "kubevirt.io", "kind": kind.singular()})),
            plain: false,
        }
    }

    pub fn conflict(kind: Kind, name: &str, message: &str) -> Self {
        ApiError {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {}.kubevirt.io \"{name}\": {message}",
                kind.singular()
            ),
            details: Some(json!({"name": name, "group": "kubevirt.io", "kind": kind.singular()})),
            plain: false,
        }
    }

    pub fn forbidden(kind: Kind, name: &str, message: &str) -> Self {
        ApiError {
            code: 403,
            reason: "Forbidden",
            message: format!(
                "{}.kubevirt.io \"{name}\" is forbidden: {message}",
                kind.singular()
            ),
            details: Some(json!({"name": name, "group": "kubevirt.io", "kind": kind.singular()})),
            plain: false,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            code: 400,
            reason: "BadRequest",
            message: message.into(),
            details: None,
            plain: false,
        }
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        let message = message.to_string();
        ApiError {
            code: 500,
            reason: "InternalError",
            message: format!("Internal error occurred: {message}"),
            details: Some(json!({"causes": [{"message": message}]})),
            plain: false,
        }
    }

    /// The same error written as plain text with `code` (v1.9.0's GET handlers).
    pub fn as_plain(mut self, code: u16) -> Self {
        self.code = code;
        self.plain = true;
        self
    }

    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if self.plain {
            return (
                code,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                self.message,
            )
                .into_response();
        }
        (
            code,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_vec(&self.status()).unwrap_or_default(),
        )
            .into_response()
    }
}

/// An error of the API server for a patch: a failed `test` is someone else's change (409),
/// anything else is internal (v1.9.0 `jsonpatchTestErr`; it matches only a test of a missing
/// path, a test of a changed value says "testing value ... failed", also a conflict here).
pub fn from_patch_error(kind: Kind, name: &str, error: &kube::Error) -> ApiError {
    let text = error.to_string();
    if text.contains("jsonpatch test operation does not apply") || text.contains("testing value") {
        ApiError::conflict(kind, name, &text)
    } else {
        ApiError::internal(text)
    }
}

//! `admission.k8s.io/v1` `AdmissionReview` as the API server sends it to a webhook and
//! reads the answer, and the answers KubeVirt v1.9.0's webhooks give
//! (`pkg/util/webhooks/webhooks.go`, `validating-webhooks/validating-webhook.go`): a refusal
//! is a `metav1.Status` with reason `Invalid`, code 422, the causes' messages joined by ", "
//! as its message (at most 10 causes, then "and N more validation errors") and the causes
//! in `details.causes`; a request the webhook cannot read is refused with code 400 and the
//! error as the message; a mutation is a JSON patch.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// `admission.k8s.io/v1`.
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// The review: a request in, the same review with a response out.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Request>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<Response>,
}

/// `GroupVersionResource` of the request (`metav1.GroupVersionResource`).
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq, Eq)]
pub struct Resource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// Who asks (`authenticationv1.UserInfo`).
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// What the API server asks about (the fields read here; the rest is ignored).
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub uid: String,
    #[serde(default)]
    pub resource: Resource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: String,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// The answer (`admissionv1.AdmissionResponse`).
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    pub uid: String,
    pub allowed: bool,
    /// Go's `Result`, whose JSON key is `status` (the API server reads nothing under
    /// `result`: a refusal would come out "without explanation").
    #[serde(rename = "status", default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Status>,
    /// The JSON patch, base64 as Go encodes `[]byte`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// `metav1.Status` as a webhook's result.
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct Status {
    #[serde(default)]
    pub metadata: Value,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
    pub code: u16,
}

/// `metav1.StatusDetails`: here only the causes.
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq)]
pub struct Details {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
}

/// `metav1.StatusCause`: its type is serialized as `reason`.
#[derive(Debug, Clone, Deserialize, Serialize, Default, PartialEq, Eq)]
pub struct Cause {
    #[serde(rename = "reason", default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

/// `metav1.CauseTypeFieldValueInvalid`.
pub const FIELD_VALUE_INVALID: &str = "FieldValueInvalid";
/// `metav1.CauseTypeFieldValueNotSupported`.
pub const FIELD_VALUE_NOT_SUPPORTED: &str = "FieldValueNotSupported";
/// `metav1.CauseTypeFieldValueRequired`.
pub const FIELD_VALUE_REQUIRED: &str = "FieldValueRequired";
/// `metav1.CauseTypeForbidden`.
pub const FIELD_VALUE_FORBIDDEN: &str = "FieldValueForbidden";

impl Cause {
    pub fn new(kind: &str, message: impl Into<String>, field: impl Into<String>) -> Self {
        Cause {
            kind: kind.to_string(),
            message: message.into(),
            field: field.into(),
        }
    }
}

/// The most causes an answer carries (`ToAdmissionResponse`).
const MAX_CAUSES: usize = 10;

impl Response {
    /// Allowed, nothing changed.
    pub fn allowed() -> Self {
        Response {
            allowed: true,
            ..Default::default()
        }
    }

    /// Allowed with `patch` (JSON patch operations); allowed unchanged when there are none.
    pub fn patched(operations: Vec<Value>) -> Self {
        if operations.is_empty() {
            return Response::allowed();
        }
        let bytes = serde_json::to_vec(&operations).unwrap_or_default();
        Response {
            allowed: true,
            patch: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            patch_type: Some("JSONPatch".into()),
            ..Default::default()
        }
    }

    /// Refused for `causes` (`ToAdmissionResponse`); allowed when there are none.
    pub fn refused(causes: Vec<Cause>) -> Self {
        if causes.is_empty() {
            return Response::allowed();
        }
        let more = causes.len().saturating_sub(MAX_CAUSES);
        let causes: Vec<Cause> = causes.into_iter().take(MAX_CAUSES).collect();
        let mut message = causes
            .iter()
            .map(|c| c.message.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        if more > 0 {
            message = format!("{message}, and {more} more validation errors");
        }
        Response {
            allowed: false,
            result: Some(Status {
                metadata: json!({}),
                message,
                reason: "Invalid".into(),
                details: Some(Details { causes }),
                code: 422,
            }),
            ..Default::default()
        }
    }

    /// A request the webhook could not judge (`ToAdmissionResponseError`): refused, code 400.
    pub fn error(message: impl Into<String>) -> Self {
        Response {
            allowed: false,
            result: Some(Status {
                metadata: json!({}),
                message: message.into(),
                code: 400,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Refused with `message` and code 429 Too Many Requests, no reason and no causes: the
    /// pod-eviction webhook's answer (`pod-eviction-admitter.go`'s `denied`), which the API
    /// server passes on as a 429 that `kubectl drain` retries.
    pub fn denied(message: impl Into<String>) -> Self {
        Response {
            allowed: false,
            result: Some(Status {
                metadata: json!({}),
                message: message.into(),
                code: 429,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The patch operations, decoded (tests).
    pub fn patch_operations(&self) -> Option<Vec<Value>> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(self.patch.as_deref()?)
            .ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// The review answering `review` with `response` (its UID copied, the request dropped).
pub fn answer(review: &AdmissionReview, mut response: Response) -> AdmissionReview {
    if let Some(request) = &review.request {
        response.uid = request.uid.clone();
    }
    AdmissionReview {
        // The request's version, as KubeVirt answers (v1 is the only one registered here).
        api_version: if review.api_version.is_empty() {
            API_VERSION.into()
        } else {
            review.api_version.clone()
        },
        kind: "AdmissionReview".into(),
        request: None,
        response: Some(response),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_refusal_as_kubevirt_writes_it() {
        let response = Response::refused(vec![
            Cause::new(
                FIELD_VALUE_INVALID,
                "HostDisk feature gate is not enabled",
                "spec.volumes[0]",
            ),
            Cause::new(FIELD_VALUE_REQUIRED, "second", "spec.x"),
        ]);
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            json!({
                "uid": "",
                "allowed": false,
                "status": {
                    "metadata": {},
                    "message": "HostDisk feature gate is not enabled, second",
                    "reason": "Invalid",
                    "details": {"causes": [
                        {"reason": "FieldValueInvalid", "message": "HostDisk feature gate is not enabled", "field": "spec.volumes[0]"},
                        {"reason": "FieldValueRequired", "message": "second", "field": "spec.x"},
                    ]},
                    "code": 422,
                },
            })
        );
        let many = Response::refused(
            (0..12)
                .map(|i| Cause::new(FIELD_VALUE_INVALID, format!("c{i}"), ""))
                .collect(),
        );
        let status = many.result.unwrap();
        assert_eq!(status.details.unwrap().causes.len(), 10);
        assert!(
            status.message.ends_with("c9, and 2 more validation errors"),
            "{}",
            status.message
        );
    }

    #[test]
    fn the_answer_carries_the_requests_uid_and_a_base64_json_patch() {
        let review: AdmissionReview = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE",
                        "resource": {"group": "kubevirt.io", "version": "v1", "resource": "virtualmachineinstances"},
                        "userInfo": {"username": "admin"}, "object": {}}}))
        .unwrap();
        let ops = vec![json!({"op": "replace", "path": "/spec", "value": {}})];
        let out = serde_json::to_value(answer(&review, Response::patched(ops.clone()))).unwrap();
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(out["kind"], "AdmissionReview");
        assert_eq!(out["response"]["uid"], "u-1");
        assert_eq!(out["response"]["allowed"], true);
        assert_eq!(out["response"]["patchType"], "JSONPatch");
        assert!(out.get("request").is_none());
        let response: Response = serde_json::from_value(out["response"].clone()).unwrap();
        assert_eq!(response.patch_operations(), Some(ops));
        assert_eq!(Response::patched(vec![]), Response::allowed());
    }
}

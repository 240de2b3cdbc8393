//! May this user do this: one `SubjectAccessReview` per request, built from the path and the
//! method as v1.9.0's `pkg/virt-api/rest/authorizer.go` builds it. The API server checked the
//! same attributes before proxying; virt-api asks again because it cannot know that a
//! request came through an API server that authorizes (the review is what KubeVirt relies on).

use crate::frontproxy::User;
use axum::http::Method;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

/// The review for `method` on `path`, or why the path names nothing reviewable (v1.9.0 then
/// refuses with that text).
pub fn access_review(
    method: &Method,
    path: &str,
    user: &User,
) -> Result<SubjectAccessReview, String> {
    // The review is built from the path as sent, the handlers act on its decoded segments:
    // no Kubernetes name or namespace holds a `%`, so an encoded path is refused rather than
    // reviewed under one name and acted on under another.
    if path.contains('%') {
        return Err(format!("unknown api endpoint: {path}"));
    }
    // "", "apis", group, version, "namespaces", namespace, resource, [name, subresource...]
    let parts: Vec<&str> = path.split('/').collect();
    let attributes = if parts.len() >= 9 {
        let (resource, name) = (parts[6], parts[7]);
        if resource != "virtualmachineinstances" && resource != "virtualmachines" {
            return Err(format!("unknown resource type {resource}"));
        }
        // A port-forward's port and protocol are not part of what RBAC grants.
        let subresource = if parts[8] == "portforward" {
            "portforward".to_string()
        } else {
            parts[8..].join("/")
        };
        ResourceAttributes {
            namespace: Some(parts[5].into()),
            verb: Some(verb(method, name)?.into()),
            group: Some(parts[2].into()),
            version: Some(parts[3].into()),
            resource: Some(resource.into()),
            subresource: Some(subresource),
            name: Some(name.into()),
            ..Default::default()
        }
    } else if parts.len() == 7 {
        if parts[6] != "expand-vm-spec" {
            return Err(format!("unknown resource type {}", parts[6]));
        }
        ResourceAttributes {
            namespace: Some(parts[5].into()),
            verb: Some(verb(method, "")?.into()),
            group: Some(parts[2].into()),
            version: Some(parts[3].into()),
            resource: Some(parts[6].into()),
            ..Default::default()
        }
    } else {
        return Err(format!("unknown api endpoint: {path}"));
    };
    Ok(SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(attributes),
            ..Default::default()
        },
        ..Default::default()
    })
}

/// Kubernetes' request verbs; with no name, the collection's.
fn verb(method: &Method, name: &str) -> Result<&'static str, String> {
    Ok(match *method {
        Method::POST => "create",
        Method::GET | Method::HEAD if name.is_empty() => "list",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if name.is_empty() => "deletecollection",
        Method::DELETE => "delete",
        ref other => return Err(format!("unknown http verb in request: {other}")),
    })
}

/// Asks the API server: allowed, or the reason it gave.
pub async fn review(
    client: &kube::Client,
    review: &SubjectAccessReview,
) -> anyhow::Result<Result<(), String>> {
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let answered = api.create(&PostParams::default(), review).await?;
    let status = answered.status.unwrap_or_default();
    Ok(if status.allowed {
        Ok(())
    } else {
        Err(status.reason.unwrap_or_default())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> User {
        User {
            name: "alice".into(),
            groups: vec!["dev".into()],
            ..Default::default()
        }
    }

    #[test]
    fn reviews_name_the_subresource_as_rbac_grants_it() {
        let base = "/apis/subresources.kubevirt.io/v1/namespaces/ns";
        let r = access_review(
            &Method::PUT,
            &format!("{base}/virtualmachineinstances/vm1/pause"),
            &alice(),
        )
        .unwrap();
        let a = r.spec.resource_attributes.unwrap();
        assert_eq!(
            (
                a.verb.as_deref(),
                a.group.as_deref(),
                a.version.as_deref(),
                a.resource.as_deref(),
                a.subresource.as_deref(),
                a.name.as_deref(),
                a.namespace.as_deref()
            ),
            (
                Some("update"),
                Some("subresources.kubevirt.io"),
                Some("v1"),
                Some("virtualmachineinstances"),
                Some("pause"),
                Some("vm1"),
                Some("ns")
            )
        );
        assert_eq!(r.spec.user.as_deref(), Some("alice"));
        let console = access_review(
            &Method::GET,
            &format!("{base}/virtualmachineinstances/vm1/console"),
            &alice(),
        )
        .unwrap();
        assert_eq!(
            console.spec.resource_attributes.unwrap().verb.as_deref(),
            Some("get")
        );
        let forward = access_review(
            &Method::GET,
            &format!("{base}/virtualmachines/vm1/portforward/22/tcp"),
            &alice(),
        )
        .unwrap();
        assert_eq!(
            forward
                .spec
                .resource_attributes
                .unwrap()
                .subresource
                .as_deref(),
            Some("portforward")
        );
        let nested = access_review(
            &Method::PUT,
            &format!("{base}/virtualmachines/vm1/evacuate/cancel"),
            &alice(),
        )
        .unwrap();
        assert_eq!(
            nested
                .spec
                .resource_attributes
                .unwrap()
                .subresource
                .as_deref(),
            Some("evacuate/cancel")
        );
        let expand = access_review(&Method::PUT, &format!("{base}/expand-vm-spec"), &alice())
            .unwrap()
            .spec
            .resource_attributes
            .unwrap();
        assert_eq!(
            (expand.resource.as_deref(), expand.name),
            (Some("expand-vm-spec"), None)
        );
    }

    #[test]
    fn paths_that_name_nothing_reviewable_are_refused() {
        let base = "/apis/subresources.kubevirt.io/v1/namespaces/ns";
        for (method, path, want) in [
            (
                Method::PUT,
                format!("{base}/pods/p/exec"),
                "unknown resource type pods",
            ),
            (
                Method::PUT,
                format!("{base}/secrets"),
                "unknown resource type secrets",
            ),
            (Method::GET, "/apis/x".to_string(), "unknown api endpoint"),
            (
                Method::PUT,
                format!("{base}/virtualmachineinstances/vm%31/pause"),
                "unknown api endpoint",
            ),
            (
                Method::OPTIONS,
                format!("{base}/virtualmachines/v/start"),
                "unknown http verb",
            ),
        ] {
            let error = access_review(&method, &path, &alice()).unwrap_err();
            assert!(error.contains(want), "{path}: {error}");
        }
    }
}

//! What the aggregation layer and `kubectl` read to learn what virt-api serves (v1.9.0
//! `pkg/virt-api/api.go`: `/`, `/apis`, the group, each version's resource list), answered to
//! anyone, as KubeVirt's `noAuthEndpoints`.

use crate::server::SUBRESOURCE_VERSIONS;
use serde_json::{Value, json};

/// `v1.SubresourceGroupName`.
pub const GROUP: &str = "subresources.kubevirt.io";

/// The subresources each version lists, in v1.9.0's order (`getAPISubResources`). Listing is
/// not serving: those without a display, a guest agent or hotplug answer what v1.9.0 answers
/// in such a case, or a clear refusal.
pub const RESOURCES: &[&str] = &[
    "expand-vm-spec",
    "virtualmachineinstances/vnc",
    "virtualmachineinstances/vnc/screenshot",
    "virtualmachineinstances/console",
    "virtualmachineinstances/portforward",
    "virtualmachineinstances/backup",
    "virtualmachineinstances/redefine-checkpoint",
    "virtualmachineinstances/pause",
    "virtualmachineinstances/unpause",
    "virtualmachineinstances/freeze",
    "virtualmachineinstances/unfreeze",
    "virtualmachineinstances/reset",
    "virtualmachineinstances/softreboot",
    "virtualmachines/start",
    "virtualmachines/stop",
    "virtualmachines/restart",
    "virtualmachines/migrate",
    "virtualmachines/expand-spec",
    "virtualmachines/objectgraph",
    "virtualmachines/portforward",
    "virtualmachines/addvolume",
    "virtualmachines/removevolume",
    "virtualmachines/memorydump",
    "virtualmachines/removememorydump",
    "virtualmachines/evacuate/cancel",
    "virtualmachineinstances/guestosinfo",
    "virtualmachineinstances/userlist",
    "virtualmachineinstances/filesystemlist",
    "virtualmachineinstances/addvolume",
    "virtualmachineinstances/removevolume",
    "virtualmachineinstances/objectgraph",
    "virtualmachineinstances/sev/fetchcertchain",
    "virtualmachineinstances/sev/querylaunchmeasurement",
    "virtualmachineinstances/sev/setupsession",
    "virtualmachineinstances/sev/injectlaunchsecret",
    "virtualmachineinstances/evacuate/cancel",
];

/// Paths answered without authentication (v1.9.0 `noAuthEndpoints`).
pub fn is_public(path: &str) -> bool {
    if matches!(
        path,
        "/" | "/apis" | "/healthz" | "/openapi/v2" | "/openapi/v3"
    ) {
        return true;
    }
    SUBRESOURCE_VERSIONS.iter().any(|version| {
        let base = format!("/apis/{GROUP}/{version}");
        path == base
            || path == format!("{base}/version")
            || path == format!("{base}/guestfs")
            || path == format!("{base}/healthz")
            || path == format!("/openapi/v3{base}")
    })
}

/// `metav1.APIResourceList` of one version (`metav1.APIResource` without omitempty on
/// `singularName`, `kind` and `verbs`, as Go writes it).
pub fn resource_list(version: &str) -> Value {
    let resources: Vec<Value> = RESOURCES
        .iter()
        .map(|name| json!({"name": name, "singularName": "", "namespaced": true, "kind": "", "verbs": null}))
        .collect();
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{GROUP}/{version}"),
        "resources": resources,
    })
}

/// `subresourceAPIGroup()`. Its `name` is v1.9.0's, without the group's `s`: clients that
/// read it get what they would get from KubeVirt.
pub fn api_group() -> Value {
    let versions: Vec<Value> = SUBRESOURCE_VERSIONS
        .iter()
        .map(|v| json!({"groupVersion": format!("{GROUP}/{v}"), "version": v}))
        .collect();
    json!({
        "kind": "APIGroup",
        "name": "subresource.kubevirt.io",
        "versions": versions,
        "preferredVersion": versions[0],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    })
}

/// `metav1.APIGroupList` with that one group.
pub fn api_group_list() -> Value {
    json!({"kind": "APIGroupList", "groups": [api_group()]})
}

/// `metav1.RootPaths`.
pub fn root_paths() -> Value {
    let mut paths = vec!["/apis".to_string(), "/openapi/v2".to_string()];
    for version in SUBRESOURCE_VERSIONS {
        paths.push(format!("/apis/{GROUP}"));
        paths.push(format!("/apis/{GROUP}/{version}"));
    }
    json!({"paths": paths})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_is_public_and_everything_else_is_not() {
        for path in [
            "/",
            "/apis",
            "/apis/subresources.kubevirt.io/v1",
            "/apis/subresources.kubevirt.io/v1alpha3/version",
            "/openapi/v3/apis/subresources.kubevirt.io/v1",
        ] {
            assert!(is_public(path), "{path}");
        }
        for path in [
            "/apis/subresources.kubevirt.io/v1/namespaces/d/virtualmachineinstances/v/pause",
            "/apis/subresources.kubevirt.io/v2",
            "/apis/subresources.kubevirt.io/v1/",
            "/apis/subresources.kubevirt.io",
        ] {
            assert!(!is_public(path), "{path}");
        }
        let list = resource_list("v1");
        assert_eq!(list["groupVersion"], "subresources.kubevirt.io/v1");
        assert!(
            list["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "virtualmachineinstances/console")
        );
        assert_eq!(
            api_group()["preferredVersion"]["groupVersion"],
            "subresources.kubevirt.io/v1"
        );
    }
}

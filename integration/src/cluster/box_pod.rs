//! Plain pods for the cluster tests that check the cluster itself (not VMs): a busybox test
//! image running a shell script, and the reads those tests make of them.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::Cluster;

/// A pod running `script` with busybox's `sh` in `image` (which must hold `/bin/busybox`;
/// see [`super::TestImage::with_busybox`]), `restartPolicy: Never`, with `extra_spec`'s
/// fields laid over its spec (objects merged key by key, anything else replaced).
pub fn box_pod(image: &str, name: &str, script: &str, extra_spec: Value) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["/bin/busybox", "sh", "-c", script],
            }],
        },
    });
    merge(&mut pod["spec"], extra_spec);
    serde_json::from_value(pod).expect("a valid pod")
}

fn merge(target: &mut Value, extra: Value) {
    match (target, extra) {
        (Value::Object(target), Value::Object(extra)) => {
            for (key, value) in extra {
                merge(target.entry(key).or_insert(Value::Null), value);
            }
        }
        (target, extra) => *target = extra,
    }
}

impl Cluster {
    /// Creates `pod` in `namespace`.
    pub async fn create_pod(&self, namespace: &str, pod: &Pod) -> Result<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client()?, namespace);
        api.create(&PostParams::default(), pod)
            .await
            .with_context(|| format!("creating pod {:?}", pod.metadata.name))
    }

    /// `kubectl logs` of a pod's (only) container.
    pub fn pod_logs(&self, namespace: &str, pod: &str) -> Result<String> {
        self.kubectl_output(&["logs", "-n", namespace, pod])
    }
}

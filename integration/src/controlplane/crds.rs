//! CustomResourceDefinition manifests: reading them and installing them until Established.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use serde::Deserialize;

/// Field manager for server-side apply of CRDs (several tests may install the same ones).
const FIELD_MANAGER: &str = "kubevirt-rs-integration";

/// Where `cargo run -p proto --bin crdgen -- images/deploy/crds` writes KubeVirt's CRDs.
pub fn generated_kubevirt_crd_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/deploy/crds")
}

/// The kubevirt.io CRDs the `proto` crate generates: every `*.yaml`/`*.yml`/`*.json` under
/// [`generated_kubevirt_crd_dir`].
pub fn kubevirt_crds() -> Result<Vec<CustomResourceDefinition>> {
    let dir = generated_kubevirt_crd_dir();
    let regenerate = "generate them with `cargo run -p proto --bin crdgen -- images/deploy/crds`";
    let mut files = std::fs::read_dir(&dir)
        .and_then(|entries| {
            entries
                .map(|e| e.map(|e| e.path()))
                .collect::<std::io::Result<Vec<_>>>()
        })
        .with_context(|| format!("listing {} ({regenerate})", dir.display()))?;
    files.retain(|p| {
        matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        )
    });
    files.sort();
    if files.is_empty() {
        bail!("no CRD manifests in {} ({regenerate})", dir.display());
    }
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        crds.extend(parse_crd_manifests(&text).with_context(|| file.display().to_string())?);
    }
    Ok(crds)
}

/// Parses one or more CRDs from YAML (multi-document) or JSON text.
///
/// Empty documents are skipped; any other document must be an
/// `apiextensions.k8s.io/v1` `CustomResourceDefinition` with a name.
pub fn parse_crd_manifests(text: &str) -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(document)
            .with_context(|| format!("document {index} is not valid YAML"))?;
        if value.is_null() {
            continue;
        }
        let kind = value.get("kind").and_then(|k| k.as_str());
        let api_version = value.get("apiVersion").and_then(|k| k.as_str());
        if kind != Some("CustomResourceDefinition")
            || api_version != Some("apiextensions.k8s.io/v1")
        {
            bail!(
                "document {index} is {}/{}, not apiextensions.k8s.io/v1 CustomResourceDefinition",
                api_version.unwrap_or("<no apiVersion>"),
                kind.unwrap_or("<no kind>")
            );
        }
        let crd: CustomResourceDefinition = serde_yaml::from_value(value)
            .with_context(|| format!("document {index} is not a valid CustomResourceDefinition"))?;
        if crd.metadata.name.as_deref().is_none_or(str::is_empty) {
            bail!("document {index}: CustomResourceDefinition without metadata.name");
        }
        crds.push(crd);
    }
    if crds.is_empty() {
        bail!("no CustomResourceDefinition in the manifest");
    }
    Ok(crds)
}

/// Server-side applies `crds` and waits until each one is Established (served).
pub async fn install(
    client: kube::Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let mut names = Vec::with_capacity(crds.len());
    for crd in crds {
        let name = crd
            .metadata
            .name
            .clone()
            .ok_or_else(|| anyhow!("CustomResourceDefinition without metadata.name"))?;
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .with_context(|| format!("applying CRD {name}"))?;
        names.push(name);
    }
    for name in &names {
        tokio::time::timeout(
            timeout,
            await_condition(api.clone(), name, conditions::is_crd_established()),
        )
        .await
        .map_err(|_| anyhow!("CRD {name} not Established within {timeout:?}"))?
        .with_context(|| format!("watching CRD {name}"))?;
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi_manifest() -> String {
        let path = generated_kubevirt_crd_dir().join("kubevirt.io_virtualmachineinstances.yaml");
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn kubevirt_crds_have_the_vmi_with_status_subresource() {
        let crds = kubevirt_crds().unwrap();
        let vmi = crds
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some("virtualmachineinstances.kubevirt.io"))
            .expect("the VirtualMachineInstance CRD");
        assert_eq!(vmi.spec.group, "kubevirt.io");
        assert_eq!(vmi.spec.scope, "Namespaced");
        assert_eq!(vmi.spec.names.kind, "VirtualMachineInstance");
        let v1 = vmi
            .spec
            .versions
            .iter()
            .find(|v| v.name == "v1")
            .expect("v1");
        assert!(
            v1.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }

    #[test]
    fn multi_document_yaml_and_json_are_accepted() {
        let vmi = vmi_manifest();
        let two = format!("---\n{vmi}\n---\n{vmi}\n---\n");
        assert_eq!(parse_crd_manifests(&two).unwrap().len(), 2);
        let json = serde_json::to_string(&parse_crd_manifests(&vmi).unwrap()[0]).unwrap();
        assert_eq!(parse_crd_manifests(&json).unwrap().len(), 1);
    }

    #[test]
    fn bad_manifests_are_errors() {
        for (text, expected) in [
            ("", "no CustomResourceDefinition"),
            ("---\n---\n", "no CustomResourceDefinition"),
            ("a: [", "not valid YAML"),
            (
                "apiVersion: v1\nkind: ConfigMap\n",
                "not apiextensions.k8s.io/v1",
            ),
            ("kind: CustomResourceDefinition\n", "<no apiVersion>"),
            (
                "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nspec: 3\n",
                "not a valid CustomResourceDefinition",
            ),
            (
                "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
                 metadata: {}\nspec: {group: g, scope: Namespaced, names: {kind: K, plural: ks}, versions: []}\n",
                "without metadata.name",
            ),
        ] {
            let err = format!("{:#}", parse_crd_manifests(text).unwrap_err());
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let manifest = vmi_manifest();
        let base = manifest.as_bytes();
        for _ in 0..500 {
            let mut bytes = base.to_vec();
            for _ in 0..rng.random_range(1..8) {
                let at = rng.random_range(0..bytes.len());
                bytes[at] = rng.random();
            }
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_crd_manifests(&text);
        }
    }
}

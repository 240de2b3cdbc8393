//! Kubernetes manifests as `kubectl apply -f DIR` reads them, applied through the API.
//!
//! `kubectl apply -f DIR` (without `-R`) takes the files directly in DIR whose names end in
//! `.yaml`, `.yml` or `.json`, in name order, following symbolic links, and every YAML
//! document in each. [`read_dir`] does the same, so a test sees what an operator applies.

use anyhow::{Context, Result, bail};
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The objects of one manifest file.
pub struct Manifest {
    pub path: PathBuf,
    pub objects: Vec<DynamicObject>,
}

/// Every manifest file directly in `dir`, in the order `kubectl apply -f dir` applies them.
pub fn read_dir(dir: &Path) -> Result<Vec<Manifest>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    paths.retain(|p| {
        // Like kubectl: the extension decides; links are followed (`is_file` follows them).
        p.is_file()
            && p.extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
    });
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let objects = parse(&text).with_context(|| format!("parsing {}", path.display()))?;
            Ok(Manifest { path, objects })
        })
        .collect()
}

/// The objects of a YAML stream (empty documents skipped).
pub fn parse(text: &str) -> Result<Vec<DynamicObject>> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(document)?;
        if value.is_null() {
            continue;
        }
        let object: DynamicObject = serde_yaml::from_value(value)?;
        if object.types.is_none() {
            bail!("an object without apiVersion and kind");
        }
        objects.push(object);
    }
    Ok(objects)
}

/// `kind/name` (with `namespace/` for namespaced objects), for messages.
pub fn describe(object: &DynamicObject) -> String {
    let kind = object.types.as_ref().map_or("?", |t| t.kind.as_str());
    let name = object.metadata.name.as_deref().unwrap_or("?");
    match &object.metadata.namespace {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// Applies `object` by server-side apply with strict field validation (unknown or duplicate
/// fields are errors, as with `kubectl apply`'s default `--validate=strict`); `dry_run`: the
/// API server validates, admits and discards it. Namespaced objects go to their own
/// namespace, or `namespace` if given; a namespaced object with neither is an error.
pub async fn apply(
    client: &Client,
    object: &DynamicObject,
    namespace: Option<&str>,
    dry_run: bool,
) -> Result<DynamicObject> {
    let types = object.types.clone().context("apiVersion and kind")?;
    let (group, version) = match types.api_version.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), types.api_version.clone()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, &types.kind);
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("the API server does not know {}", describe(object)))?;
    let mut object = object.clone();
    let api: Api<DynamicObject> = if capabilities.scope == Scope::Namespaced {
        let ns = namespace
            .map(str::to_string)
            .or_else(|| object.metadata.namespace.clone())
            .with_context(|| format!("{} has no namespace", describe(&object)))?;
        object.metadata.namespace = Some(ns.clone());
        Api::namespaced_with(client.clone(), &ns, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    let name = object
        .metadata
        .name
        .clone()
        .with_context(|| format!("{} has no name", describe(&object)))?;
    let mut params = PatchParams::apply("kubevirt-rs-tests").validation_strict();
    params.dry_run = dry_run;
    api.patch(&name, &params, &Patch::Apply(&object))
        .await
        .with_context(|| format!("{} refused", describe(&object)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_objects_and_empty_ones_are_skipped() {
        let objects = parse(
            "---\n# just a comment\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n",
        )
        .unwrap();
        assert_eq!(objects.len(), 1);
        assert_eq!(describe(&objects[0]), "Namespace/a");
        assert!(parse("metadata: {name: a}\n").is_err());
    }

    #[test]
    fn a_directory_is_read_like_kubectl_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let object =
            |name: &str| format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {name}}}\n");
        std::fs::write(dir.path().join("10-b.yaml"), object("b")).unwrap();
        std::fs::write(dir.path().join("00-a.yml"), object("a")).unwrap();
        std::fs::write(dir.path().join("README.md"), "not a manifest").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/05-c.yaml"), object("c")).unwrap();
        std::os::unix::fs::symlink("sub/05-c.yaml", dir.path().join("05-link.yaml")).unwrap();
        let names: Vec<String> = read_dir(dir.path())
            .unwrap()
            .iter()
            .flat_map(|m| m.objects.iter().map(describe))
            .collect();
        assert_eq!(names, ["Namespace/a", "Namespace/c", "Namespace/b"]);
    }
}

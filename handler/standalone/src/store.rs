//! The API server's part in standalone mode: holds the VMIs given on the command line,
//! applies the handler's status writes with resource-version checks (as the API server
//! would), persists them under the state directory (so a restarted handler continues
//! from them), and shows the results: phase transitions and events on stdout, the status
//! in the state directory (`status/<namespace>_<name>.status.yaml`) or on stdout. Nothing is
//! written beside the manifests: they may live in a checkout, where `kubectl apply -f` of the
//! directory would then read the status as an object.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;
use proto::kubevirt::ready::{LauncherPod, ready_condition};
use proto::kubevirt::{Time, VirtualMachineInstance, VirtualMachineInstanceStatus};
use tokio::sync::mpsc;

use handler::vmis::status::HANDLER_OWNED_FIELDS;
use handler::vmis::{BoxFuture, EventKind, StatusWriteError, StatusWriter, VmiStore, key_of};

/// Where the status goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusOutput {
    /// `<state-dir>/status/<namespace>_<name>.status.yaml`.
    StateDir,
    /// The status YAML on stdout after each change.
    Stdout,
}

struct Entry {
    vmi: VirtualMachineInstance,
    status_writes: u32,
    /// When this run admitted the VMI (scheduled it), for the phase timing shown.
    admitted: std::time::Instant,
}

pub struct StandaloneStore {
    entries: Mutex<BTreeMap<String, Entry>>,
    changes: mpsc::UnboundedSender<String>,
    dir: PathBuf,
    state_dir: PathBuf,
    output: StatusOutput,
}

/// `<ns>_<name>`: names are DNS labels, but check anyway before using as a file name.
fn file_stem(key: &str) -> Option<String> {
    let name = key.replace('/', "_");
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !name.starts_with('.');
    ok.then_some(name)
}

fn file_name(key: &str) -> Option<String> {
    file_stem(key).map(|stem| format!("{stem}.json"))
}

/// Where [`StatusOutput::StateDir`] writes the status of `key` (`None` for a key that is
/// no file name).
pub fn status_file(state_dir: &Path, key: &str) -> Option<PathBuf> {
    Some(
        state_dir
            .join(STATUS_DIR)
            .join(format!("{}.status.yaml", file_stem(key)?)),
    )
}

/// The status files' directory under the state directory.
pub const STATUS_DIR: &str = "status";

/// Prints one line for the user (stdout is the standalone mode's interface).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

impl StandaloneStore {
    /// `dir` holds the persisted VMIs; the status files go under `state_dir`.
    pub fn new(
        dir: &Path,
        state_dir: &Path,
        output: StatusOutput,
    ) -> (Self, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            StandaloneStore {
                entries: Mutex::new(BTreeMap::new()),
                changes: tx,
                dir: dir.to_path_buf(),
                state_dir: state_dir.to_path_buf(),
                output,
            },
            rx,
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        // Entries are replaced whole under the lock; poisoning leaves them consistent.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The persisted copy of a VMI from an earlier run, if any.
    pub fn load_persisted(&self, key: &str) -> Option<VirtualMachineInstance> {
        let path = self.dir.join(file_name(key)?);
        let text = std::fs::read_to_string(path).ok()?;
        proto::kubevirt::parse_vmi(&text).ok()
    }

    fn persist(&self, key: &str, vmi: &VirtualMachineInstance) {
        let Some(name) = file_name(key) else {
            return;
        };
        if let Err(e) = std::fs::create_dir_all(&self.dir).and_then(|_| {
            let tmp = self.dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, serde_json::to_vec_pretty(vmi).unwrap_or_default())?;
            std::fs::rename(&tmp, self.dir.join(&name))
        }) {
            tracing::warn!(%key, error = %e, "cannot persist VMI");
        }
    }

    fn show_status(&self, key: &str, entry: &Entry) {
        let status = entry.vmi.status.clone().unwrap_or_default();
        let yaml = serde_yaml::to_string(&status).unwrap_or_default();
        match (self.output, status_file(&self.state_dir, key)) {
            (StatusOutput::StateDir, Some(path)) => {
                let tmp = path.with_extension("yaml.tmp");
                if let Err(e) = std::fs::create_dir_all(self.state_dir.join(STATUS_DIR))
                    .and_then(|_| std::fs::write(&tmp, yaml))
                    .and_then(|_| std::fs::rename(&tmp, &path))
                {
                    tracing::warn!(%key, error = %e, "cannot write the status file");
                }
            }
            _ => say(&format!("--- # status of {key}\n{yaml}")),
        }
    }

    /// Adds a VMI (as created by the API server: already defaulted).
    pub fn admit(&self, vmi: VirtualMachineInstance) -> String {
        let key = key_of(&vmi);
        self.persist(&key, &vmi);
        let entry = Entry {
            vmi,
            status_writes: 0,
            admitted: std::time::Instant::now(),
        };
        self.show_status(&key, &entry);
        self.lock().insert(key.clone(), entry);
        let _ = self.changes.send(key.clone());
        key
    }

    /// Marks a VMI deleted (`deletionTimestamp`), as `kubectl delete` would.
    pub fn mark_deleted(&self, key: &str) {
        let mut entries = self.lock();
        if let Some(e) = entries.get_mut(key)
            && e.vmi.metadata.deletion_timestamp.is_none()
        {
            e.vmi.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
            bump(&mut e.vmi);
            let vmi = e.vmi.clone();
            drop(entries);
            self.persist(key, &vmi);
            let _ = self.changes.send(key.to_string());
        }
    }

    /// The controller's `Ready` condition, derived from the launcher pod as virt-controller
    /// does (`proto::kubevirt::ready`): false until the guest runs, then the pod's
    /// readiness (its cmd socket answering). Written like another writer's change: the
    /// handler's next write computed from an older version gets a conflict and reads again.
    pub fn sync_ready(&self, key: &str, pod: LauncherPod) {
        let mut entries = self.lock();
        let Some(e) = entries.get_mut(key) else {
            return;
        };
        let (status_text, reason, message) = ready_condition(e.vmi.phase(), pod);
        let status = e.vmi.status.get_or_insert_with(Default::default);
        let reason = (!reason.is_empty()).then_some(reason);
        let message = (!message.is_empty()).then_some(message);
        if status.conditions.iter().any(|c| {
            c.condition_type == "Ready"
                && c.status == status_text
                && c.reason == reason
                && c.message == message
        }) {
            return;
        }
        status.conditions.retain(|c| c.condition_type != "Ready");
        status.conditions.push(proto::kubevirt::Condition {
            condition_type: "Ready".into(),
            status: status_text,
            last_probe_time: None,
            last_transition_time: Some(Time(Timestamp::now())),
            reason,
            message,
            extra: Default::default(),
        });
        bump(&mut e.vmi);
        self.show_status(key, e);
        let vmi = e.vmi.clone();
        drop(entries);
        self.persist(key, &vmi);
        let _ = self.changes.send(key.to_string());
    }

    /// Removes the VMI for good (finalizers done) and its persisted copy.
    pub fn remove(&self, key: &str) {
        self.lock().remove(key);
        if let Some(name) = file_name(key) {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
        let _ = self.changes.send(key.to_string());
    }

    /// How many status writes a VMI got (KubeVirt's CI allows 2 PATCH per VMI start).
    pub fn status_writes(&self, key: &str) -> u32 {
        self.lock().get(key).map(|e| e.status_writes).unwrap_or(0)
    }
}

fn bump(vmi: &mut VirtualMachineInstance) {
    let next = vmi
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        + 1;
    vmi.metadata.resource_version = Some(next.to_string());
}

/// Copies the handler's fields of `from` onto `to`, as a merge patch of them would.
fn apply_owned(to: &mut VirtualMachineInstanceStatus, from: &VirtualMachineInstanceStatus) {
    let mut target = serde_json::to_value(&*to).unwrap_or_default();
    let source = serde_json::to_value(from).unwrap_or_default();
    if let Some(obj) = target.as_object_mut() {
        for field in HANDLER_OWNED_FIELDS {
            match source.get(*field) {
                Some(v) => {
                    obj.insert(field.to_string(), v.clone());
                }
                None => {
                    obj.remove(*field);
                }
            }
        }
    }
    if let Ok(merged) = serde_json::from_value(target) {
        *to = merged;
    }
}

impl VmiStore for StandaloneStore {
    fn get(&self, key: &str) -> Option<VirtualMachineInstance> {
        self.lock().get(key).map(|e| e.vmi.clone())
    }

    fn keys(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }
}

impl StatusWriter for StandaloneStore {
    fn write_status<'a>(
        &'a self,
        vmi: &'a VirtualMachineInstance,
        status: &'a VirtualMachineInstanceStatus,
    ) -> BoxFuture<'a, Result<(), StatusWriteError>> {
        Box::pin(async move {
            let key = key_of(vmi);
            let mut entries = self.lock();
            let entry = entries.get_mut(&key).ok_or(StatusWriteError::Gone)?;
            if entry.vmi.metadata.resource_version != vmi.metadata.resource_version {
                return Err(StatusWriteError::Conflict);
            }
            let old_phase = entry.vmi.phase();
            let mut new_status = entry.vmi.status.clone().unwrap_or_default();
            apply_owned(&mut new_status, status);
            entry.vmi.status = Some(new_status);
            entry.status_writes += 1;
            bump(&mut entry.vmi);
            let new_phase = entry.vmi.phase();
            if old_phase != new_phase {
                say(&format!(
                    "[{key}] phase {old_phase} -> {new_phase} ({:.3} s after scheduling, {} status writes)",
                    entry.admitted.elapsed().as_secs_f64(),
                    entry.status_writes
                ));
            }
            let snapshot = entry.vmi.clone();
            self.show_status(&key, entry);
            drop(entries);
            self.persist(&key, &snapshot);
            let _ = self.changes.send(key);
            Ok(())
        })
    }

    fn patch_vmi<'a>(
        &'a self,
        vmi: &'a VirtualMachineInstance,
        patch: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), StatusWriteError>> {
        Box::pin(async move {
            let key = key_of(vmi);
            let mut entries = self.lock();
            let entry = entries.get_mut(&key).ok_or(StatusWriteError::Gone)?;
            if entry.vmi.metadata.resource_version != vmi.metadata.resource_version {
                return Err(StatusWriteError::Conflict);
            }
            let mut object = serde_json::to_value(&entry.vmi)
                .map_err(|e| StatusWriteError::Other(e.to_string()))?;
            json_patch::merge(&mut object, patch);
            entry.vmi = serde_json::from_value(object)
                .map_err(|e| StatusWriteError::Other(format!("the patched VMI: {e}")))?;
            entry.status_writes += 1;
            bump(&mut entry.vmi);
            let snapshot = entry.vmi.clone();
            self.show_status(&key, entry);
            drop(entries);
            self.persist(&key, &snapshot);
            let _ = self.changes.send(key);
            Ok(())
        })
    }

    fn record_event(
        &self,
        vmi: &VirtualMachineInstance,
        kind: EventKind,
        reason: &str,
        message: &str,
    ) {
        say(&format!(
            "[{}] event {} {reason}: {message}",
            key_of(vmi),
            kind.as_str()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::kubevirt::Phase;

    #[tokio::test]
    async fn the_status_file_is_in_the_state_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let (store, _rx) =
            StandaloneStore::new(&state.join("vmis"), &state, StatusOutput::StateDir);
        let vmi = proto::kubevirt::parse_vmi(
            r#"{"metadata":{"name":"v","namespace":"d","uid":"u","resourceVersion":"1"},
                "spec":{"domain":{"devices":{}}},"status":{"phase":"Scheduled"}}"#,
        )
        .expect("vmi");
        store.admit(vmi);
        let file = state.join("status/d_v.status.yaml");
        assert_eq!(status_file(&state, "d/v"), Some(file.clone()));
        let text = std::fs::read_to_string(&file).expect("status file");
        assert!(text.contains("phase: Scheduled"), "{text}");
        // Nothing else beside it (no temporary file left).
        let names: Vec<_> = std::fs::read_dir(state.join(STATUS_DIR))
            .expect("status dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["d_v.status.yaml"]);
        assert_eq!(status_file(&state, "../x"), None);
    }

    #[tokio::test]
    async fn writes_check_resource_version_and_keep_other_fields() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, mut rx) = StandaloneStore::new(dir.path(), dir.path(), StatusOutput::Stdout);
        let mut vmi = proto::kubevirt::parse_vmi(
            r#"{"metadata":{"name":"v","namespace":"d","uid":"u","resourceVersion":"1"},
                "spec":{"domain":{"devices":{}}},"status":{"phase":"Scheduled","nodeName":"n"}}"#,
        )
        .expect("vmi");
        let key = store.admit(vmi.clone());
        assert_eq!(rx.try_recv().as_deref(), Ok("d/v"));
        let mut status = vmi.status.clone().expect("status");
        status.phase = Some(Phase::Running);
        status.node_name = Some("ignored".into());
        store.write_status(&vmi, &status).await.expect("write");
        let stored = store.get(&key).expect("stored");
        assert_eq!(stored.phase(), Phase::Running);
        assert_eq!(
            stored.status.as_ref().and_then(|s| s.node_name.as_deref()),
            Some("n")
        );
        assert_eq!(stored.metadata.resource_version.as_deref(), Some("2"));
        // A write computed from the old version conflicts.
        assert!(matches!(
            store.write_status(&vmi, &status).await,
            Err(StatusWriteError::Conflict)
        ));
        assert_eq!(store.status_writes(&key), 1);
        // Persisted and reloadable.
        assert_eq!(
            store.load_persisted(&key).map(|v| v.phase()),
            Some(Phase::Running)
        );
        store.mark_deleted(&key);
        assert!(
            store
                .get(&key)
                .and_then(|v| v.metadata.deletion_timestamp)
                .is_some()
        );
        vmi.metadata.name = Some("gone".into());
        assert!(matches!(
            store.write_status(&vmi, &status).await,
            Err(StatusWriteError::Gone)
        ));
        store.remove(&key);
        assert!(store.load_persisted(&key).is_none());
    }

    #[test]
    fn file_names_cannot_escape() {
        assert_eq!(file_name("ns/name").as_deref(), Some("ns_name.json"));
        assert_eq!(file_name("../x"), None);
        assert_eq!(file_name("a/b c"), None);
    }
}

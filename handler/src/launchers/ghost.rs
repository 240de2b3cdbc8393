//! Ghost records: what the handler remembers about each launcher it has talked to, on
//! disk, so a restarted handler finds its launchers again (proto/CONTRACT.md §3.1; KubeVirt's
//! `/var/run/kubevirt-private/ghost-records/<vmiUID>`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One record, with KubeVirt's JSON keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GhostRecord {
    pub name: String,
    pub namespace: String,
    #[serde(rename = "socketFile")]
    pub socket_file: PathBuf,
    pub uid: String,
}

impl GhostRecord {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The directory of records.
#[derive(Debug, Clone)]
pub struct GhostRecords {
    dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum GhostError {
    #[error("ghost record directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("ghost record {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("invalid VMI UID {0:?} for a ghost record")]
    InvalidUid(String),
}

/// A UID becomes a file name: refuse anything that could leave the directory.
fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 128
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl GhostRecords {
    pub fn new(dir: &Path) -> Self {
        GhostRecords {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, uid: &str) -> Result<PathBuf, GhostError> {
        if !valid_uid(uid) {
            return Err(GhostError::InvalidUid(uid.to_string()));
        }
        Ok(self.dir.join(uid))
    }

    /// Writes (or replaces) the record of `record.uid`, atomically.
    pub fn add(&self, record: &GhostRecord) -> Result<(), GhostError> {
        let path = self.path(&record.uid)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| GhostError::Dir(self.dir.clone(), e))?;
        let tmp = path.with_extension("tmp");
        let json = serde_json::to_vec(record).expect("record serializes");
        std::fs::write(&tmp, json).map_err(|e| GhostError::Io(tmp.clone(), e))?;
        std::fs::rename(&tmp, &path).map_err(|e| GhostError::Io(path.clone(), e))
    }

    pub fn remove(&self, uid: &str) -> Result<(), GhostError> {
        let path = self.path(uid)?;
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(GhostError::Io(path, e)),
            _ => Ok(()),
        }
    }

    /// Every readable record; unreadable or corrupt files are skipped with a warning
    /// (one bad file must not hide the other launchers).
    pub fn list(&self) -> Vec<GhostRecord> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "tmp") {
                continue;
            }
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<GhostRecord>(&b).map_err(|e| e.to_string()))
            {
                Ok(r) if valid_uid(&r.uid) => records.push(r),
                Ok(r) => {
                    tracing::warn!(path = %path.display(), uid = %r.uid, "ghost record with invalid UID skipped")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "unreadable ghost record skipped")
                }
            }
        }
        records.sort_by(|a, b| a.uid.cmp(&b.uid));
        records
    }

    /// Whether `record` is still the record of its UID (not replaced since it was read:
    /// the VMI's launcher may have changed, a migration bringing it back to this node).
    pub fn is_current(&self, record: &GhostRecord) -> bool {
        let Ok(path) = self.path(&record.uid) else {
            return false;
        };
        std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<GhostRecord>(&b).ok())
            .is_some_and(|current| current.socket_file == record.socket_file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_files_are_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ghosts = GhostRecords::new(&dir.path().join("ghost-records"));
        assert!(ghosts.list().is_empty());
        let r = GhostRecord {
            name: "vmi".into(),
            namespace: "default".into(),
            socket_file: "/pods/p/sock".into(),
            uid: "1234-abcd".into(),
        };
        ghosts.add(&r).expect("add");
        std::fs::write(dir.path().join("ghost-records/garbage"), b"{not json").expect("write");
        assert_eq!(ghosts.list(), vec![r.clone()]);
        let text =
            std::fs::read_to_string(dir.path().join("ghost-records/1234-abcd")).expect("read");
        assert!(text.contains("\"socketFile\""), "{text}");
        // A record read before its VMI's launcher changed is no longer current.
        assert!(ghosts.is_current(&r));
        let moved = GhostRecord {
            socket_file: "/pods/q/sock".into(),
            ..r.clone()
        };
        ghosts.add(&moved).expect("replace");
        assert!(!ghosts.is_current(&r));
        assert!(ghosts.is_current(&moved));
        ghosts.remove("1234-abcd").expect("remove");
        ghosts.remove("1234-abcd").expect("removing twice is fine");
        assert!(ghosts.list().is_empty());
    }

    #[test]
    fn uids_cannot_escape_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ghosts = GhostRecords::new(dir.path());
        for bad in ["", "../x", "a/b", "."] {
            assert!(matches!(ghosts.remove(bad), Err(GhostError::InvalidUid(_))));
        }
    }
}

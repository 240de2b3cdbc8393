//! The domain cache: the handler's picture of every launcher's domain, keyed
//! `<namespace>/<name>` like KubeVirt's domain informer (proto/CONTRACT.md §3.2).
//!
//! It is fed by the notify server (events pushed by launchers), by the initial list and
//! by the periodic resync (both ask each launcher `GetDomain`). Every change sends the
//! key to the agent's work queue.

use std::collections::HashMap;
use std::sync::Mutex;

use proto::domain::Domain;
use tokio::sync::mpsc;

/// A watch event type (`watch.EventType` strings on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    Error,
}

impl EventType {
    /// `None` for unknown types, which the handler silently ignores.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "ADDED" => Some(EventType::Added),
            "MODIFIED" => Some(EventType::Modified),
            "DELETED" => Some(EventType::Deleted),
            "ERROR" => Some(EventType::Error),
            _ => None,
        }
    }
}

/// A change the cache tells its listener about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheChange {
    /// The domain of this key changed: reconcile the VMI.
    Key(String),
    /// A launcher reported a watch error: list every launcher again.
    Relist,
}

pub struct DomainCache {
    domains: Mutex<HashMap<String, Domain>>,
    changes: mpsc::UnboundedSender<CacheChange>,
}

impl DomainCache {
    pub fn new() -> (Self, mpsc::UnboundedReceiver<CacheChange>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            DomainCache {
                domains: Mutex::new(HashMap::new()),
                changes: tx,
            },
            rx,
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Domain>> {
        // A poisoned lock only means another thread panicked mid-update of a plain map
        // whose entries are replaced whole: the data is still consistent.
        self.domains.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify(&self, change: CacheChange) {
        // The receiver lives as long as the agent; a send after shutdown is harmless.
        let _ = self.changes.send(change);
    }

    /// Applies one event. ADDED/MODIFIED store the domain as is (a deletion-marked domain
    /// is kept: its UID matters for stale clean-up); DELETED removes it.
    pub fn apply(&self, event: EventType, domain: Domain) {
        let key = domain.key();
        match event {
            EventType::Added | EventType::Modified => {
                // A repeated identical report changes nothing: no reconcile (otherwise a
                // launcher answering each Shutdown with an event would loop with us).
                if self.lock().insert(key.clone(), domain.clone()).as_ref() == Some(&domain) {
                    return;
                }
            }
            EventType::Deleted => {
                self.lock().remove(&key);
            }
            EventType::Error => {
                self.request_relist();
                return;
            }
        }
        self.notify(CacheChange::Key(key));
    }

    /// A launcher reported a watch error: every launcher is listed again.
    pub fn request_relist(&self) {
        self.notify(CacheChange::Relist);
    }

    /// Stores what a launcher's `GetDomain` said (list / resync).
    pub fn set(&self, key: &str, domain: Domain) {
        let changed = self.lock().get(key) != Some(&domain);
        if changed {
            self.lock().insert(key.to_string(), domain);
            self.notify(CacheChange::Key(key.to_string()));
        }
    }

    pub fn get(&self, key: &str) -> Option<Domain> {
        self.lock().get(key).cloned()
    }

    /// Drops a domain after clean-up, without a new reconcile.
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Drops a domain only if it still belongs to `uid` (a new launcher for the same
    /// name may already have reported).
    pub fn forget_uid(&self, key: &str, uid: &str) {
        let mut map = self.lock();
        if map
            .get(key)
            .is_some_and(|d| d.spec.metadata.kubevirt.uid == uid)
        {
            map.remove(key);
        }
    }

    pub fn keys(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::domain::LifeCycle;

    #[test]
    fn events_update_the_cache_and_announce_the_key() {
        let (cache, mut rx) = DomainCache::new();
        let mut d = Domain::new("ns", "vmi", "uid1");
        d.status.status = LifeCycle::Running;
        cache.apply(EventType::Added, d.clone());
        assert_eq!(rx.try_recv(), Ok(CacheChange::Key("ns/vmi".into())));
        assert_eq!(cache.get("ns/vmi"), Some(d.clone()));
        // Resync or a repeated event with the same domain: no new reconcile.
        cache.set("ns/vmi", d.clone());
        cache.apply(EventType::Modified, d.clone());
        assert!(rx.try_recv().is_err());
        cache.apply(EventType::Error, d.clone());
        assert_eq!(rx.try_recv(), Ok(CacheChange::Relist));
        cache.forget_uid("ns/vmi", "other");
        assert!(cache.get("ns/vmi").is_some());
        cache.apply(EventType::Deleted, d);
        assert_eq!(rx.try_recv(), Ok(CacheChange::Key("ns/vmi".into())));
        assert!(cache.is_empty());
    }

    #[test]
    fn unknown_event_types_are_not_parsed() {
        assert_eq!(EventType::parse("MODIFIED"), Some(EventType::Modified));
        assert_eq!(EventType::parse("BOOKMARK"), None);
        assert_eq!(EventType::parse("modified"), None);
    }
}

//! The domain cache: the handler's picture of every launcher's domain, keyed
//! `<namespace>/<name>` like KubeVirt's domain informer (proto/CONTRACT.md §3.2).
//!
//! It is fed by the notify server (events pushed by launchers), by the initial list and
//! by the periodic resync (both ask each launcher `GetDomain`). Every change sends the
//! key to the agent's work queue, through [`CacheChanges`]: a key already waiting there is
//! not queued twice, and relists asked for while one waits become that one, so however many
//! events launchers send, what waits is at most one entry per domain and one relist.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use proto::domain::Domain;
use tokio::sync::mpsc::error::TryRecvError;

/// The most domains the cache holds from launcher events. The device plugins advertise 1000
/// devices each, so a node runs at most 1000 VMIs; twice that leaves room for the stale
/// domains of replaced pods. Notify events for a new key beyond it are refused.
pub(crate) const MAX_DOMAINS: usize = 2000;

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
    changes: Arc<Pending>,
}

/// The changes not yet taken by the agent.
#[derive(Default)]
struct Pending {
    state: Mutex<PendingState>,
    ready: tokio::sync::Notify,
}

#[derive(Default)]
struct PendingState {
    keys: VecDeque<String>,
    queued: HashSet<String>,
    relist: bool,
    /// The cache is gone: nothing more will come.
    closed: bool,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, PendingState> {
        // Each update below is complete before the guard drops.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The receiving end of the cache's changes (the agent's), de-duplicated: see the module.
pub struct CacheChanges {
    pending: Arc<Pending>,
}

impl CacheChanges {
    /// The next change; `None` once the cache is dropped and every change was taken.
    pub async fn recv(&mut self) -> Option<CacheChange> {
        let pending = Arc::clone(&self.pending);
        loop {
            let notified = pending.ready.notified();
            match self.try_recv() {
                Ok(change) => return Some(change),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => notified.await,
            }
        }
    }

    /// The next change if one waits.
    pub fn try_recv(&mut self) -> Result<CacheChange, TryRecvError> {
        let mut state = self.pending.lock();
        if std::mem::take(&mut state.relist) {
            return Ok(CacheChange::Relist);
        }
        if let Some(key) = state.keys.pop_front() {
            state.queued.remove(&key);
            return Ok(CacheChange::Key(key));
        }
        Err(if state.closed {
            TryRecvError::Disconnected
        } else {
            TryRecvError::Empty
        })
    }

    /// How many changes wait (relist included).
    pub fn len(&self) -> usize {
        let state = self.pending.lock();
        state.keys.len() + usize::from(state.relist)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for DomainCache {
    fn drop(&mut self) {
        self.changes.lock().closed = true;
        self.changes.ready.notify_one();
    }
}

impl DomainCache {
    pub fn new() -> (Self, CacheChanges) {
        let pending = Arc::new(Pending::default());
        (
            DomainCache {
                domains: Mutex::new(HashMap::new()),
                changes: Arc::clone(&pending),
            },
            CacheChanges { pending },
        )
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Domain>> {
        // A poisoned lock only means another thread panicked mid-update of a plain map
        // whose entries are replaced whole: the data is still consistent.
        self.domains.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn notify(&self, change: CacheChange) {
        {
            let mut state = self.changes.lock();
            match change {
                CacheChange::Relist if state.relist => return,
                CacheChange::Relist => state.relist = true,
                CacheChange::Key(key) => {
                    if !state.queued.insert(key.clone()) {
                        return;
                    }
                    state.keys.push_back(key);
                }
            }
        }
        self.changes.ready.notify_one();
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
    pub(crate) fn request_relist(&self) {
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
    pub(crate) fn forget_uid(&self, key: &str, uid: &str) {
        let mut map = self.lock();
        if map
            .get(key)
            .is_some_and(|d| d.spec.metadata.kubevirt.uid == uid)
        {
            map.remove(key);
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        self.lock().contains_key(key)
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

    /// However many events arrive before the agent takes them, one entry per key and one
    /// relist wait.
    #[tokio::test]
    async fn waiting_changes_stay_one_per_key() {
        let (cache, mut rx) = DomainCache::new();
        for i in 0..10_000u32 {
            let mut d = Domain::new("ns", "vmi", "uid1");
            d.status.status = if i % 2 == 0 {
                LifeCycle::Running
            } else {
                LifeCycle::Paused
            };
            cache.apply(EventType::Modified, d);
            cache.request_relist();
        }
        cache.apply(EventType::Added, Domain::new("ns", "other", "uid2"));
        assert_eq!(rx.len(), 3);
        assert_eq!(rx.recv().await, Some(CacheChange::Relist));
        assert_eq!(rx.recv().await, Some(CacheChange::Key("ns/vmi".into())));
        assert_eq!(rx.recv().await, Some(CacheChange::Key("ns/other".into())));
        assert!(rx.is_empty());
        // Taken keys are queued again on the next change.
        cache.apply(EventType::Deleted, Domain::new("ns", "vmi", "uid1"));
        assert_eq!(rx.try_recv(), Ok(CacheChange::Key("ns/vmi".into())));
        // A waiting receiver wakes on a change, and ends with the cache.
        let waiter = tokio::spawn(async move {
            let first = rx.recv().await;
            (first, rx.recv().await)
        });
        tokio::task::yield_now().await;
        cache.request_relist();
        drop(cache);
        let (first, last) = waiter.await.expect("join");
        assert_eq!(first, Some(CacheChange::Relist));
        assert_eq!(last, None);
    }

    #[test]
    fn unknown_event_types_are_not_parsed() {
        assert_eq!(EventType::parse("MODIFIED"), Some(EventType::Modified));
        assert_eq!(EventType::parse("BOOKMARK"), None);
        assert_eq!(EventType::parse("modified"), None);
    }
}

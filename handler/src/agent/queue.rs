//! The work queue: keys (`<namespace>/<name>`) waiting for a reconcile.
//!
//! Semantics of client-go's rate-limited queue, which KubeVirt's handler uses: a key is
//! queued at most once however often it is added; a key being processed is not handed
//! to a second worker, and if it was added meanwhile it is queued again when the first
//! worker is done; failures re-add the key after a back-off that doubles per failure
//! (5 ms up to 1000 s, like `DefaultControllerRateLimiter`) until [`WorkQueue::forget`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::backoff::{CONTROLLER_BASE as BASE_DELAY, CONTROLLER_MAX as MAX_DELAY, doubling};

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    dirty: HashSet<String>,
    processing: HashSet<String>,
    failures: HashMap<String, u32>,
    shut_down: bool,
}

/// A de-duplicating queue with delayed and rate-limited adds.
#[derive(Default)]
pub struct WorkQueue {
    state: Mutex<State>,
    ready: Notify,
}

impl WorkQueue {
    pub fn new() -> Arc<Self> {
        Arc::new(WorkQueue::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update below is complete before the guard drops; poisoning cannot leave
        // a half-done change.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` unless it is queued already.
    pub fn add(&self, key: &str) {
        let mut s = self.lock();
        if s.shut_down || s.dirty.contains(key) {
            return;
        }
        s.dirty.insert(key.to_string());
        if !s.processing.contains(key) {
            s.queue.push_back(key.to_string());
            drop(s);
            self.ready.notify_one();
        }
    }

    /// Queues `key` after `delay`.
    pub(crate) fn add_after(self: &Arc<Self>, key: &str, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let me = Arc::clone(self);
        let key = key.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            me.add(&key);
        });
    }

    /// The back-off for the next failure of `key` (and counts the failure).
    pub(crate) fn next_backoff(&self, key: &str) -> Duration {
        let mut s = self.lock();
        let n = s.failures.entry(key.to_string()).or_insert(0);
        let delay = doubling(BASE_DELAY, *n, MAX_DELAY);
        *n = n.saturating_add(1);
        delay
    }

    /// Queues `key` again after its growing back-off.
    pub(crate) fn add_rate_limited(self: &Arc<Self>, key: &str) {
        let delay = self.next_backoff(key);
        self.add_after(key, delay);
    }

    /// Resets the back-off of `key` after a success.
    pub fn forget(&self, key: &str) {
        self.lock().failures.remove(key);
    }

    pub fn failures(&self, key: &str) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Waits for the next key; `None` once the queue is shut down (keys still queued are
    /// dropped).
    pub async fn get(&self) -> Option<String> {
        loop {
            // Register interest before looking, so an add between the look and the
            // wait is not lost.
            let notified = self.ready.notified();
            {
                let mut s = self.lock();
                // Shut down: queued keys are left to the next handler, which lists every
                // launcher and VMI again. Draining them could keep a stopping handler busy
                // for minutes under a burst (each key a launcher sync), and the DaemonSet
                // starts the next handler only once this one is gone.
                if s.shut_down {
                    return None;
                }
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks `key` processed; queues it again if it was added meanwhile.
    pub fn done(&self, key: &str) {
        let mut s = self.lock();
        s.processing.remove(key);
        if s.dirty.contains(key) {
            s.queue.push_back(key.to_string());
            drop(s);
            self.ready.notify_one();
        }
    }

    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops handing out keys once the queue drains; wakes every waiting worker.
    pub(crate) fn shut_down(&self) {
        self.lock().shut_down = true;
        self.ready.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn adds_are_deduplicated() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        assert_eq!(q.get().await.as_deref(), Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_in_processing_is_requeued_only_after_done() {
        let q = WorkQueue::new();
        q.add("a");
        let k = q.get().await.expect("key");
        q.add("a");
        q.add("a");
        assert!(q.is_empty(), "not handed out while processing");
        q.done(&k);
        assert_eq!(q.len(), 1);
        let k = q.get().await.expect("key");
        q.done(&k);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn backoff_grows_and_is_capped_and_forgotten() {
        let q = WorkQueue::new();
        let d: Vec<Duration> = (0..4).map(|_| q.next_backoff("a")).collect();
        assert_eq!(
            d,
            vec![
                Duration::from_millis(5),
                Duration::from_millis(10),
                Duration::from_millis(20),
                Duration::from_millis(40)
            ]
        );
        for _ in 0..60 {
            q.next_backoff("a");
        }
        assert_eq!(q.next_backoff("a"), MAX_DELAY);
        q.forget("a");
        assert_eq!(q.failures("a"), 0);
        assert_eq!(q.next_backoff("a"), BASE_DELAY);
    }

    #[tokio::test]
    async fn delayed_add_arrives_and_shutdown_releases_workers() {
        let q = WorkQueue::new();
        q.add_after("a", Duration::from_millis(20));
        assert!(q.is_empty());
        let got = tokio::time::timeout(Duration::from_secs(2), q.get())
            .await
            .expect("delayed key arrives");
        assert_eq!(got.as_deref(), Some("a"));
        let waiter = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.get().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.shut_down();
        let r = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .expect("worker released")
            .expect("task");
        assert_eq!(r, None);

        // Keys still queued when the queue shuts down are not handed out.
        let q = WorkQueue::new();
        q.add("b");
        q.add("c");
        q.shut_down();
        assert_eq!(q.get().await, None);
    }
}

//! The I/O threads of a virtio-blk device: they run the requests of one
//! batch concurrently, and the notifying thread waits until all are done.
//!
//! Started as batches need them, up to the configured number (a guest that
//! sends one request at a time never gets any), and stopped at reset. Each
//! thread has its own bounce buffer, handed to it at start and back at stop.
//! A thread enters its sandbox (`ThreadRole::BlockIo`) before it takes a
//! request; one that cannot is not counted. A request that cannot be handed
//! to a thread (none could be started) runs on the notifying thread.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use crate::GuestMemoryMmap;

use super::request::Request;
use crate::device_thread::{ThreadRole, ThreadSandbox, Unsandboxed};
use ::block::{IoBuffer, Pages};

use super::{Executor, bounce_buffers};

/// A request to run; it gets the running thread's bounce buffer.
type Job = Box<dyn FnOnce(&mut [u8]) + Send>;

struct Pool {
    jobs: mpsc::Sender<Job>,
    /// Shared by the threads; kept to start more of them.
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    /// Each thread gives its bounce buffer back when it ends.
    threads: Vec<JoinHandle<IoBuffer>>,
}

pub(super) struct IoWorkers {
    threads: usize,
    pool: Option<Pool>,
    /// Bounce buffers for threads yet to start.
    spare: Vec<IoBuffer>,
    /// What a new thread enters first (set at activation).
    sandbox: Arc<dyn ThreadSandbox>,
}

impl IoWorkers {
    /// Up to `threads` threads; `buffers` are their bounce buffers.
    pub(super) fn new(threads: usize, buffers: Vec<IoBuffer>) -> IoWorkers {
        IoWorkers {
            threads,
            pool: None,
            spare: buffers,
            sandbox: Arc::new(Unsandboxed),
        }
    }

    /// The sandbox threads started from now on enter.
    pub(super) fn set_sandbox(&mut self, sandbox: Arc<dyn ThreadSandbox>) {
        self.sandbox = sandbox;
    }

    /// Runs `requests` (request, its place in the batch) and returns when
    /// all are done, with each used length in `used`. The batch is cut into
    /// one share per I/O thread plus one for this thread (which would
    /// otherwise only wait): one job per share, not per request, keeps the
    /// hand-over cost off small requests. `bounce` serves this thread's.
    pub(super) fn run(
        &mut self,
        mut requests: Vec<(usize, Request)>,
        executor: &Arc<Executor>,
        mem: &GuestMemoryMmap,
        used: &mut [u32],
        bounce: &mut [u8],
    ) {
        let shares = requests.len().min(self.threads + 1).max(1);
        self.grow(shares - 1);
        let per_share = requests.len().div_ceil(shares);
        let (done_tx, done_rx) = mpsc::channel();
        while requests.len() > per_share {
            let share = requests.split_off(requests.len() - per_share);
            let job: Job = Box::new({
                let executor = executor.clone();
                let mem = mem.clone();
                let done = done_tx.clone();
                move |bounce| {
                    for (i, req) in share {
                        let used_len = executor.run(&req, &mem, bounce);
                        // The batch waits for every sender to go: no error.
                        let _ = done.send((i, used_len));
                    }
                }
            });
            let refused = match &self.pool {
                Some(pool) => pool.jobs.send(job).err().map(|e| e.0),
                None => Some(job),
            };
            if let Some(job) = refused {
                job(bounce);
            }
        }
        // This thread's share: the first requests of the batch.
        for (i, req) in requests {
            used[i] = executor.run(&req, mem, bounce);
        }
        drop(done_tx);
        // Ends when every job has reported or been dropped (a request that
        // panicked keeps used length 0: no status, the guest sees an error).
        for (i, used_len) in done_rx {
            used[i] = used_len;
        }
    }

    /// Starts threads until there are `wanted` (at most the configured
    /// number).
    fn grow(&mut self, wanted: usize) {
        let wanted = wanted.min(self.threads);
        let pool = match &mut self.pool {
            Some(pool) => pool,
            None if wanted > 0 => {
                let (jobs, queue) = mpsc::channel::<Job>();
                self.pool.insert(Pool {
                    jobs,
                    queue: Arc::new(Mutex::new(queue)),
                    threads: Vec::new(),
                })
            }
            None => return,
        };
        while pool.threads.len() < wanted {
            let n = pool.threads.len();
            let queue = pool.queue.clone();
            // Only a thread that failed to start, or panicked outside a
            // request, loses its buffer; a successor gets a fresh one.
            let bounce = self
                .spare
                .pop()
                .unwrap_or_else(|| bounce_buffers(1, Pages::Small).remove(0));
            let sandbox = self.sandbox.clone();
            let (entered_tx, entered_rx) = mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name(format!("virtio-blk-io{n}"))
                .spawn(move || {
                    let entered = sandbox.enter(ThreadRole::BlockIo);
                    let ok = entered.is_ok();
                    let _ = entered_tx.send(entered);
                    if ok { worker(&queue, bounce) } else { bounce }
                });
            let started = spawned.and_then(|h| {
                match entered_rx
                    .recv()
                    .unwrap_or_else(|_| Err(std::io::Error::other("ended at start")))
                {
                    Ok(()) => Ok(h),
                    Err(e) => {
                        if let Ok(bounce) = h.join() {
                            self.spare.push(bounce);
                        }
                        Err(e)
                    }
                }
            });
            match started {
                Ok(h) => pool.threads.push(h),
                Err(e) => {
                    // Fewer threads (or none: requests then run on the
                    // notifying thread, see `run`).
                    tracing::warn!("virtio-blk: cannot start I/O thread {n}: {e}");
                    break;
                }
            }
        }
        if pool.threads.is_empty() {
            self.pool = None;
        }
    }

    /// Stops the threads (none is busy: batches finish before they return).
    pub(super) fn stop(&mut self) {
        if let Some(pool) = self.pool.take() {
            drop(pool.jobs);
            for t in pool.threads {
                match t.join() {
                    Ok(bounce) => self.spare.push(bounce),
                    Err(_) => tracing::error!("virtio-blk: an I/O thread panicked"),
                }
            }
        }
    }
}

impl Drop for IoWorkers {
    fn drop(&mut self) {
        self.stop();
    }
}

fn worker(rx: &Mutex<mpsc::Receiver<Job>>, mut bounce: IoBuffer) -> IoBuffer {
    loop {
        // The lock is held only while waiting for the next job.
        let job = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(job) => job,
            Err(mpsc::RecvError) => return bounce, // the device stopped the pool
        };
        // A panic is a bug in a request's path; the thread stays for the
        // next ones.
        if std::panic::catch_unwind(AssertUnwindSafe(|| job(bounce.as_mut_slice()))).is_err() {
            tracing::error!("virtio-blk: a request panicked");
        }
    }
}

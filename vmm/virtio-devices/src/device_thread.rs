//! A device's own thread: device work off the vCPU threads.
//!
//! The VMM registers one eventfd per queue as an ioeventfd on the queue's
//! notify address (datamatch on the queue index): a guest notification then
//! completes inside KVM without an exit, and the eventfd wakes this thread,
//! which runs the device's [`VirtioDevice::process_queue`]. The thread also
//! waits on the device's own host descriptor ([`VirtioDevice::watched_fd`],
//! the tap of a net device). Interrupts go out through the device's irqfd as
//! before. Firecracker and Cloud Hypervisor run devices the same way.
//!
//! The thread is transport-agnostic: it gets the device (shared with the
//! transport behind one mutex), the queue eventfds and the interrupt. A
//! transport keeps register handling (status, features, queue set-up,
//! config space) on the vCPU thread and:
//!
//! - forwards a notification that did reach it as an exit (no ioeventfd
//!   registered, or one the datamatch did not catch) with [`DeviceThread::notify`];
//! - resets the device under the device mutex: the thread handles a
//!   notification while holding it, and a batch (virtio-blk's included,
//!   with its I/O threads) completes before the mutex is released, so a
//!   reset never finds a request in flight (Cloud Hypervisor's
//!   CVE-2026-45782 was a use-after-free of an in-flight request);
//! - pauses and resumes through [`DeviceThread::pause`]: after `pause`
//!   returns, nothing touches guest memory until `resume`; notifications
//!   meanwhile are remembered and handled at `resume`;
//! - stops the device at the VM's end by dropping the thread: it finishes
//!   the work in progress, closes the device ([`VirtioDevice::close`]: a
//!   disk flushed and closed) and ends, and the drop returns after that.
//!
//! Each thread is started from the VMM's start-up thread (never from a
//! vCPU thread, whose sandbox it would inherit) and enters its own sandbox
//! ([`ThreadSandbox`]) before it touches guest memory.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::device::{DeviceError, VirtioDevice};
use crate::interrupt::DeviceInterrupt;
use crate::log_limit::LogLimit;

/// The device, shared by its transport (registers, reset) and its thread.
pub(crate) type SharedDevice = Arc<Mutex<Box<dyn VirtioDevice>>>;

/// Locks the device; a device that panicked keeps serving (its state is
/// plain data and the guest must not be able to stop the VMM this way).
pub(crate) fn lock_device(device: &SharedDevice) -> MutexGuard<'_, Box<dyn VirtioDevice>> {
    device.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a thread started by device code is for; the VMM picks its sandbox
/// (system call filter) by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadRole {
    /// The thread of a device of this virtio type (`VIRTIO_ID_*`).
    Device(u32),
    /// A virtio-blk I/O thread, started by a device thread.
    BlockIo,
}

/// What the VMM does first on every thread the device code starts: drop
/// privileges and install the thread's system call filter. A thread whose
/// sandbox cannot be entered ends before it touches guest memory.
pub trait ThreadSandbox: Send + Sync {
    fn enter(&self, role: ThreadRole) -> io::Result<()>;
}

/// No sandbox (tests, fuzzing, benchmarks).
pub(crate) struct Unsandboxed;

impl ThreadSandbox for Unsandboxed {
    fn enter(&self, _: ThreadRole) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Default)]
struct Control {
    paused: bool,
    stop: bool,
    /// Notifications forwarded with `notify` (one bit per queue).
    forwarded: u64,
    sync_requested: u64,
    sync_done: u64,
    /// The thread has ended (it cannot answer a sync any more).
    gone: bool,
    /// The device failed: nothing is handled until it is activated again
    /// (the transport resets it and reports DEVICE_NEEDS_RESET).
    broken: bool,
}

struct Shared {
    device: SharedDevice,
    notifiers: Vec<EventFd>,
    /// Wakes the thread for a control change or a forwarded notification.
    wake: EventFd,
    control: Mutex<Control>,
    changed: Condvar,
    interrupt: DeviceInterrupt,
    tid: AtomicI32,
    /// A guest can break its queue, reset and repeat at will.
    failures: LogLimit,
}

impl Shared {
    fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wake(&self) {
        if let Err(e) = self.wake.write(1) {
            tracing::error!("virtio: cannot wake a device thread: {e}");
        }
    }
}

/// The running thread of one device. Dropping it stops the thread (after
/// the work in progress), which closes the device
/// ([`VirtioDevice::close`]: a disk flushed and closed), and joins it.
pub(crate) struct DeviceThread {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Most queues a device thread serves (one bit each in its masks).
pub(crate) const MAX_QUEUES: usize = 64;

impl DeviceThread {
    /// Starts the thread of `device` (named `name`), serving one eventfd
    /// per queue in `notifiers`. Returns once the thread is in its sandbox;
    /// an error if it could not start or enter it.
    pub(crate) fn spawn(
        name: &str,
        device: SharedDevice,
        notifiers: Vec<EventFd>,
        interrupt: DeviceInterrupt,
        sandbox: Arc<dyn ThreadSandbox>,
    ) -> io::Result<DeviceThread> {
        let role = ThreadRole::Device(lock_device(&device).device_type());
        if notifiers.len() > MAX_QUEUES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} queues, at most {MAX_QUEUES}", notifiers.len()),
            ));
        }
        let shared = Arc::new(Shared {
            device,
            notifiers,
            wake: EventFd::new(EFD_NONBLOCK)?,
            control: Mutex::new(Control::default()),
            changed: Condvar::new(),
            interrupt,
            tid: AtomicI32::new(0),
            failures: LogLimit::new(),
        });
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::Builder::new().name(name.into()).spawn({
            let shared = shared.clone();
            move || {
                shared.tid.store(current_tid(), Ordering::SeqCst);
                let entered = sandbox.enter(role);
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if ok {
                    run(&shared);
                }
                // The device is done (stopped, or its thread failed): it
                // closes on its own thread, whose filter has its disk's
                // calls, and before `DeviceThread`'s drop returns.
                lock_device(&shared.device).close();
                shared.control().gone = true;
                shared.changed.notify_all();
            }
        })?;
        let entered = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the device thread ended at start")));
        if let Err(e) = entered {
            let _ = thread.join();
            return Err(io::Error::new(
                e.kind(),
                format!("device thread {name}: cannot enter its sandbox: {e}"),
            ));
        }
        Ok(DeviceThread {
            shared,
            thread: Some(thread),
        })
    }

    /// Kernel thread id of the thread.
    #[cfg(test)]
    pub(crate) fn thread_id(&self) -> i32 {
        self.shared.tid.load(Ordering::SeqCst)
    }

    /// A notification for queue `index` that reached the transport as an
    /// exit: handled on the thread like the ones KVM delivers.
    pub(crate) fn notify(&self, index: u16) {
        if usize::from(index) < self.shared.notifiers.len() {
            self.shared.control().forwarded |= 1 << index;
            self.shared.wake();
        }
    }

    /// The transport activated the device (again): a device that failed
    /// may run once more.
    pub(crate) fn activated(&self) {
        self.shared.control().broken = false;
    }

    /// Stops the device touching guest memory: returns once the work in
    /// progress is done. Notifications until `resume` wait.
    pub(crate) fn pause(&self) {
        self.shared.control().paused = true;
        // The thread handles notifications holding the device lock and
        // checks `paused` under it: once we get the lock, it is idle.
        let mut device = lock_device(&self.shared.device);
        device.pause();
    }

    /// Lets the device run again; handles what was notified meanwhile.
    pub(crate) fn resume(&self) {
        lock_device(&self.shared.device).resume();
        self.shared.control().paused = false;
        self.shared.wake();
    }

    /// Waits until the thread has handled every notification made before
    /// the call (the ones it can handle: none while paused). For tests,
    /// which check a device's answer right after notifying it.
    pub(crate) fn sync(&self) {
        let mut control = self.shared.control();
        control.sync_requested += 1;
        let target = control.sync_requested;
        drop(control);
        self.shared.wake();
        let control = self.shared.control();
        drop(
            self.shared
                .changed
                .wait_while(control, |c| c.sync_done < target && !c.gone)
                .unwrap_or_else(|p| p.into_inner()),
        );
    }
}

impl Drop for DeviceThread {
    fn drop(&mut self) {
        self.shared.control().stop = true;
        self.shared.wake();
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("virtio: a device thread panicked");
        }
    }
}

/// The thread's loop: wait for notifications, the device's descriptor or a
/// control change; handle them under the device lock.
fn run(shared: &Shared) {
    let mut pending: u64 = 0;
    let mut fds = Vec::with_capacity(shared.notifiers.len() + 2);
    loop {
        let (idle, stop) = {
            let c = shared.control();
            (c.paused || c.broken, c.stop)
        };
        if stop {
            return;
        }
        // The device's own descriptor only while it may be served: a
        // paused or failed device must not spin on a readable tap.
        let watched = if idle {
            None
        } else {
            lock_device(&shared.device).watched_fd()
        };
        let fd_ready = match wait(shared, watched, &mut fds) {
            Ok(ready) => ready,
            Err(e) => {
                tracing::error!("virtio: device thread cannot wait for events, stopping: {e}");
                return;
            }
        };
        pending |= drain_notifiers(shared);
        let mut device = lock_device(&shared.device);
        let mut control = shared.control();
        if control.stop {
            return;
        }
        pending |= std::mem::take(&mut control.forwarded);
        let sync_target = control.sync_requested;
        if control.broken {
            pending = 0;
        }
        if control.paused || control.broken {
            if sync_target > control.sync_done {
                control.sync_done = sync_target;
                drop(control);
                shared.changed.notify_all();
            }
            continue;
        }
        drop(control);
        // A sync must also see notifications that arrived while this round
        // started: look once more, without waiting.
        if sync_target > 0 {
            pending |= drain_notifiers(shared);
        }
        handle(shared, &mut device, &mut pending, fd_ready);
        drop(device);
        let mut control = shared.control();
        // Wake a `sync` caller only if there is one (no system call per
        // notification otherwise).
        if sync_target > control.sync_done {
            control.sync_done = sync_target;
            drop(control);
            shared.changed.notify_all();
        }
    }
}

/// Runs the device for the pending queues and a ready descriptor.
fn handle(shared: &Shared, device: &mut Box<dyn VirtioDevice>, pending: &mut u64, fd_ready: bool) {
    let queues = std::mem::take(pending);
    for (index, _) in (0u16..).zip(&shared.notifiers) {
        if queues & (1 << index) != 0 {
            let result = device.process_queue(index);
            if !check(shared, device.as_ref(), result) {
                return;
            }
        }
    }
    if fd_ready {
        let result = device.process_fd();
        check(shared, device.as_ref(), result);
    }
}

/// Whether the device can go on. A notification for a device the driver
/// has not activated (or reset) is ignored, as the transport ignores one
/// before DRIVER_OK. Any other error stops the device: nothing more is
/// handled, and the transport resets it and reports DEVICE_NEEDS_RESET at
/// the driver's next register access (announced by a config interrupt).
fn check(shared: &Shared, device: &dyn VirtioDevice, result: Result<(), DeviceError>) -> bool {
    match result {
        Ok(()) => true,
        Err(DeviceError::NotActivated) => false,
        Err(e) => {
            if let Some(suppressed) = shared.failures.admit() {
                tracing::warn!(
                    suppressed,
                    "virtio: device {} failed: {e}",
                    device.device_type()
                );
            }
            shared.control().broken = true;
            shared.interrupt.signal_needs_reset();
            false
        }
    }
}

/// Consumes the queue eventfds that fired; returns them as a bit mask.
fn drain_notifiers(shared: &Shared) -> u64 {
    let mut fired = 0;
    for (i, n) in shared.notifiers.iter().enumerate() {
        // Non-blocking: WouldBlock when it did not fire.
        if n.read().is_ok() {
            fired |= 1 << i;
        }
    }
    fired
}

/// Blocks until the wake eventfd, a queue eventfd or `watched` is
/// readable. Returns whether `watched` is.
fn wait(shared: &Shared, watched: Option<RawFd>, fds: &mut Vec<libc::pollfd>) -> io::Result<bool> {
    let pollfd = |fd: RawFd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    fds.clear();
    fds.push(pollfd(shared.wake.as_raw_fd()));
    fds.extend(shared.notifiers.iter().map(|n| pollfd(n.as_raw_fd())));
    if let Some(fd) = watched {
        fds.push(pollfd(fd));
    }
    loop {
        // SAFETY: `fds` holds `fds.len()` valid pollfd entries.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if rc >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    if fds[0].revents & libc::POLLIN != 0 {
        // Drains the counter; WouldBlock only if a wake raced us to it.
        let _ = shared.wake.read();
    }
    let watched_ready = watched.is_some()
        && fds
            .last()
            .is_some_and(|p| p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0);
    Ok(watched_ready)
}

/// The calling thread's id, by the system call: glibc's `gettid` wrapper is
/// left an unresolved weak symbol (a null call) in a statically linked build
/// with LTO, so it is not used.
pub(crate) fn current_tid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    i32::try_from(tid).unwrap_or(0)
}

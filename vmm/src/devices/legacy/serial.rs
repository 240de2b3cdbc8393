//! The 8250 UART on COM1 (vm-superio's `Serial`) and where its output goes:
//! stdout, a file, an in-memory capture, or a unix socket console.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use vm_superio::Serial;
use vm_superio::serial::{NoEvents, SerialState};

use crate::bus::{BusDevice, lock};
use crate::config::{SerialCapture, SerialTarget};
use crate::devices::irq::IrqLine;
use crate::sandbox::{Sandbox, ThreadKind};
use crate::timing::BootTimeline;
use crate::wire::{Decoder, Encoder, FormatError};

/// Where serial bytes go.
pub(crate) enum Sink {
    Stdout(io::Stdout),
    File(File),
    Capture(SerialCapture),
    Socket(Arc<SocketConsole>),
    Null,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Stdout(out) => out.write(buf),
            Sink::File(file) => file.write(buf),
            Sink::Capture(capture) => {
                capture.append(buf);
                Ok(buf.len())
            }
            Sink::Socket(console) => {
                console.broadcast(buf);
                Ok(buf.len())
            }
            Sink::Null => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Stdout(out) => out.flush(),
            Sink::File(file) => file.flush(),
            _ => Ok(()),
        }
    }
}

/// The UART's output: its sink, and the VM's timeline that notes the first byte.
pub(crate) struct SerialOutput {
    sink: Sink,
    timeline: Arc<BootTimeline>,
}

impl Write for SerialOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.timeline.mark_first_serial_byte();
        self.sink.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sink.flush()
    }
}

type Uart = Serial<IrqLine, NoEvents, SerialOutput>;

/// COM1 as a bus device.
pub(crate) struct SerialDevice {
    uart: Uart,
}

/// The receive FIFO's size in vm-superio's UART.
const FIFO_SIZE: usize = 64;

impl SerialDevice {
    /// Queues bytes typed by a console client; returns how many fit.
    pub(crate) fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        self.uart.enqueue_raw_bytes(bytes).unwrap_or(0)
    }

    /// The UART's registers and the input the guest has not read (for migration; the
    /// output already went to the console).
    pub(crate) fn save(&self, e: &mut Encoder) {
        let s = self.uart.state();
        for reg in [
            s.baud_divisor_low,
            s.baud_divisor_high,
            s.interrupt_enable,
            s.interrupt_identification,
            s.line_control,
            s.line_status,
            s.modem_control,
            s.modem_status,
            s.scratch,
        ] {
            e.u8(reg);
        }
        e.short_bytes(&s.in_buffer);
    }

    /// The UART as [`SerialDevice::save`] wrote it, writing to this console.
    pub(crate) fn restore(&mut self, d: &mut Decoder) -> Result<(), FormatError> {
        let regs: [u8; 9] = d.array()?;
        let in_buffer = d.short_bytes(FIFO_SIZE, "the serial input FIFO")?.to_vec();
        let [
            baud_divisor_low,
            baud_divisor_high,
            interrupt_enable,
            interrupt_identification,
            line_control,
            line_status,
            modem_control,
            modem_status,
            scratch,
        ] = regs;
        let state = SerialState {
            baud_divisor_low,
            baud_divisor_high,
            interrupt_enable,
            interrupt_identification,
            line_control,
            line_status,
            modem_control,
            modem_status,
            scratch,
            in_buffer,
        };
        // The output moves from the old UART to the restored one; a stand-in holds
        // the place meanwhile.
        let irq = self.uart.interrupt_evt().clone();
        let timeline = self.uart.writer().timeline.clone();
        let stand_in = Serial::new(
            irq.clone(),
            SerialOutput {
                sink: Sink::Null,
                timeline,
            },
        );
        let out = std::mem::replace(&mut self.uart, stand_in).into_writer();
        // The FIFO's length, the one thing `from_state` checks, is within bounds.
        self.uart = Serial::from_state(&state, irq, NoEvents, out)
            .map_err(|e| FormatError::Invalid(format!("the serial state: {e:?}")))?;
        Ok(())
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        // The UART has byte registers; wider accesses see the first one.
        data.fill(0);
        if let (Some(first), Ok(offset)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.uart.read(offset);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Some(&value), Ok(offset)) = (data.first(), u8::try_from(offset))
            && let Err(e) = self.uart.write(offset, value)
        {
            // The console sink failed (a full disk, a closed stdout): the
            // guest must keep running; the byte is lost.
            tracing::debug!("serial output lost a byte: {e:?}");
        }
    }
}

/// COM1 wired to its target; keeps a socket console alive with it.
pub(crate) struct Console {
    pub(crate) device: Arc<Mutex<SerialDevice>>,
    socket: Option<Arc<SocketConsole>>,
}

impl Console {
    /// COM1 writing to `target`, its first byte noted in `timeline`. A socket console's
    /// threads enter `sandbox` when they start.
    pub(crate) fn new(
        target: &SerialTarget,
        irq: IrqLine,
        sandbox: Arc<Sandbox>,
        timeline: Arc<BootTimeline>,
    ) -> io::Result<Self> {
        let (sink, socket) = match target {
            SerialTarget::Stdout => (Sink::Stdout(io::stdout()), None),
            SerialTarget::File(path) => {
                let file = OpenOptions::new().create(true).append(true).open(path)?;
                (Sink::File(file), None)
            }
            SerialTarget::Capture(capture) => (Sink::Capture(capture.clone()), None),
            SerialTarget::Null => (Sink::Null, None),
            SerialTarget::UnixSocket(path) => {
                let console = SocketConsole::bind(path)?;
                (Sink::Socket(console.clone()), Some(console))
            }
        };
        let device = Arc::new(Mutex::new(SerialDevice {
            uart: Serial::new(irq, SerialOutput { sink, timeline }),
        }));
        if let Some(console) = &socket {
            console.start(Arc::downgrade(&device), sandbox)?;
        }
        Ok(Console { device, socket })
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        if let Some(socket) = &self.socket {
            socket.stop();
        }
    }
}

/// Recent output replayed to a client that attaches late.
const BACKLOG_BYTES: usize = 64 * 1024;
/// How often the accept loop checks whether it should stop.
const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// How far a client may fall behind the output before it is hung up.
const CLIENT_LAG_BYTES: usize = 64 * 1024;

/// One console client: its connection and the output its socket had no
/// room for yet. The vCPU thread writes output byte by byte and must never
/// block, and a socket holds only a few hundred single-byte writes: a client
/// that is briefly slow (a loaded host) gets the rest late, in order, from
/// here (the accept thread also flushes it, every [`ACCEPT_POLL`]).
struct Client {
    stream: UnixStream,
    unsent: VecDeque<u8>,
}

impl Client {
    /// Queues `bytes` and writes what the socket takes. False: the client
    /// is gone or too far behind, and was hung up.
    fn send(&mut self, bytes: &[u8]) -> bool {
        self.unsent.extend(bytes);
        self.flush()
    }

    /// Writes what the socket takes of the unsent output. False: the
    /// client is gone or too far behind, and was hung up.
    fn flush(&mut self) -> bool {
        let keep = self.write_unsent() && self.unsent.len() <= CLIENT_LAG_BYTES;
        if !keep {
            self.hang_up();
        }
        keep
    }

    /// False if the connection failed.
    fn write_unsent(&mut self) -> bool {
        while !self.unsent.is_empty() {
            let (front, _) = self.unsent.as_slices();
            match self.stream.write(front) {
                Ok(0) => return false,
                Ok(n) => drop(self.unsent.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Hangs up, not just forgets: the client's input thread holds a clone
    /// of the connection, so dropping ours alone would leave the client
    /// connected to a console that never writes to it again (one that
    /// reconnects only at end of file, as the handler's console follower,
    /// would wait forever). Shut down, it reads what was sent, then end of
    /// file, and can reconnect (the backlog replays the recent output).
    fn hang_up(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// A unix socket console: any number of clients see the output (starting
/// with the recent backlog) and what they send is typed into the guest.
pub(crate) struct SocketConsole {
    path: PathBuf,
    /// Device and inode of the socket file bound at `path`: a VM started again
    /// (a guest reboot or reset in the launcher) binds the same path before
    /// the old VM is dropped, and the old console must not remove the new
    /// console's socket then.
    socket_id: (u64, u64),
    listener: UnixListener,
    clients: Mutex<Vec<Client>>,
    backlog: Mutex<VecDeque<u8>>,
    stopped: AtomicBool,
}

impl SocketConsole {
    fn bind(path: &Path) -> io::Result<Arc<Self>> {
        // A stale socket from an earlier run would make bind fail; anything
        // else at that path is not ours to delete.
        use std::os::unix::fs::FileTypeExt;
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        Ok(Arc::new(SocketConsole {
            path: path.to_path_buf(),
            socket_id: file_id(path)?,
            listener,
            clients: Mutex::new(Vec::new()),
            backlog: Mutex::new(VecDeque::new()),
            stopped: AtomicBool::new(false),
        }))
    }

    fn start(
        self: &Arc<Self>,
        serial: Weak<Mutex<SerialDevice>>,
        sandbox: Arc<Sandbox>,
    ) -> io::Result<()> {
        let console = self.clone();
        std::thread::Builder::new()
            .name("serial-accept".into())
            .spawn(move || match sandbox.enter(ThreadKind::ConsoleAccept) {
                Ok(()) => console.accept_loop(serial, &sandbox),
                Err(e) => tracing::error!("serial console: no clients: {e}"),
            })?;
        Ok(())
    }

    fn accept_loop(self: Arc<Self>, serial: Weak<Mutex<SerialDevice>>, sandbox: &Arc<Sandbox>) {
        while !self.stopped.load(Ordering::SeqCst) {
            match self.listener.accept() {
                Ok((stream, _)) => self.attach(stream, serial.clone(), sandbox),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.flush_clients();
                    std::thread::sleep(ACCEPT_POLL);
                }
                Err(e) => {
                    tracing::warn!("serial console: accept failed: {e}");
                    std::thread::sleep(ACCEPT_POLL);
                }
            }
        }
    }

    fn attach(
        &self,
        mut stream: UnixStream,
        serial: Weak<Mutex<SerialDevice>>,
        sandbox: &Arc<Sandbox>,
    ) {
        // Hold the backlog lock while registering so no byte is missed or doubled.
        let backlog = lock(&self.backlog);
        let (front, back) = backlog.as_slices();
        if stream
            .write_all(front)
            .and_then(|_| stream.write_all(back))
            .is_err()
        {
            return;
        }
        let Ok(reader) = stream.try_clone() else {
            return;
        };
        // A slow client must not stall the vCPU: writes are non-blocking,
        // what does not fit waits in `Client::unsent`, and a client that
        // falls too far behind is hung up.
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        lock(&self.clients).push(Client {
            stream,
            unsent: VecDeque::new(),
        });
        drop(backlog);
        let sandbox = sandbox.clone();
        let _ = std::thread::Builder::new()
            .name("serial-input".into())
            .spawn(move || match sandbox.enter(ThreadKind::ConsoleInput) {
                Ok(()) => input_loop(reader, serial),
                Err(e) => tracing::error!("serial console: client input lost: {e}"),
            });
    }

    fn broadcast(&self, bytes: &[u8]) {
        let mut backlog = lock(&self.backlog);
        backlog.extend(bytes);
        let excess = backlog.len().saturating_sub(BACKLOG_BYTES);
        backlog.drain(..excess);
        lock(&self.clients).retain_mut(|client| client.send(bytes));
    }

    /// Sends clients the output their sockets had no room for before.
    fn flush_clients(&self) {
        lock(&self.clients).retain_mut(Client::flush);
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        for client in lock(&self.clients).drain(..) {
            client.hang_up();
        }
        // Only our own socket: the path may hold a newer console's by now.
        if file_id(&self.path).ok() == Some(self.socket_id) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Device and inode of the file at `path` (not following a symlink).
fn file_id(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

/// Types what a client sends into the guest until it disconnects or the VM
/// is gone. Input beyond the UART's FIFO is dropped, like a real line. The
/// connection is non-blocking (output to it must never stall a vCPU), so
/// the thread waits for input with `poll`.
fn input_loop(mut stream: UnixStream, serial: Weak<Mutex<SerialDevice>>) {
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let Some(device) = serial.upgrade() else {
                    return;
                };
                lock(&device).enqueue_input(&buf[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !wait_readable(&stream) {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Waits until `stream` has input or was closed; false if polling failed.
fn wait_readable(stream: &UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd for the call.
        if unsafe { libc::poll(&mut fd, 1, -1) } >= 0 {
            return true;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

    fn unsandboxed() -> Arc<Sandbox> {
        Sandbox::new(crate::sandbox::SandboxConfig::disabled(), Vec::new()).unwrap()
    }

    fn serial(target: &SerialTarget) -> Console {
        let irq = IrqLine::from_eventfd(4, EventFd::new(EFD_NONBLOCK).unwrap());
        Console::new(target, irq, unsandboxed(), Arc::default()).unwrap()
    }

    #[test]
    fn bytes_written_to_the_data_register_reach_the_capture() {
        let capture = SerialCapture::new();
        let console = serial(&SerialTarget::Capture(capture.clone()));
        for &b in b"hi\n" {
            lock(&console.device).write(0, &[b]);
        }
        assert!(capture.wait_for("hi\n", Duration::from_secs(1)));
        assert!(!capture.wait_for("nope", Duration::from_millis(10)));
    }

    #[test]
    fn the_line_status_register_reports_an_empty_transmitter() {
        let console = serial(&SerialTarget::Null);
        let mut lsr = [0u8; 1];
        lock(&console.device).read(5, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "a polling guest would spin forever");
    }

    #[test]
    fn odd_offsets_and_sizes_are_harmless() {
        let console = serial(&SerialTarget::Null);
        let mut dev = lock(&console.device);
        for offset in [0, 7, 8, 255, 256, u64::MAX] {
            let mut data = [0u8; 4];
            dev.read(offset, &mut data);
            dev.write(offset, &[1, 2, 3, 4]);
            dev.write(offset, &[]);
            dev.read(offset, &mut []);
        }
    }

    #[test]
    fn a_console_socket_never_replaces_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("precious.txt");
        std::fs::write(&path, "keep me").unwrap();
        let irq = IrqLine::from_eventfd(4, EventFd::new(EFD_NONBLOCK).unwrap());
        let err = Console::new(
            &SerialTarget::UnixSocket(path.clone()),
            irq,
            unsandboxed(),
            Arc::default(),
        )
        .err()
        .unwrap();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
    }

    #[test]
    fn a_stale_console_socket_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.sock");
        let stale = UnixListener::bind(&path).unwrap();
        drop(stale);
        let console = serial(&SerialTarget::UnixSocket(path.clone()));
        UnixStream::connect(&path).unwrap();
        drop(console);
    }

    #[test]
    fn a_stopped_console_leaves_a_newer_consoles_socket_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.sock");
        let old = serial(&SerialTarget::UnixSocket(path.clone()));
        // The VM started again binds the same path before the old one goes.
        let new = serial(&SerialTarget::UnixSocket(path.clone()));
        drop(old);
        UnixStream::connect(&path).expect("the new console's socket is still there");
        drop(new);
        assert!(!path.exists(), "a console removes its own socket");
    }

    /// Byte `i` of the test output.
    fn text(i: usize) -> u8 {
        b"abcdefghijklmnopqrstuvwxyz"[i % 26]
    }

    /// A client of a new console, attached (it has seen the first byte).
    fn attached_client(console: &Console, path: &Path) -> UnixStream {
        let mut client = UnixStream::connect(path).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        // Once the client has this byte it is attached: later output is
        // broadcast to it (the attach holds the backlog until then).
        lock(&console.device).write(0, b"!");
        let mut first = [0u8; 1];
        client.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"!");
        client
    }

    /// A client that reads nothing for a while (a loaded host): its socket
    /// fills after a few hundred single-byte writes (the guest writes the
    /// UART byte by byte); the rest must reach it later, in order.
    #[test]
    fn a_client_that_falls_behind_gets_all_the_output_late() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.sock");
        let console = serial(&SerialTarget::UnixSocket(path.clone()));
        let mut client = attached_client(&console, &path);
        let total = 20_000;
        for i in 0..total {
            lock(&console.device).write(0, &[text(i)]);
        }
        let mut got = vec![0u8; total];
        client
            .read_exact(&mut got)
            .expect("all the output, late (the accept thread sends what did not fit)");
        assert!(got.iter().enumerate().all(|(i, &b)| b == text(i)));
        drop(console);
    }

    /// A client that stops reading for good is hung up once it is
    /// `CLIENT_LAG_BYTES` behind: it reads what was sent, then end of file
    /// (not a silent, open connection: its input thread holds a clone of
    /// it), and a reconnect replays the backlog.
    #[test]
    fn a_client_too_far_behind_is_hung_up_and_can_reconnect() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.sock");
        let console = serial(&SerialTarget::UnixSocket(path.clone()));
        let mut slow = attached_client(&console, &path);
        let total = 3 * CLIENT_LAG_BYTES;
        for i in 0..total {
            lock(&console.device).write(0, &[text(i)]);
        }
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match slow.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => panic!(
                    "the console stopped writing to a client it did not hang up \
                     (read {} of {total} bytes, then {e})",
                    got.len()
                ),
            }
        }
        assert!(got.len() < total, "the client was never hung up");
        assert!(got.iter().enumerate().all(|(i, &b)| b == text(i)));
        let mut again = UnixStream::connect(&path).unwrap();
        again
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut replay = vec![0u8; BACKLOG_BYTES];
        again.read_exact(&mut replay).unwrap();
        let first = total - BACKLOG_BYTES;
        assert!(
            replay
                .iter()
                .enumerate()
                .all(|(i, &b)| b == text(first + i))
        );
        drop(console);
    }

    #[test]
    fn a_late_console_client_gets_the_bounded_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.sock");
        let console = serial(&SerialTarget::UnixSocket(path.clone()));
        let total = BACKLOG_BYTES + 1000;
        for i in 0..total {
            lock(&console.device).write(0, &[b"abcdefghijklmnopqrstuvwxyz"[i % 26]]);
        }
        let mut client = UnixStream::connect(&path).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut got = vec![0u8; BACKLOG_BYTES];
        client.read_exact(&mut got).unwrap();
        // The oldest 1000 bytes were dropped; the rest arrive in order.
        assert_eq!(got[0], b'a' + (1000 % 26) as u8);
        drop(console);
        assert!(!path.exists());
    }
}

//! `virt-handler standalone` end to end, with real parts: the launcher binaries built from
//! the workspace (`virt-launcher-monitor`, `virt-launcher`), real KVM, real network
//! namespaces and mounts. The handler is run as a process and watched through its output.
//!
//! Needs root and /dev/kvm; fails (never skips) without them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

#[path = "../../tests/common/mod.rs"]
mod common;
use common::{Demo, DemoDisk, demo, disk_demo, helper_binaries, require_root_and_kvm};

/// A running `virt-handler standalone` and its stdout lines.
struct Handler {
    child: Child,
    lines: Arc<(Mutex<Vec<String>>, Condvar)>,
}

impl Handler {
    fn start(demo: &Demo, state: &Path, extra: &[&str]) -> Handler {
        let (monitor, _) = helper_binaries();
        let mut child = Command::new(env!("CARGO_BIN_EXE_virt-handler"))
            .arg("standalone")
            .arg(&demo.manifest)
            .arg("--state-dir")
            .arg(state)
            .arg("--launcher")
            .arg(monitor)
            .arg("--image")
            .arg(format!(
                "localhost/test-guest:latest={}",
                demo.guest.display()
            ))
            .arg("--image")
            .arg(format!(
                "localhost/test-disk:latest={}",
                demo.disk.display()
            ))
            .args(["--watchdog-timeout", "3"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start virt-handler");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                println!("handler> {line}");
                let (l, cv) = &*sink;
                l.lock().expect("lock").push(line);
                cv.notify_all();
            }
        });
        Handler { child, lines }
    }

    /// Waits for a line containing `text`; returns it.
    fn wait_for(&self, text: &str, timeout: Duration) -> String {
        let (l, cv) = &*self.lines;
        let deadline = Instant::now() + timeout;
        let mut guard = l.lock().expect("lock");
        loop {
            if let Some(line) = guard.iter().find(|line| line.contains(text)) {
                return line.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no line containing {text:?} within {timeout:?}; output so far:\n{}",
                guard.join("\n")
            );
            guard = cv.wait_timeout(guard, left).expect("lock").0;
        }
    }

    fn output(&self) -> Vec<String> {
        self.lines.0.lock().expect("lock").clone()
    }

    fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "virt-handler did not exit within {timeout:?}; output:\n{}",
                self.output().join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = i32::try_from(self.child.id()).expect("a pid fits pid_t");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .expect("signal the handler");
    }
}

impl Drop for Handler {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The launcher PID and host veth from the handler's "pod ..." line.
fn pod_facts(line: &str) -> (i32, String) {
    let pid = line
        .split("launcher pid ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no launcher pid in {line:?}"));
    let pod_uid = line
        .split("pod ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap_or_else(|| panic!("no pod uid in {line:?}"));
    let hint: String = pod_uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect();
    (pid, format!("vh{hint}"))
}

fn alive(pid: i32) -> bool {
    // Zombies count as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
                .unwrap_or(false)
        })
        .unwrap_or(false)
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// The status file of the demo's VMI under `state` (never next to the manifest).
fn status(demo: &Demo, state: &Path) -> serde_yaml::Value {
    let manifest: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&demo.manifest).expect("manifest"))
            .expect("manifest YAML");
    let key = format!(
        "{}/{}",
        manifest["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default"),
        manifest["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
    );
    let path = handler_standalone::store::status_file(state, &key).expect("a file name");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("status file {}: {e}", path.display()));
    serde_yaml::from_str(&text).expect("status YAML")
}

fn status_phase(demo: &Demo, state: &Path) -> String {
    status(demo, state)["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The state directory holds nothing but the status files (the run's output), and
/// nothing was written beside the manifest.
fn assert_only_status_left(demo: &Demo, state: &Path) {
    let left: Vec<_> = std::fs::read_dir(state)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|name| name == "status"),
        "state dir {} left behind: {left:?}",
        state.display()
    );
    let beside: Vec<_> = std::fs::read_dir(demo.manifest.parent().expect("a directory"))
        .expect("the manifest's directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".status"))
        .collect();
    assert!(beside.is_empty(), "written beside the manifest: {beside:?}");
}

/// `(status, reason)` of the VMI's `Ready` condition in the status file.
fn ready(demo: &Demo, state: &Path) -> (String, String) {
    let status = status(demo, state);
    let conditions = status["conditions"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let ready = conditions
        .iter()
        .find(|c| c["type"].as_str() == Some("Ready"))
        .unwrap_or_else(|| panic!("no Ready condition in {status:?}"));
    let text = |k: &str| ready[k].as_str().unwrap_or_default().to_string();
    (text("status"), text("reason"))
}

#[test]
fn boots_to_running_runs_the_guest_checks_and_stops_within_the_grace_period() {
    require_root_and_kvm();
    let demo = demo("sa-boot", 30);
    let state = demo.dir.path().join("state");
    let mut handler = Handler::start(&demo, &state, &[]);
    let pod_line = handler.wait_for("launcher pid", Duration::from_secs(30));
    let (pid, veth) = pod_facts(&pod_line);
    assert!(
        link_exists(&veth),
        "host veth {veth} exists while the pod runs"
    );
    let running = handler.wait_for("phase Scheduled -> Running", BOOT_TIMEOUT);
    // One status write brings the VMI to Running (KubeVirt's CI allows two).
    assert!(running.contains(", 1 status writes)"), "{running}");
    let done = handler.wait_for("console: DONE passed=", BOOT_TIMEOUT);
    assert!(done.contains("failed=0"), "guest checks failed: {done}");
    // The stand-in controller syncs Ready on its next pass over the pods.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ready(&demo, &state).0 != "True" {
        assert!(
            Instant::now() < deadline,
            "a running guest in a ready pod is Ready: {:?}",
            ready(&demo, &state)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // As Ctrl-C or a service manager would stop it.
    handler.signal(nix::sys::signal::Signal::SIGTERM);
    handler.wait_for(
        "stopping: shutting the VMs down gracefully",
        Duration::from_secs(10),
    );
    let stop_started = Instant::now();
    handler.wait_for("phase Running -> Succeeded", Duration::from_secs(30));
    assert!(
        stop_started.elapsed() < Duration::from_secs(30),
        "graceful shutdown took {:?}, more than the grace period",
        stop_started.elapsed()
    );
    let status = handler.wait_exit(Duration::from_secs(90));
    assert!(status.success(), "virt-handler exited with {status}");
    let out = handler.output();
    // Each event once: SyncVirtualMachine is sent again until the domain shows up, and the
    // shutdown again at each recheck, but they are one start and one shutdown.
    for event in ["event Normal Created", "event Normal ShuttingDown"] {
        let seen = out.iter().filter(|l| l.contains(event)).count();
        assert_eq!(seen, 1, "{event} seen {seen} times: {out:?}");
    }
    assert_eq!(status_phase(&demo, &state), "Succeeded");
    // As virt-controller: a finished VMI is not Ready (its pod is gone).
    assert_eq!(
        ready(&demo, &state),
        ("False".into(), "PodNotExists".into())
    );
    // Everything it created is gone: launcher, veth, state directory.
    assert!(!alive(pid), "launcher {pid} still running");
    assert!(!link_exists(&veth), "host veth {veth} left behind");
    assert_only_status_left(&demo, &state);
}

#[test]
fn survives_a_handler_restart_and_fails_the_vmi_when_its_launcher_is_killed() {
    require_root_and_kvm();
    let demo = demo("sa-restart", 30);
    let state = demo.dir.path().join("state");
    let first = Handler::start(&demo, &state, &[]);
    let pod_line = first.wait_for("launcher pid", Duration::from_secs(30));
    let (pid, veth) = pod_facts(&pod_line);
    first.wait_for("phase Scheduled -> Running", BOOT_TIMEOUT);
    first.wait_for("console: DONE passed=", BOOT_TIMEOUT);

    // A crash of the handler: the launcher and its VM keep running.
    first.signal(nix::sys::signal::Signal::SIGKILL);
    drop(first);
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(pid), "the launcher must outlive the handler");

    let mut second = Handler::start(&demo, &state, &[]);
    second.wait_for(
        &format!("adopting running launcher pid {pid}"),
        Duration::from_secs(30),
    );
    // The reconciles after the restart leave the running VM alone.
    std::thread::sleep(Duration::from_secs(5));
    assert!(alive(pid), "the adopted launcher was stopped");
    let out = second.output();
    assert!(
        !out.iter()
            .any(|l| l.contains("phase ") || l.contains("event Normal Created")),
        "the restarted handler changed the VMI: {out:?}"
    );
    assert_eq!(status_phase(&demo, &state), "Running");

    // Kill the whole launcher pod (its process group, as a container runtime would).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(-pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the launcher's process group");
    second.wait_for("phase Running -> Failed", Duration::from_secs(60));
    second.wait_for("pod removed", Duration::from_secs(30));
    // Every VMI ended, not all well: the run fails.
    let status = second.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "virt-handler exited with {status}");
    assert_eq!(status_phase(&demo, &state), "Failed");
    assert!(!link_exists(&veth), "host veth {veth} left behind");
    assert_only_status_left(&demo, &state);
}

#[test]
fn missing_image_mapping_is_a_clear_error_and_leaves_nothing() {
    require_root_and_kvm();
    let demo = demo("sa-noimage", 30);
    let state = demo.dir.path().join("state");
    let (monitor, _) = helper_binaries();
    let out = Command::new(env!("CARGO_BIN_EXE_virt-handler"))
        .arg("standalone")
        .arg(&demo.manifest)
        .arg("--state-dir")
        .arg(&state)
        .arg("--launcher")
        .arg(monitor)
        .arg("--image")
        .arg(format!(
            "localhost/test-guest:latest={}",
            demo.guest.display()
        ))
        .output()
        .expect("run virt-handler");
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("localhost/test-disk:latest") && text.contains("--image"),
        "{text}"
    );
    assert!(!state.exists(), "state dir left behind");
}

#[test]
fn the_same_vmi_twice_is_refused_before_anything_is_created() {
    require_root_and_kvm();
    let demo = demo("sa-twice", 30);
    let state = demo.dir.path().join("state");
    let (monitor, _) = helper_binaries();
    let copy = demo.dir.path().join("copy.yaml");
    std::fs::copy(&demo.manifest, &copy).expect("copy manifest");
    let out = Command::new(env!("CARGO_BIN_EXE_virt-handler"))
        .arg("standalone")
        .arg(&demo.manifest)
        .arg(&copy)
        .arg("--state-dir")
        .arg(&state)
        .arg("--launcher")
        .arg(monitor)
        .output()
        .expect("run virt-handler");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("default/sa-twice is given twice"), "{text}");
    assert!(!state.exists(), "nothing may be created");
}

#[test]
fn stop_after_console_stops_gracefully_once_every_guest_reported() {
    require_root_and_kvm();
    let demo = demo("sa-console", 30);
    // Under /run, like the default state dir (/var/run/virt-handler-standalone): the
    // launcher's private tmpfs over /run must not hide the pod's files from its mounts.
    let state = Path::new("/run").join(format!("vh-sa-console-{}", std::process::id()));
    let mut handler = Handler::start(&demo, &state, &["--stop-after-console", "DONE passed="]);
    handler.wait_for("console: DONE passed=", BOOT_TIMEOUT);
    handler.wait_for(
        "every console printed \"DONE passed=\": stopping",
        Duration::from_secs(10),
    );
    handler.wait_for("phase Running -> Succeeded", Duration::from_secs(30));
    let status = handler.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "virt-handler exited with {status}");
    assert_eq!(status_phase(&demo, &state), "Succeeded");
    assert_only_status_left(&demo, &state);
    let _ = std::fs::remove_dir_all(&state);
}

/// A raw socket on a host link: whole Ethernet frames in and out, as the node side of the
/// pod's veth sees them.
struct Wire {
    fd: std::os::fd::OwnedFd,
    index: i32,
}

/// `AF_PACKET` as `sockaddr_ll.sll_family` holds it.
fn af_packet() -> u16 {
    u16::try_from(libc::AF_PACKET).expect("an address family fits u16")
}

/// `ETH_P_ALL` in network byte order, as `sockaddr_ll` and `socket(2)` take it.
fn eth_p_all_be() -> u16 {
    u16::try_from(libc::ETH_P_ALL)
        .expect("an ethertype fits u16")
        .to_be()
}

/// The size of a `sockaddr_ll` as the socket calls take it.
fn sockaddr_ll_len() -> libc::socklen_t {
    libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_ll>()).expect("a small struct")
}

impl Wire {
    fn bind(link: &str) -> Wire {
        use std::os::fd::{AsRawFd, FromRawFd};
        let name = std::ffi::CString::new(link).unwrap();
        // SAFETY: plain syscalls on a socket this function owns; sockaddr_ll lives
        // across the bind call.
        unsafe {
            let index = i32::try_from(libc::if_nametoindex(name.as_ptr())).expect("an ifindex");
            assert!(index > 0, "no link {link}");
            let raw = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                i32::from(eth_p_all_be()),
            );
            assert!(
                raw >= 0,
                "packet socket: {}",
                std::io::Error::last_os_error()
            );
            let fd = std::os::fd::OwnedFd::from_raw_fd(raw);
            let mut addr: libc::sockaddr_ll = std::mem::zeroed();
            addr.sll_family = af_packet();
            addr.sll_protocol = eth_p_all_be();
            addr.sll_ifindex = index;
            let rc = libc::bind(
                fd.as_raw_fd(),
                std::ptr::from_ref(&addr).cast(),
                sockaddr_ll_len(),
            );
            assert!(
                rc == 0,
                "bind to {link}: {}",
                std::io::Error::last_os_error()
            );
            Wire { fd, index }
        }
    }

    fn send(&self, frame: &[u8]) {
        use std::os::fd::AsRawFd;
        // SAFETY: sockaddr_ll and frame outlive the call.
        let sent = unsafe {
            let mut addr: libc::sockaddr_ll = std::mem::zeroed();
            addr.sll_family = af_packet();
            addr.sll_ifindex = self.index;
            addr.sll_halen = 6;
            addr.sll_addr[..6].copy_from_slice(&frame[..6]);
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                std::ptr::from_ref(&addr).cast(),
                sockaddr_ll_len(),
            )
        };
        assert_eq!(
            usize::try_from(sent).ok(),
            Some(frame.len()),
            "{}",
            std::io::Error::last_os_error()
        );
    }

    /// Frames received until `pick` returns something or `timeout` passes (outgoing
    /// frames of the host itself are skipped).
    fn recv_until<T>(
        &self,
        timeout: Duration,
        mut pick: impl FnMut(&[u8]) -> Option<T>,
    ) -> Option<T> {
        use std::os::fd::AsRawFd;
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let wait_ms = i32::try_from(left.as_millis().min(1000)).expect("at most 1000");
            // SAFETY: one pollfd, valid for the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
            if ready <= 0 {
                continue;
            }
            // SAFETY: sockaddr_ll and buf outlive the call.
            let (n, outgoing) = unsafe {
                let mut from: libc::sockaddr_ll = std::mem::zeroed();
                let mut len = sockaddr_ll_len();
                let n = libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    std::ptr::from_mut(&mut from).cast(),
                    &mut len,
                );
                (n, from.sll_pkttype == libc::PACKET_OUTGOING)
            };
            // Negative: an error (an interrupted call); retried until the deadline.
            let n = match usize::try_from(n) {
                Ok(n) if n > 0 && !outgoing => n,
                _ => continue,
            };
            if let Some(found) = pick(&buf[..n]) {
                return Some(found);
            }
        }
    }
}

/// A DHCP DISCOVER from the node side for client `chaddr`; the OFFER that comes back
/// (yiaddr, server identifier, router), if any.
fn dhcp_offer_for(
    wire: &Wire,
    node_mac: [u8; 6],
    chaddr: [u8; 6],
    xid: u32,
) -> Option<(
    std::net::Ipv4Addr,
    std::net::Ipv4Addr,
    Vec<std::net::Ipv4Addr>,
)> {
    use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode};
    use dhcproto::{Decodable, Decoder, Encodable};
    let mut msg = Message::default();
    msg.set_xid(xid).set_chaddr(&chaddr);
    msg.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Discover));
    let mut frame = Vec::new();
    etherparse::PacketBuilder::ethernet2(node_mac, [0xff; 6])
        .ipv4([0, 0, 0, 0], [255, 255, 255, 255], 64)
        .udp(68, 67)
        .write(&mut frame, &msg.to_vec().unwrap())
        .unwrap();
    for _ in 0..5 {
        wire.send(&frame);
        let offer = wire.recv_until(Duration::from_secs(1), |f| {
            let packet = etherparse::SlicedPacket::from_ethernet(f).ok()?;
            let etherparse::TransportSlice::Udp(udp) = packet.transport? else {
                return None;
            };
            if udp.destination_port() != 68 {
                return None;
            }
            let reply = Message::decode(&mut Decoder::new(udp.payload())).ok()?;
            if reply.xid() != xid {
                return None;
            }
            let server = match reply.opts().get(OptionCode::ServerIdentifier) {
                Some(DhcpOption::ServerIdentifier(ip)) => *ip,
                _ => return None,
            };
            let routers = match reply.opts().get(OptionCode::Router) {
                Some(DhcpOption::Router(r)) => r.clone(),
                _ => Vec::new(),
            };
            Some((reply.yiaddr(), server, routers))
        });
        if offer.is_some() {
            return offer;
        }
    }
    None
}

fn text_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The bridge binding end to end: the handler bridges the pod's eth0 and writes the DHCP
/// cache, the launcher serves DHCP from it and runs the VM, whose virtio-net frames (from
/// the real VMM on tap0) cross the bridge and the pod's veth to the node, and back.
#[test]
fn bridge_binding_carries_the_guests_frames_to_the_node_and_serves_the_pod_address() {
    const GUEST_ETHERTYPE: [u8; 2] = [0x88, 0xb5];
    require_root_and_kvm();
    let demo = demo("sa-bridge", 30);
    let text = std::fs::read_to_string(&demo.manifest)
        .unwrap()
        .replace("masquerade: {}", "bridge: {}")
        .replace(
            "checks=serial,bootparams,idt,mem,smbios,rtc,virtio-blk,virtio-rng",
            "checks=serial,virtio-net net.rx_ms=120000",
        );
    assert!(
        text.contains("bridge: {}") && text.contains("virtio-net"),
        "{text}"
    );
    std::fs::write(&demo.manifest, text).unwrap();
    let state = demo.dir.path().join("state");
    let mut handler = Handler::start(&demo, &state, &[]);
    let pod_line = handler.wait_for("launcher pid", Duration::from_secs(30));
    let (pid, veth) = pod_facts(&pod_line);
    // The guest shares the pod network's broadcast domain, where fresh links chatter
    // (IPv6 autoconfiguration, MLD); the test guest gives up after 16 frames that are not
    // its test frame. This pod is IPv4 only: keep IPv6 quiet on both ends.
    std::fs::write(format!("/proc/sys/net/ipv6/conf/{veth}/disable_ipv6"), "1").unwrap();
    netsetup::netns::run_in(
        &netsetup::netns::NetnsTarget::Pid(u32::try_from(pid).expect("a positive pid")),
        || {
            for key in ["all", "default"] {
                std::fs::write(format!("/proc/sys/net/ipv6/conf/{key}/disable_ipv6"), "1").unwrap();
            }
        },
    )
    .unwrap();
    let wire = Wire::bind(&veth);
    let node_mac: [u8; 6] = {
        let text = std::fs::read_to_string(format!("/sys/class/net/{veth}/address")).unwrap();
        let bytes: Vec<u8> = text
            .trim()
            .split(':')
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        bytes.try_into().unwrap()
    };
    let node_ip: std::net::Ipv4Addr = {
        let out = Command::new("ip")
            .args(["-o", "-4", "addr", "show", "dev", &veth])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no IPv4 on {veth}: {text}"))
    };
    let pod_ip = std::net::Ipv4Addr::from(u32::from(node_ip) + 1);

    // The guest's broadcast frame reaches the node through tap0, k6t-eth0 and eth0-nic;
    // the node's answer, sent at once, goes back the same way.
    let guest_mac: [u8; 6] = wire
        .recv_until(BOOT_TIMEOUT, |f| {
            (f.len() >= 14 && f[12..14] == GUEST_ETHERTYPE && f[..6] == [0xff; 6])
                .then(|| f[6..12].try_into().unwrap())
        })
        .unwrap_or_else(|| {
            panic!(
                "no guest frame on {veth}; output:\n{}",
                handler.output().join("\n")
            )
        });
    let payload = b"hello guest, this is the node";
    let mut frame = guest_mac.to_vec();
    frame.extend_from_slice(&node_mac);
    frame.extend_from_slice(&GUEST_ETHERTYPE);
    frame.extend_from_slice(payload);
    wire.send(&frame);
    let rx = handler.wait_for("TEST virtio-net-rx", BOOT_TIMEOUT);
    assert!(
        rx.contains("PASS") && rx.contains("payload=hello guest, this is the node"),
        "{rx}"
    );
    let done = handler.wait_for("console: DONE passed=", BOOT_TIMEOUT);
    assert!(done.contains("failed=0"), "guest checks failed: {done}");

    // The guest uses the pod's own MAC, now on the dummy eth0 in the pod.
    let pod_links = netsetup::netns::run_in(
        &netsetup::netns::NetnsTarget::Pid(u32::try_from(pid).expect("a positive pid")),
        || Command::new("ip").args(["-o", "link", "show"]).output(),
    )
    .unwrap()
    .unwrap();
    let pod_links = String::from_utf8_lossy(&pod_links.stdout).into_owned();
    let eth0 = pod_links
        .lines()
        .find(|l| l.contains(" eth0: "))
        .unwrap_or_else(|| panic!("no eth0 in the pod: {pod_links}"));
    assert!(
        eth0.contains(&text_mac(&guest_mac)),
        "guest MAC is not the pod's: {eth0}"
    );
    assert!(
        pod_links
            .lines()
            .any(|l| l.contains(" eth0-nic@") && l.contains("master k6t-eth0")),
        "{pod_links}"
    );

    // The launcher's DHCP server, fed by the cache the handler wrote, offers the pod's
    // address to the guest's MAC only (asked from the node side, as another host could).
    let (yiaddr, server, routers) = dhcp_offer_for(&wire, node_mac, guest_mac, 0x7e57_0001)
        .expect("no DHCP offer for the guest's MAC");
    assert_eq!(yiaddr, pod_ip);
    assert_eq!(server, std::net::Ipv4Addr::new(169, 254, 75, 10));
    assert_eq!(routers, vec![node_ip]);
    let mut other = guest_mac;
    other[5] ^= 0x01;
    assert!(
        dhcp_offer_for(&wire, node_mac, other, 0x7e57_0002).is_none(),
        "the DHCP server answered a MAC that is not the guest's"
    );

    handler.signal(nix::sys::signal::Signal::SIGTERM);
    handler.wait_for("phase Running -> Succeeded", Duration::from_secs(60));
    let status = handler.wait_exit(Duration::from_secs(90));
    assert!(status.success(), "virt-handler exited with {status}");
    assert!(!link_exists(&veth), "host veth {veth} left behind");
    assert_only_status_left(&demo, &state);
}

/// Runs `virt-handler standalone` on the demo's manifest, which it must refuse at once:
/// the run fails naming the VMI, one FailedCreate event naming `field`, the VMI `Failed`
/// with `Synchronized=False`, and nothing left behind.
fn assert_refused_at_once(demo: &Demo, field: &str) {
    let state = demo.dir.path().join("state");
    let (monitor, _) = helper_binaries();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_virt-handler"))
        .arg("standalone")
        .arg(&demo.manifest)
        .arg("--state-dir")
        .arg(&state)
        .arg("--launcher")
        .arg(monitor)
        .arg("--image")
        .arg(format!(
            "localhost/test-guest:latest={}",
            demo.guest.display()
        ))
        .arg("--image")
        .arg(format!(
            "localhost/test-disk:latest={}",
            demo.disk.display()
        ))
        .output()
        .expect("run virt-handler");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a refused VMI must not wait for anything"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("ended Failed: default/"), "{stderr}");
    assert!(
        stdout.contains("event Warning FailedCreate") && stdout.contains(field),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("event Warning FailedCreate").count(),
        1,
        "{stdout}"
    );
    assert_eq!(status_phase(demo, &state), "Failed");
    let status = status(demo, &state);
    let conditions = status["conditions"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c["type"].as_str() == Some("Synchronized")
                && c["reason"].as_str() == Some("FailedCreate")),
        "{status:?}"
    );
    assert_eq!(ready(demo, &state).0, "False");
    assert_only_status_left(demo, &state);
}

#[test]
fn a_vmi_the_launcher_cannot_run_ends_failed_at_once_and_the_run_fails() {
    require_root_and_kvm();
    let demo = demo("sa-refused", 30);
    // A sata disk: the launcher has virtio disks only.
    let text = std::fs::read_to_string(&demo.manifest).expect("manifest");
    let sata = text.replacen("bus: virtio", "bus: sata", 1);
    assert_ne!(text, sata, "the example manifest names a virtio disk bus");
    std::fs::write(&demo.manifest, sata).expect("manifest");
    assert_refused_at_once(&demo, "spec.domain.devices.disks[0]");
}

/// A volume name the launcher would turn into a path out of its directories: refused like
/// any VMI the launcher cannot run, before a pod exists.
#[test]
fn a_volume_name_that_is_no_dns_label_ends_failed_at_once() {
    require_root_and_kvm();
    let demo = demo("sa-badname", 30);
    let text = std::fs::read_to_string(&demo.manifest).expect("manifest");
    let climbing = text.replace("name: rootdisk", "name: ../../escape");
    assert_ne!(
        text, climbing,
        "the example manifest has a volume named rootdisk"
    );
    std::fs::write(&demo.manifest, climbing).expect("manifest");
    assert_refused_at_once(&demo, "spec.volumes[0].name");
    assert!(!demo.dir.path().join("escape").exists());
}

/// A VMI as KubeVirt users write them (`vmi-testguest.yaml`: no kernel named) on a
/// Debian-style disk: the launcher boots the disk's GRUB entry, the handler records the
/// `BootedFromDisk` event naming disk, partition and entry, the guest's checks pass.
#[test]
fn a_vmi_without_a_kernel_boots_its_disk_and_the_entry_is_named() {
    require_root_and_kvm();
    let demo = disk_demo("sa-disk", 30, DemoDisk::Bootable);
    let state = demo.dir.path().join("state");
    let mut handler = Handler::start(&demo, &state, &["--stop-after-console", "DONE passed="]);
    let booted = handler.wait_for("event Normal BootedFromDisk", BOOT_TIMEOUT);
    assert!(
        booted.contains(
            "booted disk \"rootdisk\" (BIOS): GRUB entry \"Debian GNU/Linux\" from /boot/grub/grub.cfg on partition 3 (hd0,gpt3): kernel /boot/vmlinuz-"
        ),
        "{booted}"
    );
    let done = handler.wait_for("console: DONE passed=", BOOT_TIMEOUT);
    assert!(done.contains("failed=0"), "{done}");
    handler.wait_for("phase Running -> Succeeded", Duration::from_secs(30));
    let status = handler.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "virt-handler exited with {status}");
}

/// A boot disk with nothing to boot: the VMI ends `Failed` at once — no wait for the
/// launcher's start timeout — with a `BootFailed` event and the `Synchronized=False`
/// condition naming the disk and the reason, and the run fails.
#[test]
fn a_disk_with_nothing_to_boot_ends_failed_at_once_with_the_reason() {
    require_root_and_kvm();
    let demo = disk_demo("sa-nodisk", 30, DemoDisk::Unbootable);
    let state = demo.dir.path().join("state");
    let started = Instant::now();
    let mut handler = Handler::start(&demo, &state, &[]);
    let event = handler.wait_for("event Warning BootFailed", BOOT_TIMEOUT);
    assert!(
        event.contains("cannot boot disk \"rootdisk\"")
            && event.contains("no boot loader configuration found for BIOS boot"),
        "{event}"
    );
    handler.wait_for("-> Failed", Duration::from_secs(30));
    let exit = handler.wait_exit(Duration::from_secs(60));
    assert!(!exit.success(), "the run fails when its VMI fails");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "failed at once, not after a start timeout: {:?}",
        started.elapsed()
    );
    assert_eq!(status_phase(&demo, &state), "Failed");
    let status = status(&demo, &state);
    let conditions = status["conditions"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert!(
        conditions
            .iter()
            .any(|c| c["type"].as_str() == Some("Synchronized")
                && c["status"].as_str() == Some("False")
                && c["message"]
                    .as_str()
                    // Quoted as KubeVirt's handler quotes a command's error (%q).
                    .is_some_and(|m| m.contains(r#"cannot boot disk \"rootdisk\""#))),
        "{status:?}"
    );
    assert_only_status_left(&demo, &state);
}

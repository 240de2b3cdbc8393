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
use common::{Demo, demo, helper_binaries, require_root_and_kvm};

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
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal)
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

fn status(demo: &Demo) -> serde_yaml::Value {
    let mut path = demo.manifest.as_os_str().to_owned();
    path.push(".status.yaml");
    let text = std::fs::read_to_string(&path).expect("status file next to the manifest");
    serde_yaml::from_str(&text).expect("status YAML")
}

fn status_phase(demo: &Demo) -> String {
    status(demo)["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `(status, reason)` of the VMI's `Ready` condition in the status file.
fn ready(demo: &Demo) -> (String, String) {
    let status = status(demo);
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
    while ready(&demo).0 != "True" {
        assert!(
            Instant::now() < deadline,
            "a running guest in a ready pod is Ready: {:?}",
            ready(&demo)
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
    assert!(
        out.iter().any(|l| l.contains("event Normal ShuttingDown")),
        "{out:?}"
    );
    assert_eq!(status_phase(&demo), "Succeeded");
    // As virt-controller: a finished VMI is not Ready (its pod is gone).
    assert_eq!(ready(&demo), ("False".into(), "PodNotExists".into()));
    // Everything it created is gone: launcher, veth, state directory.
    assert!(!alive(pid), "launcher {pid} still running");
    assert!(!link_exists(&veth), "host veth {veth} left behind");
    assert!(
        !state.exists(),
        "state dir left behind: {}",
        state.display()
    );
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
    assert_eq!(status_phase(&demo), "Running");

    // Kill the whole launcher pod (its process group, as a container runtime would).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(-pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the launcher's process group");
    second.wait_for("phase Running -> Failed", Duration::from_secs(60));
    second.wait_for("pod removed", Duration::from_secs(30));
    let status = second.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "virt-handler exited with {status}");
    assert_eq!(status_phase(&demo), "Failed");
    assert!(!link_exists(&veth), "host veth {veth} left behind");
    assert!(!state.exists(), "state dir left behind");
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
    assert_eq!(status_phase(&demo), "Succeeded");
    assert!(!state.exists(), "state dir left behind");
}

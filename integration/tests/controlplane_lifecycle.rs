//! Nothing of a control plane outlives the process that started it: neither when that process
//! exits normally (the at-exit cleanup of the shared instance), nor when it is SIGKILLed
//! (PR_SET_PDEATHSIG). The `controlplane` binary of this crate plays the test process.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

struct Holder {
    child: Child,
    info: HashMap<String, String>,
}

/// Starts the `controlplane` binary and reads its `key=value` lines up to `ready`.
fn start_holder() -> Holder {
    let mut child = Command::new(env!("CARGO_BIN_EXE_controlplane"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning the controlplane binary");
    let stdout: ChildStdout = child.stdout.take().unwrap();
    let mut info = HashMap::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("reading the controlplane binary's output");
        if line == "ready" {
            return Holder { child, info };
        }
        if let Some((key, value)) = line.split_once('=') {
            info.insert(key.to_owned(), value.to_owned());
        }
    }
    let status = child.wait().unwrap();
    panic!(
        "the controlplane binary exited ({status}) before it was ready; build the binaries \
         with {}",
        integration::controlplane::build_script().display()
    );
}

impl Holder {
    fn pids(&self) -> Vec<u32> {
        let pids: Vec<u32> = self.info["pids"]
            .split(',')
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(
            pids.len(),
            3,
            "etcd, kube-apiserver and kube-controller-manager"
        );
        pids
    }

    fn data_dir(&self) -> PathBuf {
        PathBuf::from(&self.info["data_dir"])
    }
}

/// True once `pid` is gone or a zombie (dead, waiting to be reaped by its new parent).
fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the parenthesised command name, which may contain spaces.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

fn assert_all_die(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    for &pid in pids {
        while !is_dead(pid) {
            assert!(
                Instant::now() < deadline,
                "control-plane process {pid} outlived its test process"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn assert_running(pids: &[u32]) {
    for &pid in pids {
        assert!(!is_dead(pid), "control-plane process {pid} is not running");
    }
}

#[test]
fn normal_exit_stops_the_servers_and_removes_the_data() {
    let mut holder = start_holder();
    let pids = holder.pids();
    let data_dir = holder.data_dir();
    assert_running(&pids);
    assert!(data_dir.join("kube-apiserver.log").exists());

    drop(holder.child.stdin.take()); // end of input: the binary calls exit(0)
    let status = holder.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_all_die(&pids);
    assert!(
        !Path::new(&data_dir).exists(),
        "{} survived",
        data_dir.display()
    );
}

#[test]
fn sigkilled_test_process_takes_the_servers_along() {
    let mut holder = start_holder();
    let pids = holder.pids();
    assert_running(&pids);

    holder.child.kill().unwrap(); // SIGKILL: no Drop, no atexit; only the kernel can help
    holder.child.wait().unwrap();
    assert_all_die(&pids);
    // The data directory is left behind (the next control plane started would sweep it).
    std::fs::remove_dir_all(holder.data_dir()).unwrap();
}

//! `scripts/cluster.sh` leaves nothing behind: not after `down` (node 2 included), not after an
//! `up` that failed half-way, not when the process owning the cluster dies; and `up` on a
//! running cluster changes nothing of it (`up --nodes 2` adds node 2 beside it). "Nothing" is
//! checked by name against everything the cluster makes: processes, mounts, links, nftables
//! tables and chains, cgroups, files, and the kernel settings kubelet would change. Needs root.
//! Takes down a cluster it finds running.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use integration::cluster::{self, Cluster, STATE_DIR, TestImage};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

const BRIDGE: &str = "kvrs0";
const KUBELET_ROOT: &str = "/var/lib/kubelet";
const CGROUP_NAME: &str = "kubevirt-rs";
/// Settings kubelet sets when they differ (vm.overcommit_memory=1, kernel.panic_on_oops=1,
/// ...), and the forwarding switches a CNI gateway would flip.
const SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
];

/// What exists on the machine outside the cluster's own names, to compare before and after.
#[derive(Debug, PartialEq, Eq)]
struct Baseline {
    sysctls: BTreeMap<&'static str, String>,
    paths: BTreeMap<&'static str, bool>,
}

/// Paths the cluster may create outside its state directory (`down` removes them only if
/// `up` created them).
const OUTSIDE_PATHS: &[&str] = &[
    KUBELET_ROOT,
    "/var/log/containers",
    "/var/lib/cni",
    "/root/.kube",
    "/run/containerd",
    "/var/run/netns",
    "/opt/containerd",
    "/etc/cni",
];

fn baseline() -> Baseline {
    Baseline {
        sysctls: SYSCTLS
            .iter()
            .map(|&name| {
                let value = std::fs::read_to_string(Path::new("/proc/sys").join(name))
                    .unwrap_or_else(|e| format!("<{e}>"));
                (name, value.trim().to_owned())
            })
            .collect(),
        paths: OUTSIDE_PATHS
            .iter()
            .map(|&path| (path, Path::new(path).exists()))
            .collect(),
    }
}

/// Everything of a cluster still present, one line per thing; empty when nothing is left.
/// `extra_pids` and `extra_links` are things seen while the cluster ran.
fn leftovers(extra_pids: &[u32], extra_links: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    // Processes: any whose command line names the state directory (daemons, shims), and those
    // recorded while the cluster ran (containers, which do not name it).
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(STATE_DIR) || extra_pids.contains(&pid) {
            // A zombie waiting for its new parent is dead already.
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            if stat
                .rsplit(')')
                .next()
                .map(str::trim_start)
                .is_some_and(|s| s.starts_with('Z'))
            {
                continue;
            }
            found.push(format!("process {pid}: {cmdline}"));
        }
    }
    for line in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
    {
        let mount_point = line.split(' ').nth(4).unwrap_or_default();
        if mount_point.starts_with(STATE_DIR) || mount_point.starts_with(KUBELET_ROOT) {
            found.push(format!("mount {mount_point}"));
        }
    }
    let links = run("ip", &["-o", "link", "show"]);
    for line in links.lines() {
        let name = line.split(": ").nth(1).unwrap_or_default();
        let name = name.split('@').next().unwrap_or_default();
        if name == BRIDGE || extra_links.iter().any(|l| l == name) || line.contains(BRIDGE) {
            found.push(format!("link {name}"));
        }
    }
    let tables = run("nft", &["list", "tables"]);
    for line in tables.lines().filter(|l| l.contains("kube-proxy")) {
        found.push(format!("nftables {line}"));
    }
    let ruleset = run("nft", &["list", "ruleset"]);
    for line in ruleset.lines().filter(|l| l.contains("KUBE-")) {
        found.push(format!("nftables rule or chain: {}", line.trim()));
    }
    for entry in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let cgroup = entry.path().join(CGROUP_NAME);
        if cgroup.exists() {
            found.push(format!("cgroup {}", cgroup.display()));
        }
    }
    if Path::new(STATE_DIR).exists() {
        found.push(format!("directory {STATE_DIR}"));
    }
    if let Ok(entries) = std::fs::read_dir("/var/log/containers") {
        for entry in entries.flatten() {
            if std::fs::read_link(entry.path()).is_ok_and(|t| t.starts_with(STATE_DIR)) {
                found.push(format!("log link {}", entry.path().display()));
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/var/lib/cni/results") {
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("kubevirt-rs-")
            {
                found.push(format!("CNI result {}", entry.path().display()));
            }
        }
    }
    found
}

fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `cluster.sh` with `args` and extra environment; (success, stdout, stderr).
fn script(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let output = Command::new("bash")
        .arg(cluster::script())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("running cluster.sh");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    eprint!("{stderr}");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr,
    )
}

fn daemon_pids() -> BTreeMap<String, u32> {
    std::fs::read_dir(Path::new(STATE_DIR).join("pids"))
        .expect("the cluster's pid files")
        .flatten()
        .map(|entry| {
            let pid = std::fs::read_to_string(entry.path()).unwrap();
            (
                entry.file_name().to_string_lossy().into_owned(),
                pid.trim().parse().unwrap(),
            )
        })
        .collect()
}

fn assert_nothing_left(when: &str, before: &Baseline, pids: &[u32], links: &[String]) {
    let left = leftovers(pids, links);
    assert!(left.is_empty(), "{when}, still there:\n{}", left.join("\n"));
    assert_eq!(
        &baseline(),
        before,
        "{when}: settings and paths outside the cluster changed"
    );
}

/// A pod that keeps running with an image volume: it gives the cluster mounts (root file
/// systems, the image volume, the service-account token), a network namespace and a veth.
async fn start_busy_pod(cluster: &Cluster) -> Vec<u32> {
    let box_image = TestImage::new("localhost/kubevirt-rs-test/lifecycle-box:1")
        .with_busybox()
        .unwrap();
    let data_image =
        TestImage::new("localhost/kubevirt-rs-test/lifecycle-data:1").file("/d/f", "x", 0o644);
    cluster.import_test_image(&box_image).unwrap();
    cluster.import_test_image(&data_image).unwrap();
    let ns = cluster.create_namespace("lifecycle").await.unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "busy"},
        "spec": {
            "containers": [{
                "name": "main",
                "image": box_image.name(),
                "imagePullPolicy": "Never",
                "command": ["/bin/busybox", "sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "image": {"reference": data_image.name()}}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(cluster.client().unwrap(), &ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    cluster
        .wait_for_pod_running(&ns, "busy", Duration::from_secs(180))
        .await
        .unwrap();
    // The container's processes (in the pod's cgroup, named nowhere else).
    let mut pids = Vec::new();
    let kubepods = Path::new("/sys/fs/cgroup/pids")
        .join(CGROUP_NAME)
        .join("kubepods");
    let mut dirs = vec![kubepods];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                dirs.push(entry.path());
            } else if entry.file_name() == "cgroup.procs" {
                let procs = std::fs::read_to_string(entry.path()).unwrap_or_default();
                pids.extend(procs.lines().filter_map(|l| l.parse::<u32>().ok()));
            }
        }
    }
    assert!(!pids.is_empty(), "no process in the pods' cgroups");
    pids
}

#[test]
fn cluster_sh_removes_everything_it_made() {
    let runtime = tokio::runtime::Runtime::new().unwrap();

    // A clean start, and what the machine looks like without a cluster.
    cluster::down().expect("cluster.sh down (nothing running)");
    let before = baseline();
    assert_nothing_left("before the test", &before, &[], &[]);

    // An `up` that fails after etcd, the apiserver, the controllers and containerd started:
    // the sandbox image archive is not an archive.
    let garbage = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(garbage.path(), b"not an OCI archive").unwrap();
    let (ok, _, stderr) = script(
        &["up"],
        &[(
            "KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE",
            garbage.path().to_str().unwrap(),
        )],
    );
    assert!(!ok, "up with a broken sandbox image must fail");
    assert!(stderr.contains("starting containerd"), "{stderr}");
    assert!(stderr.contains("up failed: cleaning up"), "{stderr}");
    assert_nothing_left("after a failed up", &before, &[], &[]);

    // A running cluster with a pod is seen by every check (the checks can fail).
    let cluster = runtime.block_on(Cluster::up()).expect("cluster.sh up");
    let container_pids = runtime.block_on(start_busy_pod(&cluster));
    let daemons = daemon_pids();
    let veths: Vec<String> = run("ip", &["-o", "link", "show", "master", BRIDGE])
        .lines()
        .filter_map(|l| l.split(": ").nth(1)?.split('@').next().map(str::to_owned))
        .collect();
    assert!(!veths.is_empty(), "the pod's veth is on {BRIDGE}");
    let mut seen_pids: Vec<u32> = daemons.values().copied().collect();
    seen_pids.extend(&container_pids);
    let running = leftovers(&seen_pids, &veths).join("\n");
    for expected in [
        "process",
        "mount /var/lib/kubevirt-rs-cluster/containerd/state",
        "mount /var/lib/kubelet",
        "link kvrs0",
        "nftables table ip kube-proxy",
        "cgroup /sys/fs/cgroup/pids/kubevirt-rs",
        "directory /var/lib/kubevirt-rs-cluster",
    ] {
        assert!(
            running.contains(expected),
            "while up, `{expected}` is seen:\n{running}"
        );
    }
    for veth in &veths {
        assert!(running.contains(&format!("link {veth}")), "{running}");
    }
    for pid in &container_pids {
        assert!(running.contains(&format!("process {pid}:")), "{running}");
    }
    assert_eq!(
        baseline().sysctls,
        before.sysctls,
        "kubelet changed the machine's kernel settings"
    );

    // `up --nodes 2` on it: node 2 joins (its sandbox image copied from node 1's containerd),
    // nothing of node 1 restarts, and the checks see node 2's traces too.
    let again = Instant::now();
    let (ok, stdout, _) = script(
        &[
            "up",
            "--nodes",
            "2",
            "--owner-pid",
            &std::process::id().to_string(),
        ],
        &[],
    );
    assert!(ok, "a second up succeeds");
    assert!(stdout.contains("KUBECONFIG="), "{stdout}");
    assert!(again.elapsed() < Duration::from_secs(60));
    for daemon in ["kubelet", "containerd", "kube-apiserver"] {
        assert_eq!(daemon_pids().get(daemon), daemons.get(daemon), "{daemon}");
    }
    let node2_daemons: Vec<u32> = daemon_pids()
        .into_iter()
        .filter(|(name, _)| name.starts_with("node-2-"))
        .map(|(_, pid)| pid)
        .collect();
    assert_eq!(
        node2_daemons.len(),
        3,
        "node 2's containerd, kubelet, kube-proxy"
    );
    seen_pids.extend(&node2_daemons);
    let mut links = veths.clone();
    links.push("kvrs0-node2".to_owned());
    let running = leftovers(&seen_pids, &links).join("\n");
    for expected in [
        "link kvrs0-node2",
        "mount /var/lib/kubevirt-rs-cluster/node-2/ns/net",
        "mount /var/lib/kubevirt-rs-cluster/node-2/ns/mnt",
    ] {
        assert!(
            running.contains(expected),
            "with node 2, `{expected}` is seen:\n{running}"
        );
    }

    cluster::down().expect("cluster.sh down");
    assert_nothing_left("after down", &before, &seen_pids, &links);
    cluster::down().expect("cluster.sh down when nothing runs");

    // The owner dies (as a SIGKILLed test binary would): the watchdog takes the cluster down.
    let mut owner = Command::new("sleep").arg("600").spawn().unwrap();
    let owner_pid = owner.id().to_string();
    // The sandbox image of the tests' dev build (without it, cluster.sh would make a release
    // build of every program for that one image).
    let pause = cluster::project_images()
        .expect("images/build.sh --profile dev")
        .archive("pause");
    let (ok, _, _) = script(
        &["up", "--owner-pid", &owner_pid],
        &[("KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE", pause.to_str().unwrap())],
    );
    assert!(ok, "up --owner-pid");
    let daemons: Vec<u32> = daemon_pids().values().copied().collect();
    owner.kill().unwrap();
    owner.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = leftovers(&daemons, &[]);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "120 s after its owner died, still there:\n{}",
            left.join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_nothing_left("after the owner died", &before, &daemons, &[]);
}

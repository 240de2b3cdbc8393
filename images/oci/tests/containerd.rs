//! The archives as containerd sees them: the project's image specs, built with stand-in files,
//! are imported with `ctr images import` into a private containerd (its own root, state and
//! socket; stopped at the end), and the unpacked layer on disk is compared with the spec:
//! contents, modes, owners, the `/var/run` link and the monitor's file capability.
//!
//! Needs root and containerd (`scripts/setup.sh` installs Debian's, 1.6); fails, never skips,
//! without them.

use oci_image::ImageSpec;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SPECS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../specs");
const NAMESPACE: &str = "k8s.io";

fn tool(name: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"])
        .map(|dir| PathBuf::from(dir).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not installed (scripts/setup.sh installs it)"))
}

/// containerd and ctr as the test cluster runs them: built from containerd's Go module by
/// `integration/controlplane/build.sh` (cached; the first call builds), so the import is the
/// one `scripts/cluster.sh` will do, and no second containerd is installed on the machine.
fn built(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .find(|d| d.join("Cargo.lock").exists())
            .expect("the workspace root")
            .join("integration/controlplane/build.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .expect("run integration/controlplane/build.sh");
        assert!(
            out.status.success(),
            "{} failed: the containerd build is needed",
            script.display()
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    });
    let path = dir.join(name);
    assert!(path.is_file(), "{} is missing", path.display());
    path
}

/// A containerd of this test only, stopped (and waited for) when dropped.
struct Containerd {
    child: Child,
    socket: PathBuf,
    root: PathBuf,
}

impl Containerd {
    fn start(dir: &Path) -> Self {
        assert!(
            nix_is_root(),
            "containerd needs root (it mounts and sets owners)"
        );
        let root = dir.join("root");
        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        // Version 2 configuration (containerd 2.x migrates it). The CRI plugin
        // is off (it would watch the host's CNI directory); every path is under `dir`.
        std::fs::write(
            &config,
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"#,
                root = root.display(),
                state = dir.join("state").display(),
                socket = socket.display(),
                opt = dir.join("opt").display(),
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new(built("containerd"))
            .arg("--config")
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("containerd");
        let containerd = Self {
            child,
            socket,
            root,
        };
        let start = Instant::now();
        loop {
            if containerd.socket.exists() && containerd.ctr(&["version"]).status.success() {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "containerd did not come up: {}",
                std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        containerd
    }

    fn ctr(&self, args: &[&str]) -> std::process::Output {
        Command::new(built("ctr"))
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", NAMESPACE])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("ctr")
    }

    /// The unpacked directories of every committed overlayfs snapshot (`…/snapshots/<n>/fs`).
    fn snapshot_dirs(&self) -> Vec<PathBuf> {
        let snapshots = self
            .root
            .join("io.containerd.snapshotter.v1.overlayfs/snapshots");
        std::fs::read_dir(&snapshots)
            .unwrap_or_else(|e| panic!("{}: {e}", snapshots.display()))
            .map(|e| e.unwrap().path().join("fs"))
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        // SAFETY: signalling the containerd this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Builds `images/specs/<name>.yaml` with a stand-in for each `from:` file (its own name as
/// content) into `dir/<name>.tar`.
fn build(name: &str, dir: &Path) -> (ImageSpec, oci_image::Summary, PathBuf) {
    let text = std::fs::read_to_string(format!("{SPECS}/{name}.yaml")).unwrap();
    let spec = ImageSpec::from_yaml(&text).unwrap();
    let sources = dir.join(format!("{name}-sources"));
    std::fs::create_dir_all(&sources).unwrap();
    for entry in &spec.entries {
        if let Some(from) = &entry.from {
            std::fs::write(sources.join(from), format!("stand-in for {from}\n")).unwrap();
        }
    }
    let archive = dir.join(format!("{name}.tar"));
    let summary = oci_image::build(&spec, &sources, &archive).unwrap();
    (spec, summary, archive)
}

/// The snapshot directory holding `marker` (each image here has one layer, so one snapshot).
fn unpacked(containerd: &Containerd, marker: &str) -> PathBuf {
    let found: Vec<PathBuf> = containerd
        .snapshot_dirs()
        .into_iter()
        .filter(|fs| fs.join(marker).symlink_metadata().is_ok())
        .collect();
    assert_eq!(found.len(), 1, "one snapshot holds {marker}: {found:?}");
    found.into_iter().next().unwrap()
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    // Negative: the attribute is missing (or the call failed).
    usize::try_from(n).ok().map(|n| {
        buf.truncate(n);
        buf
    })
}

#[test]
fn ctr_imports_the_images_and_unpacks_files_owners_links_and_capabilities() {
    let dir = tempfile::Builder::new()
        .prefix("oci-ctr-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let containerd = Containerd::start(dir.path());
    let version = containerd.ctr(&["version"]);
    eprintln!("{}", String::from_utf8_lossy(&version.stdout));

    let mut imported = Vec::new();
    for name in ["virt-launcher", "test-disk"] {
        let (spec, summary, archive) = build(name, dir.path());
        let out = containerd.ctr(&["images", "import", archive.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "ctr images import {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        imported.push((spec, summary));
    }

    // Both are listed under their full names, with the manifest digest the builder reported.
    let list = containerd.ctr(&["images", "ls"]);
    let list = String::from_utf8_lossy(&list.stdout);
    for (spec, summary) in &imported {
        let line = list
            .lines()
            .find(|l| l.split_whitespace().next() == Some(spec.name.as_str()))
            .unwrap_or_else(|| panic!("{} is not listed:\n{list}", spec.name));
        assert!(line.contains(&summary.manifest_digest), "{line}");
    }

    // The launcher image, unpacked.
    let root = unpacked(&containerd, "usr/bin/virt-launcher-monitor");
    let monitor = root.join("usr/bin/virt-launcher-monitor");
    assert_eq!(
        std::fs::read_to_string(&monitor).unwrap(),
        "stand-in for virt-launcher-monitor\n"
    );
    let meta = std::fs::metadata(&monitor).unwrap();
    assert_eq!(
        (meta.permissions().mode() & 0o7777, meta.uid(), meta.gid()),
        (0o755, 0, 0)
    );
    let getcap = Command::new(tool("getcap")).arg(&monitor).output().unwrap();
    let getcap = String::from_utf8_lossy(&getcap.stdout);
    assert!(
        getcap.trim_end().ends_with("cap_net_bind_service=ep"),
        "the monitor's file capability survived unpacking: getcap says {getcap:?}"
    );
    assert!(
        xattr(&root.join("usr/bin/virt-launcher"), "security.capability").is_none(),
        "only the monitor has a capability"
    );
    assert_eq!(
        std::fs::read_link(root.join("var/run")).unwrap(),
        Path::new("../run")
    );
    assert!(root.join("run").is_dir());
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(
        passwd.lines().any(|l| l.starts_with("qemu:x:107:107:")),
        "{passwd}"
    );
    for tool in ["virt-launcher", "virt-tail", "container-disk"] {
        let meta = std::fs::metadata(root.join("usr/bin").join(tool)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o755, "{tool}");
    }

    // The container disk: /disk and the image owned by qemu, read-only.
    let root = unpacked(&containerd, "disk/disk.img");
    for (path, mode) in [("disk", 0o755), ("disk/disk.img", 0o440)] {
        let meta = std::fs::metadata(root.join(path)).unwrap();
        assert_eq!(
            (meta.permissions().mode() & 0o7777, meta.uid(), meta.gid()),
            (mode, 107, 107),
            "{path}"
        );
    }
}

//! A real Kubernetes cluster for tests: `scripts/cluster.sh` runs etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, containerd, kubelet and kube-proxy on this machine
//! (as root), and this module brings it up once per test binary. One node by default;
//! [`shared_with_nodes`]`(2)` adds a second node ([`NODE2_NAME`]) in network and mount
//! namespaces of its own, for tests that need a pod really elsewhere (live migration).
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use integration::cluster::{self, TestImage};
//! let cluster = cluster::shared().await?;               // up once per test binary
//! let ns = cluster.create_namespace("my-test").await?;  // deleted when the binary exits
//! let image = TestImage::new("localhost/kubevirt-rs-test/box:1").with_busybox()?;
//! cluster.import_test_image(&image)?;                   // into containerd's k8s.io namespace
//! let client = cluster.client()?;                       // a fresh kube::Client
//! # Ok(()) }
//! ```
//!
//! The cluster outlives no test binary that brought it up: the script's watchdog takes it down
//! once its owners (`up --owner-pid`) have all exited, however they exit (also SIGKILL). A
//! cluster already up is reused (and kept if it was brought up by hand), node 2 included if it
//! has one: the scheduler may then put a pod that names no node on either node, and images are
//! imported into both.

pub mod box_pod;
pub mod kubevirt;
mod project_images;
mod test_image;

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{Condition, await_condition};

pub use project_images::{PROJECT_IMAGES, ProjectImages, project_images};
pub use test_image::{HOST_BUSYBOX, TestImage};

/// The node's name (fixed in `scripts/cluster.sh`).
pub const NODE_NAME: &str = "kubevirt-rs-node";
/// The node's address, on the pods' bridge: the apiserver (port 6443) and the kubelet listen
/// there, and it is the pods' default gateway.
pub const NODE_IP: &str = "10.217.0.1";
/// The pods' network.
pub const POD_CIDR: &str = "10.217.0.0/16";
/// The second node's name (`cluster.sh up --nodes 2`, [`shared_with_nodes`]).
pub const NODE2_NAME: &str = "kubevirt-rs-node-2";
/// The second node's address, on its pods' bridge in its own network namespace: its kubelet
/// listens there, and it is its pods' default gateway. Routed to and from [`NODE_IP`].
pub const NODE2_IP: &str = "10.218.0.1";
/// The second node's pods' network.
pub const NODE2_POD_CIDR: &str = "10.218.0.0/16";
/// Where the script keeps all of the cluster's state.
pub const STATE_DIR: &str = "/var/lib/kubevirt-rs-cluster";
/// Node 2's files, inside [`STATE_DIR`]: its containerd (`containerd.sock`), and the
/// directories its mount namespace shows at the node paths: `kubelet` at `/var/lib/kubelet`,
/// `run` at `/run` (so `/var/run/kubevirt` and `/var/run/kubevirt-private`), `log-containers`
/// at `/var/log/containers`, `cni-cache` at `/var/lib/cni`.
pub const NODE2_STATE_DIR: &str = "/var/lib/kubevirt-rs-cluster/node-2";
/// Node 2's network namespace (a bind mount of its nsfs file), for `nsenter --net=`.
pub const NODE2_NETNS: &str = "/var/lib/kubevirt-rs-cluster/node-2/ns/net";
/// Node 2's mount namespace (a bind mount of its nsfs file), for `nsenter --mount=`.
pub const NODE2_MOUNT_NS: &str = "/var/lib/kubevirt-rs-cluster/node-2/ns/mnt";
/// The sandbox image the script imports (built by `images/build.sh pause`).
pub const PAUSE_IMAGE: &str = "localhost/kubevirt-rs/pause:3.10";
/// The label on namespaces made by [`Cluster::create_namespace`]: the test process's pid.
pub const NAMESPACE_OWNER_LABEL: &str = "integration.kubevirt-rs.io/owner-pid";

/// `scripts/cluster.sh` in this checkout.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster.sh")
}

/// The running cluster, as `cluster.sh up` described it.
#[derive(Debug)]
pub struct Cluster {
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    virtctl: PathBuf,
    ctr: PathBuf,
    config: kube::Config,
}

/// The cluster shared by all tests of this test binary: brought up (or reused) on first use,
/// owned by this process. Its namespaces from [`Cluster::create_namespace`] are deleted when the
/// process exits; the cluster itself goes down a few seconds later unless another test process
/// took it over (`cluster.sh up --owner-pid`).
pub async fn shared() -> Result<&'static Cluster> {
    static SHARED: tokio::sync::OnceCell<Cluster> = tokio::sync::OnceCell::const_new();
    SHARED.get_or_try_init(Cluster::up).await
}

/// [`shared`] with at least `nodes` nodes (1 or 2). With 2, node 2 ([`NODE2_NAME`]) is added to
/// the cluster if it has only node 1 (`cluster.sh up --nodes 2`: node 1 and the control plane
/// keep running, so a cluster [`shared`] brought up goes on), and the images this process
/// imported before are imported into node 2 too. Both nodes are Ready and schedulable: pin pods
/// with a `kubernetes.io/hostname` node selector where it matters.
pub async fn shared_with_nodes(nodes: usize) -> Result<&'static Cluster> {
    static SHARED_TWO: tokio::sync::OnceCell<Cluster> = tokio::sync::OnceCell::const_new();
    match nodes {
        1 => shared().await,
        2 => {
            SHARED_TWO
                .get_or_try_init(|| Cluster::up_with_nodes(2))
                .await
        }
        _ => bail!("the test cluster has one or two nodes, not {nodes}"),
    }
}

impl Cluster {
    /// Runs `cluster.sh up --owner-pid <this process>` and loads the admin kubeconfig. The
    /// script's progress goes to stderr; the first start builds the binaries (long, cached).
    /// The sandbox image comes from [`project_images`] (the tests' dev build; without it the
    /// script would make a release build of every program for that one image).
    pub async fn up() -> Result<Self> {
        Self::up_with_nodes(1).await
    }

    /// [`Self::up`] with at least `nodes` nodes (1 or 2: `cluster.sh up --nodes 2`); see
    /// [`shared_with_nodes`]. With 2, the images this process imported before (into node 1
    /// only, if node 2 was not there yet) are imported into node 2.
    pub async fn up_with_nodes(nodes: usize) -> Result<Self> {
        if !(1..=2).contains(&nodes) {
            bail!("the test cluster has one or two nodes, not {nodes}");
        }
        let output = tokio::task::spawn_blocking(move || {
            let images = project_images()?;
            let mut args = vec!["up".to_owned()];
            if nodes > 1 {
                args.extend(["--nodes".to_owned(), nodes.to_string()]);
            }
            args.extend(["--owner-pid".to_owned(), std::process::id().to_string()]);
            run_script_with(
                &args,
                &[(
                    "KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE",
                    images.archive("pause").into_os_string(),
                )],
            )
        })
        .await
        .context("the cluster.sh task panicked")??;
        let value = |key: &str| {
            output
                .lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
                .map(PathBuf::from)
                .ok_or_else(|| {
                    anyhow!("cluster.sh up printed no {key}= line; it printed:\n{output}")
                })
        };
        let kubeconfig = value("KUBECONFIG")?;
        let kubectl = value("KUBECTL")?;
        let virtctl = value("VIRTCTL")?;
        let ctr = kubectl.with_file_name("ctr");
        let config = Kubeconfig::read_from(&kubeconfig)
            .with_context(|| format!("reading {}", kubeconfig.display()))?;
        let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
            .await
            .with_context(|| format!("loading {}", kubeconfig.display()))?;
        let cluster = Self {
            kubeconfig,
            kubectl,
            virtctl,
            ctr,
            config,
        };
        if nodes < 2 {
            return Ok(cluster);
        }
        tokio::task::spawn_blocking(move || {
            cluster.import_earlier_images_into_node2()?;
            Ok(cluster)
        })
        .await
        .context("the image import task panicked")?
    }

    /// Whether the cluster has node 2 now (its containerd's socket exists).
    pub fn has_node2(&self) -> bool {
        node2_containerd_socket().exists()
    }

    /// `nsenter --net=<node 2's netns> --mount=<node 2's mount namespace> -- <program>`: a
    /// command that sees node 2's network and node paths (`/var/lib/kubelet`, `/run`, ...).
    pub fn node2_command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={NODE2_NETNS}"))
            .arg(format!("--mount={NODE2_MOUNT_NS}"))
            .arg("--")
            .arg(program);
        command
    }

    /// A new cluster-admin client (one per call: a client belongs to the Tokio runtime it was
    /// first used in, and each `#[tokio::test]` has its own).
    pub fn client(&self) -> Result<kube::Client> {
        kube::Client::try_from(self.config.clone()).context("building a kube client")
    }

    /// The client configuration (server URL, CA, token).
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// The admin kubeconfig (cluster-admin), for kubectl and other processes.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubectl binary (same release as the cluster).
    pub fn kubectl_path(&self) -> &Path {
        &self.kubectl
    }

    /// KubeVirt v1.9.0's virtctl (integration/controlplane/build.sh).
    pub fn virtctl_path(&self) -> &Path {
        &self.virtctl
    }

    /// `kubectl --kubeconfig <admin kubeconfig>`, ready for arguments. Its discovery cache
    /// is kept in the cluster's state directory (not `~/.kube`), so it goes with the cluster.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(&self.kubectl);
        command
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(Path::new(STATE_DIR).join("kubectl-cache"));
        command
    }

    /// virtctl as the cluster's admin (`--kubeconfig`; a command may add `--token` to act as
    /// someone else).
    pub fn virtctl(&self) -> Command {
        let mut command = Command::new(&self.virtctl);
        command.arg("--kubeconfig").arg(&self.kubeconfig);
        command
    }

    /// Runs kubectl with `args`; its stdout, or an error with its stderr.
    pub fn kubectl_output(&self, args: &[&str]) -> Result<String> {
        let output = self
            .kubectl()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running kubectl {}", args.join(" ")))?;
        checked_stdout(&format!("kubectl {}", args.join(" ")), output)
    }

    /// Imports an OCI (or Docker) image archive into containerd's `k8s.io` namespace, unpacked
    /// for the CRI's snapshotter: pods can then use its images with `imagePullPolicy:
    /// IfNotPresent` or `Never`, and image volumes can mount them. Into every node's containerd
    /// (node 2's too, when the cluster has it); remembered, so that node 2 added later by
    /// [`shared_with_nodes`] gets it too (the archive must still be there then).
    pub fn import_image(&self, archive: &Path) -> Result<()> {
        self.import_into_nodes(Imported::Archive(archive.to_owned()), archive)
    }

    /// Imports `archive` (the archive of `image`) into node 1's containerd and, if the cluster
    /// has node 2, into node 2's; remembers `image` for [`Self::import_earlier_images_into_node2`].
    fn import_into_nodes(&self, image: Imported, archive: &Path) -> Result<()> {
        let node2 = self.has_node2();
        lock_imported().push((image, node2));
        self.import_archive_at(&Path::new(STATE_DIR).join("containerd.sock"), archive)?;
        if node2 {
            self.import_archive_at(&node2_containerd_socket(), archive)
                .context("into node 2's containerd")?;
        }
        Ok(())
    }

    fn import_archive_at(&self, socket: &Path, archive: &Path) -> Result<()> {
        let output = Command::new(&self.ctr)
            .arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .args(["--snapshotter", "overlayfs"])
            .arg(archive)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", self.ctr.display()))?;
        checked_stdout(
            &format!(
                "ctr --address {} images import {}",
                socket.display(),
                archive.display()
            ),
            output,
        )?;
        Ok(())
    }

    /// Imports every image of [`project_images`] (building them first if this process has
    /// not): the controller, handler and launcher images, the test guest and its disk.
    pub fn import_project_images(&self) -> Result<ProjectImages> {
        let images = project_images()?;
        for name in PROJECT_IMAGES {
            self.import_image(&images.archive(name))
                .with_context(|| format!("importing the {name} image"))?;
        }
        Ok(images)
    }

    /// Imports into node 2 what this process imported before while the cluster had node 1 alone.
    fn import_earlier_images_into_node2(&self) -> Result<()> {
        let socket = node2_containerd_socket();
        let mut imported = lock_imported();
        for (image, into_node2) in imported.iter_mut().filter(|(_, done)| !*done) {
            match image {
                Imported::Archive(archive) => {
                    self.import_archive_at(&socket, archive).with_context(|| {
                        format!(
                            "importing {} (imported into node 1 before) into node 2",
                            archive.display()
                        )
                    })?;
                }
                Imported::Test(image) => {
                    let dir = tempfile::tempdir().context("creating a temporary directory")?;
                    let archive = dir.path().join("image.tar");
                    image.write_archive(&archive)?;
                    self.import_archive_at(&socket, &archive)
                        .with_context(|| format!("importing {} into node 2", image.name()))?;
                }
            }
            *into_node2 = true;
        }
        Ok(())
    }

    /// Writes `image` to a temporary archive and imports it ([`Self::import_image`]).
    pub fn import_test_image(&self, image: &TestImage) -> Result<()> {
        let dir = tempfile::tempdir().context("creating a temporary directory")?;
        let archive = dir.path().join("image.tar");
        image.write_archive(&archive)?;
        self.import_into_nodes(Imported::Test(image.clone()), &archive)
            .with_context(|| format!("importing {}", image.name()))
    }

    /// Creates a namespace named `<prefix>-<random>`, labelled with this process's pid, and
    /// returns its name. Such namespaces are deleted when the process exits.
    pub async fn create_namespace(&self, prefix: &str) -> Result<String> {
        register_namespace_cleanup(&self.kubectl, &self.kubeconfig);
        let api: Api<Namespace> = Api::all(self.client()?);
        let namespace = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                labels: Some(
                    [(
                        NAMESPACE_OWNER_LABEL.to_owned(),
                        std::process::id().to_string(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let created = api
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating a namespace for {prefix}"))?;
        let name = created
            .metadata
            .name
            .ok_or_else(|| anyhow!("the apiserver returned a namespace without a name"))?;
        // Pods are refused until the service-account controller made `default` here.
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client()?, &name);
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(accounts, "default", |sa: Option<&_>| sa.is_some()),
        )
        .await
        .with_context(|| format!("no service account `default` in {name} after 60 s"))??;
        Ok(name)
    }

    /// Waits until pod `name` in `namespace` has ended and returns it; an error (with the
    /// pod's status) if it failed or `timeout` passed.
    pub async fn wait_for_pod_completion(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Pod> {
        let pod = self
            .wait_for_pod(namespace, name, timeout, |pod: Option<&Pod>| {
                matches!(pod_phase(pod), Some("Succeeded" | "Failed"))
            })
            .await?;
        if pod_phase(Some(&pod)) != Some("Succeeded") {
            bail!(
                "pod {namespace}/{name} failed: {}",
                serde_json::to_string(&pod.status).unwrap_or_default()
            );
        }
        Ok(pod)
    }

    /// Waits until pod `name` in `namespace` is Running with every container ready.
    pub async fn wait_for_pod_running(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Pod> {
        self.wait_for_pod(namespace, name, timeout, |pod: Option<&Pod>| {
            pod_phase(pod) == Some("Running")
                && pod
                    .and_then(|p| p.status.as_ref()?.container_statuses.as_ref())
                    .is_some_and(|statuses| statuses.iter().all(|s| s.ready))
        })
        .await
    }

    async fn wait_for_pod(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
        condition: impl Condition<Pod>,
    ) -> Result<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client()?, namespace);
        match tokio::time::timeout(timeout, await_condition(api.clone(), name, condition)).await {
            Ok(Ok(Some(pod))) => Ok(pod),
            Ok(Ok(None)) => bail!("pod {namespace}/{name} was deleted"),
            Ok(Err(e)) => Err(e).with_context(|| format!("watching pod {namespace}/{name}")),
            Err(_) => {
                let status = api
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|pod| serde_json::to_string(&pod.status).ok())
                    .unwrap_or_else(|| "<not found>".to_owned());
                bail!(
                    "pod {namespace}/{name}: condition not met within {timeout:?}; status: {status}"
                )
            }
        }
    }
}

fn pod_phase(pod: Option<&Pod>) -> Option<&str> {
    pod?.status.as_ref()?.phase.as_deref()
}

fn node2_containerd_socket() -> PathBuf {
    Path::new(NODE2_STATE_DIR).join("containerd.sock")
}

/// An image this process imported, to import into node 2 when node 2 comes later.
#[derive(Debug, Clone)]
enum Imported {
    Archive(PathBuf),
    Test(TestImage),
}

/// This process's imports, each with whether node 2 has it.
static IMPORTED: Mutex<Vec<(Imported, bool)>> = Mutex::new(Vec::new());

fn lock_imported() -> std::sync::MutexGuard<'static, Vec<(Imported, bool)>> {
    IMPORTED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `cluster.sh down`: removes everything the cluster made (see the script).
pub fn down() -> Result<()> {
    run_script(&["down".to_owned()]).map(drop)
}

/// Runs `cluster.sh restart-kubelet`: the kubelet stops and starts again (pods keep running;
/// device plugins must register again).
pub fn restart_kubelet() -> Result<()> {
    run_script(&["restart-kubelet".to_owned()]).map(drop)
}

/// Runs the script with `args` (stderr passed through, for its progress); its stdout.
fn run_script(args: &[String]) -> Result<String> {
    run_script_with(args, &[])
}

/// [`run_script`] with extra environment variables.
fn run_script_with(args: &[String], env: &[(&str, OsString)]) -> Result<String> {
    let script = script();
    let hint = format!(
        "the test cluster could not be brought up; try `sudo bash {} up` (needs root, Go >= 1.26 \
         and the Go module proxy for the first build, Debian's runc and containernetworking-plugins \
         from scripts/setup.sh, and images/build.sh for the sandbox image); its logs are in \
         {STATE_DIR}/log while it runs",
        script.display()
    );
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "cluster.sh {} exited with {}: {hint}",
            args.join(" "),
            output.status
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn checked_stdout(what: &str, output: Output) -> Result<String> {
    if !output.status.success() {
        bail!(
            "{what} exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

// ---- deleting this process's namespaces at exit ------------------------------------------

static NAMESPACE_CLEANUP: Mutex<Option<(PathBuf, PathBuf)>> = Mutex::new(None);

fn register_namespace_cleanup(kubectl: &Path, kubeconfig: &Path) {
    let mut cleanup = NAMESPACE_CLEANUP
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if cleanup.is_none() {
        // SAFETY: registers a plain `extern "C" fn()`; if it fails, only the clean-up is lost
        // (and the cluster's own teardown removes the namespaces with it).
        unsafe {
            libc::atexit(delete_namespaces_at_exit);
        }
    }
    *cleanup = Some((kubectl.to_owned(), kubeconfig.to_owned()));
}

extern "C" fn delete_namespaces_at_exit() {
    let Ok(cleanup) = NAMESPACE_CLEANUP.try_lock() else {
        return;
    };
    let Some((kubectl, kubeconfig)) = cleanup.as_ref() else {
        return;
    };
    if !kubeconfig.exists() {
        return; // the cluster is down already, and its namespaces with it
    }
    // --wait=false: the namespace controller finishes the job; the process does not wait.
    let result = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(Path::new(STATE_DIR).join("kubectl-cache"))
        .args(["delete", "namespace", "--wait=false", "--ignore-not-found"])
        .arg(format!(
            "--selector={NAMESPACE_OWNER_LABEL}={}",
            std::process::id()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    if let Ok(output) = result
        && !output.status.success()
    {
        let _ = writeln!(
            std::io::stderr(),
            "deleting the test namespaces failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
}

//! A real Kubernetes control plane for tests: etcd + kube-apiserver (+ kube-controller-manager
//! for garbage collection and namespace deletion), built from Go modules by
//! `integration/controlplane/build.sh` and run on free loopback ports.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let cp = integration::controlplane::shared().await?; // one per test binary
//! let ns = cp.create_namespace("my-test").await?;      // isolate each test
//! let client = cp.client()?;                           // a fresh kube::Client
//! # Ok(()) }
//! ```
//!
//! The apiserver runs with the flags envtest (controller-runtime) uses: RBAC, the ServiceAccount
//! admission plugin disabled, a service cluster IP range, privileged pods allowed, and
//! service-account signing keys. The client authenticates with a static token in the
//! `system:masters` group (cluster-admin).

mod binaries;
mod crds;
mod pki;
mod process;

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use binaries::{BIN_DIR_ENV, Binaries, build_script};
pub use crds::{generated_kubevirt_crd_dir, kubevirt_crds, parse_crd_manifests};
use pki::Pki;
use process::ManagedProcess;

/// Set to `1` to keep the data directory (logs, etcd data, certificates) after the run.
pub const KEEP_DATA_ENV: &str = "KUBEVIRT_RS_CONTROLPLANE_KEEP";

/// How to start a [`ControlPlane`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Also run kube-controller-manager (garbage collector and namespace controllers).
    pub controller_manager: bool,
    /// CRDs installed (and Established) before `start` returns and before the controller
    /// manager starts, so its garbage collector watches them from the beginning.
    pub crds: Vec<CustomResourceDefinition>,
    /// Limit for the apiserver to become ready and for each CRD to be Established.
    pub ready_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            controller_manager: false,
            crds: Vec::new(),
            // Generous: the CI machines are small and shared.
            ready_timeout: Duration::from_secs(120),
        }
    }
}

/// A running control plane. Dropping it kills the processes and removes the data directory.
pub struct ControlPlane {
    processes: Mutex<Vec<ManagedProcess>>,
    data_dir: PathBuf,
    data_dir_cleanup: u64,
    kubeconfig_path: PathBuf,
    config: kube::Config,
    apiserver_url: String,
    startup_time: Duration,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("apiserver_url", &self.apiserver_url)
            .field("data_dir", &self.data_dir)
            .field("startup_time", &self.startup_time)
            .finish_non_exhaustive()
    }
}

/// The control plane shared by all tests of this test binary: controller manager on, the
/// kubevirt.io CRDs ([`kubevirt_crds`]) installed. It lives until the process exits (then an
/// at-exit handler stops it). Give each test its own namespace ([`ControlPlane::create_namespace`]).
pub async fn shared() -> Result<&'static ControlPlane> {
    static SHARED: tokio::sync::OnceCell<ControlPlane> = tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_try_init(|| async {
            ControlPlane::start(Options {
                controller_manager: true,
                crds: kubevirt_crds()?,
                ..Options::default()
            })
            .await
        })
        .await
}

impl ControlPlane {
    /// Builds (or reuses) the binaries, starts etcd and kube-apiserver, waits for `/readyz`,
    /// installs `options.crds` and, if asked, starts kube-controller-manager.
    ///
    /// Must be called inside a Tokio runtime. Ports are picked free, but another process may
    /// take one between the pick and the bind; such a clash is retried with new ports.
    pub async fn start(options: Options) -> Result<Self> {
        let binaries = tokio::task::spawn_blocking(Binaries::locate)
            .await
            .context("the binary lookup task panicked")??;
        const ATTEMPTS: u32 = 3;
        let mut attempt = 1;
        loop {
            match Self::start_once(&binaries, &options).await {
                Ok(control_plane) => return Ok(control_plane),
                Err(e)
                    if attempt < ATTEMPTS
                        && format!("{e:#}").contains("address already in use") =>
                {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn start_once(binaries: &Binaries, options: &Options) -> Result<Self> {
        let started = Instant::now();
        let data_dir = create_data_dir()?;
        let data_dir_cleanup = process::remove_directory_at_exit(&data_dir);
        let [etcd_client_port, etcd_peer_port, apiserver_port] = free_loopback_ports()?;
        let apiserver_url = format!("https://127.0.0.1:{apiserver_port}");

        let files = write_config_files(&data_dir, &apiserver_url)?;
        let config =
            Kubeconfig::read_from(&files.kubeconfig).context("reading the generated kubeconfig")?;
        let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
            .await
            .context("loading the generated kubeconfig")?;

        // From here on, dropping `control_plane` (also on `?`) stops whatever was started.
        let mut control_plane = Self {
            processes: Mutex::new(Vec::new()),
            kubeconfig_path: files.kubeconfig.clone(),
            data_dir,
            data_dir_cleanup,
            config,
            apiserver_url,
            startup_time: Duration::ZERO,
        };
        let dir = &control_plane.data_dir;

        let etcd_client_url = format!("http://127.0.0.1:{etcd_client_port}");
        let etcd_peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        let mut etcd = Command::new(&binaries.etcd);
        etcd.args([
            "--name=default".to_owned(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_client_url}"),
            format!("--advertise-client-urls={etcd_client_url}"),
            format!("--listen-peer-urls={etcd_peer_url}"),
            format!("--initial-advertise-peer-urls={etcd_peer_url}"),
            format!("--initial-cluster=default={etcd_peer_url}"),
            // Throw-away data: no need to pay for fsync on a shared disk.
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ]);
        control_plane.adopt(ManagedProcess::spawn("etcd", etcd, &dir.join("etcd.log"))?);

        let mut apiserver = Command::new(&binaries.kube_apiserver);
        apiserver.args([
            // envtest's defaults (controller-runtime pkg/internal/testing/controlplane).
            "--advertise-address=127.0.0.1".to_owned(),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={apiserver_port}"),
            format!("--etcd-servers={etcd_client_url}"),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--allow-privileged=true".to_owned(),
            // Without the controllers that create `default` service accounts, the plugin
            // would reject every pod.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", files.serving_cert.display()),
            format!("--tls-private-key-file={}", files.serving_key.display()),
            format!("--token-auth-file={}", files.tokens.display()),
            format!("--service-account-issuer={}/", control_plane.apiserver_url),
            format!(
                "--service-account-key-file={}",
                files.service_account_public_key.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                files.service_account_key.display()
            ),
        ]);
        control_plane.adopt(ManagedProcess::spawn(
            "kube-apiserver",
            apiserver,
            &dir.join("kube-apiserver.log"),
        )?);

        control_plane.wait_ready(options.ready_timeout).await?;

        if !options.crds.is_empty() {
            crds::install(
                control_plane.client()?,
                &options.crds,
                options.ready_timeout,
            )
            .await?;
        }

        if options.controller_manager {
            let mut kcm = Command::new(&binaries.kube_controller_manager);
            kcm.args([
                format!("--kubeconfig={}", files.kubeconfig.display()),
                "--controllers=garbage-collector-controller,namespace-controller".to_owned(),
                "--leader-elect=false".to_owned(),
                // No serving endpoint needed: nothing scrapes or probes it.
                "--secure-port=0".to_owned(),
                "--use-service-account-credentials=false".to_owned(),
            ]);
            control_plane.adopt(ManagedProcess::spawn(
                "kube-controller-manager",
                kcm,
                &dir.join("kube-controller-manager.log"),
            )?);
            control_plane.check_running()?;
        }

        control_plane.startup_time = started.elapsed();
        Ok(control_plane)
    }

    fn adopt(&self, process: ManagedProcess) {
        self.processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(process);
    }

    /// An error (with the end of its log) if any of the processes has exited.
    pub fn check_running(&self) -> Result<()> {
        let mut processes = self
            .processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for process in processes.iter_mut() {
            if let Some(status) = process.exit_status() {
                bail!(
                    "{} exited ({status}); end of its log:\n{}",
                    process.name(),
                    process.log_tail(4096)
                );
            }
        }
        Ok(())
    }

    /// Process ids of the running servers (etcd, kube-apiserver, kube-controller-manager).
    pub fn process_ids(&self) -> Vec<u32> {
        self.processes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(ManagedProcess::id)
            .collect()
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let client = self.client()?;
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running()?;
            let request = http::Request::get("/readyz").body(Vec::new())?;
            let last_answer =
                match tokio::time::timeout(Duration::from_secs(5), client.request_text(request))
                    .await
                {
                    Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                    Ok(Ok(body)) => body,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "request timed out".to_owned(),
                };
            if Instant::now() >= deadline {
                let log = process::log_tail(&self.data_dir.join("kube-apiserver.log"), 4096);
                bail!(
                    "kube-apiserver at {} not ready within {timeout:?}; last answer: \
                     {last_answer}; end of its log:\n{log}",
                    self.apiserver_url
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A new client with cluster-admin rights. A new one per call, because a client's
    /// connections belong to the Tokio runtime it was first used in, and each `#[tokio::test]`
    /// has its own runtime. Must be called inside a Tokio runtime.
    pub fn client(&self) -> Result<kube::Client> {
        kube::Client::try_from(self.config.clone()).context("building a kube client")
    }

    /// The client configuration (server URL, CA, token).
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// A kubeconfig file for this control plane (for other processes, e.g. a controller).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// `https://127.0.0.1:<port>`.
    pub fn apiserver_url(&self) -> &str {
        &self.apiserver_url
    }

    /// Time from the start of `start` (after the binaries were found) to ready.
    pub fn startup_time(&self) -> Duration {
        self.startup_time
    }

    /// The directory holding the logs, etcd's data and the certificates.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Installs CRDs and waits until they are Established.
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) -> Result<Vec<String>> {
        crds::install(self.client()?, crds, Duration::from_secs(60)).await
    }

    /// Installs the CRDs in YAML (multi-document) or JSON `text`; returns their names.
    pub async fn install_crd_manifests(&self, text: &str) -> Result<Vec<String>> {
        self.install_crds(&parse_crd_manifests(text)?).await
    }

    /// Creates a namespace named `<prefix>-<random>` and returns its name.
    pub async fn create_namespace(&self, prefix: &str) -> Result<String> {
        let api: Api<Namespace> = Api::all(self.client()?);
        let namespace = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let created = api
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating a namespace for {prefix}"))?;
        created
            .metadata
            .name
            .ok_or_else(|| anyhow!("the apiserver returned a namespace without a name"))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let processes = std::mem::take(
            self.processes
                .get_mut()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        // Killed (in reverse start order) before the directory they write to goes.
        for mut process in processes.into_iter().rev() {
            process.kill();
        }
        if std::env::var_os(KEEP_DATA_ENV).is_some_and(|v| v == "1") {
            eprintln!("control plane data kept in {}", self.data_dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
        process::forget_directory(self.data_dir_cleanup);
    }
}

/// Where data directories live: `$TMPDIR/kubevirt-rs-controlplane/<pid>-<n>`.
fn data_root() -> PathBuf {
    std::env::temp_dir().join("kubevirt-rs-controlplane")
}

/// A fresh data directory; also removes those left by test processes that no longer exist
/// (killed before their cleanup could run).
fn create_data_dir() -> Result<PathBuf> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let root = data_root();
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let owner = name
                .to_str()
                .and_then(|n| n.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            if let Some(pid) = owner
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = root.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    // A leftover from a previous process with the same pid is stale by definition.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Distinct free ports: all listeners are held until every port is picked.
fn free_loopback_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<Vec<_>>>()
        .context("picking free loopback ports")?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

struct ConfigFiles {
    serving_cert: PathBuf,
    serving_key: PathBuf,
    service_account_key: PathBuf,
    service_account_public_key: PathBuf,
    tokens: PathBuf,
    kubeconfig: PathBuf,
}

/// Certificates, the token file and a kubeconfig (used by the tests and the controller manager).
fn write_config_files(dir: &Path, apiserver_url: &str) -> Result<ConfigFiles> {
    let pki = Pki::generate()?;
    let files = ConfigFiles {
        serving_cert: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        service_account_key: dir.join("service-account.key"),
        service_account_public_key: dir.join("service-account.pub"),
        tokens: dir.join("tokens.csv"),
        kubeconfig: dir.join("kubeconfig"),
    };
    let ca_cert = dir.join("ca.crt");
    let token = format!("{:032x}", rand::random::<u128>());
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "integration", "cluster": {
            "server": apiserver_url,
            "certificate-authority": ca_cert,
        }}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "integration", "context": {"cluster": "integration", "user": "admin"}}],
        "current-context": "integration",
    });
    for (path, contents) in [
        (&ca_cert, pki.ca_cert_pem),
        (&files.serving_cert, pki.serving_cert_pem),
        (&files.serving_key, pki.serving_key_pem),
        (&files.service_account_key, pki.service_account_key_pem),
        (
            &files.service_account_public_key,
            pki.service_account_public_key_pem,
        ),
        // token,user,uid,"groups": system:masters is bound to cluster-admin.
        (
            &files.tokens,
            format!("{token},kubevirt-rs-admin,kubevirt-rs-admin,\"system:masters\"\n"),
        ),
        (&files.kubeconfig, serde_yaml::to_string(&kubeconfig)?),
    ] {
        std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_and_nonzero() {
        let ports: [u16; 3] = free_loopback_ports().unwrap();
        assert!(ports.iter().all(|&p| p != 0));
        assert_ne!(ports[0], ports[1]);
        assert_ne!(ports[1], ports[2]);
        assert_ne!(ports[0], ports[2]);
    }

    #[test]
    fn data_dirs_are_unique_and_stale_ones_are_swept() {
        let stale = data_root().join("4294967295-0"); // no such pid
        std::fs::create_dir_all(&stale).unwrap();
        let a = create_data_dir().unwrap();
        let b = create_data_dir().unwrap();
        assert_ne!(a, b);
        assert!(!stale.exists());
        std::fs::remove_dir_all(a).unwrap();
        std::fs::remove_dir_all(b).unwrap();
    }

    #[tokio::test]
    async fn generated_kubeconfig_loads() {
        let dir = create_data_dir().unwrap();
        let files = write_config_files(&dir, "https://127.0.0.1:6443").unwrap();
        let kubeconfig = Kubeconfig::read_from(&files.kubeconfig).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://127.0.0.1:6443/");
        assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
        let tokens = std::fs::read_to_string(&files.tokens).unwrap();
        assert!(tokens.ends_with(",kubevirt-rs-admin,kubevirt-rs-admin,\"system:masters\"\n"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}

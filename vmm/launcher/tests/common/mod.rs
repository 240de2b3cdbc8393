//! A real launcher process over its real socket, with a notify server
//! playing the handler's part.

#![allow(dead_code)]

use proto::domain::Domain;
use proto::grpc::cmd::v1::Response as CmdResponse;
use proto::grpc::cmd::v1::cmd_client::CmdClient;
use proto::grpc::notify::info::notify_info_server::{NotifyInfo, NotifyInfoServer};
use proto::grpc::notify::info::{NotifyInfoRequest, NotifyInfoResponse};
use proto::grpc::notify::v1::notify_server::{Notify, NotifyServer};
use proto::grpc::notify::v1::{DomainEventRequest, K8sEventRequest, Response as NotifyResponse};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tonic::transport::Channel;

pub fn require_root_and_kvm() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "launcher tests need root (taps, chown); run them as root"
    );
    assert!(
        Path::new("/dev/kvm").exists(),
        "/dev/kvm is missing: launcher tests boot a real VM and cannot run here"
    );
}

/// A launcher's pod: a temporary root with KubeVirt's layout under it.
pub struct Pod {
    pub root: tempfile::TempDir,
    pub paths: launcher::paths::Paths,
}

impl Pod {
    pub fn new() -> Pod {
        let root = tempfile::tempdir().unwrap();
        let paths = launcher::paths::Paths::under(root.path());
        // The kernel-boot image: the test guest.
        let kernel = paths.kernel_boot_dir.join("boot/guest.elf");
        std::fs::create_dir_all(kernel.parent().unwrap()).unwrap();
        std::fs::write(&kernel, test_guest::ELF).unwrap();
        std::fs::create_dir_all(paths.resolv_conf.parent().unwrap()).unwrap();
        std::fs::write(
            &paths.resolv_conf,
            "nameserver 10.96.0.10\nsearch ns1.svc.cluster.local\n",
        )
        .unwrap();
        Pod { root, paths }
    }

    /// A container disk image in the image volume `disk_<index>`.
    pub fn container_disk(&self, index: usize, bytes: &[u8]) -> PathBuf {
        let dir = self.paths.image_volume(index).join("disk");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("base.raw");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    pub fn flags(&self, extra: &[&str]) -> Vec<String> {
        let p = &self.paths;
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let mut flags = vec![
            "--qemu-timeout".into(),
            "60s".into(),
            "--name".into(),
            "testvmi".into(),
            "--namespace".into(),
            "ns1".into(),
            "--uid".into(),
            UID.into(),
            "--grace-period-seconds".into(),
            "20".into(),
            "--kubevirt-share-dir".into(),
            s(&p.share_dir),
            "--ephemeral-disk-dir".into(),
            s(&p.ephemeral_disk_dir),
            "--container-disk-dir".into(),
            s(&p.container_disk_dir),
            "--private-dir".into(),
            s(&p.private_dir),
            "--image-volume-dir".into(),
            s(&p.image_volume_dir),
            "--kernel-boot-dir".into(),
            s(&p.kernel_boot_dir),
            "--libvirt-runtime-dir".into(),
            s(&p.libvirt_runtime_dir),
            "--resolv-conf".into(),
            s(&p.resolv_conf),
            "--image-volume".into(),
        ];
        flags.extend(extra.iter().map(|s| s.to_string()));
        flags
    }

    pub fn start_launcher(&self, extra: &[&str]) -> Launcher {
        self.start_launcher_with_env(extra, &[])
    }

    /// With environment variables set as the pod sets them (`POD_NAME`).
    pub fn start_launcher_with_env(&self, extra: &[&str], env: &[(&str, &str)]) -> Launcher {
        let child = Command::new(env!("CARGO_BIN_EXE_virt-launcher"))
            .args(self.flags(extra))
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .spawn()
            .expect("virt-launcher starts");
        let launcher = Launcher { child };
        wait_for(&self.paths.launcher_socket(), Duration::from_secs(20));
        launcher
    }
}

pub const UID: &str = "11111111-2222-3333-4444-555555555555";

pub struct Launcher {
    pub child: Child,
}

impl Launcher {
    /// Waits for the process to exit; returns its status code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_for(path: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {timeout:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub async fn cmd_client(pod: &Pod) -> CmdClient<Channel> {
    launcher::server::connect(&pod.paths.launcher_socket())
        .await
        .expect("connects to launcher-sock")
}

/// Awaits a cmd RPC answered with `cmd.v1.Response` and asserts that it succeeded; the
/// panic names `what` with the gRPC status or the launcher's message.
pub async fn ok(
    call: impl Future<Output = Result<tonic::Response<CmdResponse>, tonic::Status>>,
    what: &str,
) {
    let reply = call
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .into_inner();
    assert!(reply.success, "{what} failed: {}", reply.message);
}

/// The VMI a test runs: the test guest by kernel boot, a container disk, rng.
pub fn vmi_json(kernel_args: &str, extra_spec: serde_json::Value) -> Vec<u8> {
    let mut vmi = serde_json::json!({
        "metadata": {"name": "testvmi", "namespace": "ns1", "uid": UID},
        "spec": {
            "domain": {
                "memory": {"guest": "64Mi"},
                "firmware": {"kernelBoot": {
                    "kernelArgs": kernel_args,
                    "container": {"image": "test/guest:latest", "kernelPath": "/boot/guest.elf"}
                }},
                "devices": {
                    "disks": [{"name": "containerdisk", "disk": {"bus": "virtio"}}],
                    "rng": {}
                }
            },
            "volumes": [{"name": "containerdisk", "containerDisk": {"image": "test/disk:latest"}}],
            "terminationGracePeriodSeconds": 20
        },
        "status": {"phase": "Scheduled"}
    });
    merge(&mut vmi["spec"], extra_spec);
    serde_json::to_vec(&vmi).unwrap()
}

fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

pub fn vmi_request(json: Vec<u8>) -> proto::grpc::cmd::v1::VmiRequest {
    proto::grpc::cmd::v1::VmiRequest {
        vmi: Some(proto::grpc::cmd::v1::Vmi { vmi_json: json }),
        options: Some(Default::default()),
    }
}

/// The handler's side: a notify server that hands events to the test.
pub struct NotifyRecorder {
    pub events: mpsc::UnboundedReceiver<(String, Domain)>,
    /// The Kubernetes events the launcher asked the handler to record (`core/v1 Event` JSON).
    pub k8s_events: mpsc::UnboundedReceiver<serde_json::Value>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

struct Recorder(
    mpsc::UnboundedSender<(String, Domain)>,
    mpsc::UnboundedSender<serde_json::Value>,
);

#[tonic::async_trait]
impl Notify for Recorder {
    async fn handle_domain_event(
        &self,
        request: tonic::Request<DomainEventRequest>,
    ) -> Result<tonic::Response<NotifyResponse>, tonic::Status> {
        let r = request.into_inner();
        let text = String::from_utf8(r.domain_json)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let domain =
            Domain::from_json(&text).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let _ = self.0.send((r.event_type, domain));
        Ok(tonic::Response::new(NotifyResponse {
            success: true,
            message: String::new(),
        }))
    }
    async fn handle_k8s_event(
        &self,
        request: tonic::Request<K8sEventRequest>,
    ) -> Result<tonic::Response<NotifyResponse>, tonic::Status> {
        let event: serde_json::Value = serde_json::from_slice(&request.into_inner().event_json)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let _ = self.1.send(event);
        Ok(tonic::Response::new(NotifyResponse {
            success: true,
            message: String::new(),
        }))
    }
}

struct Info;

#[tonic::async_trait]
impl NotifyInfo for Info {
    async fn info(
        &self,
        _: tonic::Request<NotifyInfoRequest>,
    ) -> Result<tonic::Response<NotifyInfoResponse>, tonic::Status> {
        Ok(tonic::Response::new(NotifyInfoResponse {
            supported_notify_versions: vec![1],
        }))
    }
}

impl NotifyRecorder {
    pub fn start(socket: &Path) -> NotifyRecorder {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(socket);
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let (k8s_tx, k8s_rx) = mpsc::unbounded_channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NotifyServer::new(Recorder(tx, k8s_tx)))
                .add_service(NotifyInfoServer::new(Info))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );
        NotifyRecorder {
            events: rx,
            k8s_events: k8s_rx,
            shutdown: Some(stop),
        }
    }

    /// The next Kubernetes event with `reason`, skipping others; panics after `timeout`.
    pub async fn k8s_event(&mut self, timeout: Duration, reason: &str) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.k8s_events.recv()).await {
                Ok(Some(event)) if event["reason"] == reason => return event,
                Ok(Some(_)) => continue,
                Ok(None) => panic!("notify server stopped while waiting for a {reason} event"),
                Err(_) => panic!("no {reason} event within {timeout:?}"),
            }
        }
    }

    /// The next event, whatever it is; panics after `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> (String, Domain) {
        match tokio::time::timeout(timeout, self.events.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("notify server stopped"),
            Err(_) => panic!("no event within {timeout:?}"),
        }
    }

    /// No event arrives within `quiet`.
    pub async fn expect_none(&mut self, quiet: Duration) {
        if let Ok(Some((t, d))) = tokio::time::timeout(quiet, self.events.recv()).await {
            panic!(
                "unexpected event {t} {:?}/{:?}",
                d.status.status, d.status.reason
            );
        }
    }

    /// The next event matching `pred`, skipping others; panics after `timeout`.
    pub async fn expect(
        &mut self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&str, &Domain) -> bool,
    ) -> (String, Domain) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let next = tokio::time::timeout_at(deadline, self.events.recv()).await;
            match next {
                Ok(Some((t, d))) if pred(&t, &d) => return (t, d),
                Ok(Some(_)) => continue,
                Ok(None) => panic!("notify server stopped while waiting for {what}"),
                Err(_) => panic!("no event {what} within {timeout:?}"),
            }
        }
    }
}

impl Drop for NotifyRecorder {
    fn drop(&mut self) {
        if let Some(stop) = self.shutdown.take() {
            let _ = stop.send(());
        }
    }
}

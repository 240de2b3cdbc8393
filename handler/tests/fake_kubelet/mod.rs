//! A fake kubelet for device-plugin tests: it serves `Registration` on `kubelet.sock` in
//! a temporary device-plugin directory and, like the kubelet's device manager, dials each
//! plugin back while handling `Register`, asks its options and follows its
//! `ListAndWatch` stream. [`FakeNode`] holds that directory and a temporary "host root"
//! with fake device nodes (character devices with /dev/null's numbers), never the real
//! /dev.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use handler::deviceplugins::{DevicePluginConfig, permanent_devices};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use proto::grpc::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use proto::grpc::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use proto::grpc::deviceplugin::v1beta1::{Device, Empty, RegisterRequest};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

pub const WAIT: Duration = Duration::from_secs(30);

pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests create device nodes (mknod): run them as root"
    );
}

/// What the fake kubelet saw.
#[derive(Debug)]
pub enum Seen {
    Registered(RegisterRequest),
    /// One `ListAndWatch` message of a resource.
    List(String, Vec<Device>),
    /// The plugin ended the stream.
    StreamEnded(String),
}

#[derive(Clone)]
struct FakeKubelet {
    plugin_dir: PathBuf,
    seen: mpsc::UnboundedSender<Seen>,
}

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        if request.version != "v1beta1" {
            return Err(Status::invalid_argument("unsupported version"));
        }
        // The kubelet connects to the endpoint while it handles Register.
        let socket = self.plugin_dir.join(&request.endpoint);
        let channel = proto::unix::channel(&socket, Duration::from_secs(5))
            .await
            .map_err(|e| Status::unavailable(format!("dial {}: {e}", socket.display())))?;
        let mut client = DevicePluginClient::new(channel);
        let options = client
            .get_device_plugin_options(Empty {})
            .await?
            .into_inner();
        assert!(!options.pre_start_required && !options.get_preferred_allocation_available);
        let mut stream = client.list_and_watch(Empty {}).await?.into_inner();
        let seen = self.seen.clone();
        let resource = request.resource_name.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = stream.message().await {
                let _ = seen.send(Seen::List(resource.clone(), message.devices));
            }
            let _ = seen.send(Seen::StreamEnded(resource));
        });
        let _ = self.seen.send(Seen::Registered(request));
        Ok(Response::new(Empty {}))
    }
}

/// A running fake kubelet; dropping it stops serving (its streams stay until the
/// plugins end them, as a real kubelet process that died would take them along).
pub struct Kubelet {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    pub fn start(plugin_dir: &Path) -> (Kubelet, mpsc::UnboundedReceiver<Seen>) {
        let socket = plugin_dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind kubelet.sock");
        let (seen, rx) = mpsc::unbounded_channel();
        let fake = FakeKubelet {
            plugin_dir: plugin_dir.to_path_buf(),
            seen,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(fake))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("fake kubelet serves");
        });
        (
            Kubelet {
                stop: Some(stop),
                task,
            },
            rx,
        )
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

/// A temporary node: the device-plugin directory and a host root with fake devices.
pub struct FakeNode {
    dir: tempfile::TempDir,
}

impl FakeNode {
    pub fn new() -> FakeNode {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("plugins")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("root/dev/net")).expect("mkdir");
        let node = FakeNode { dir };
        for device in permanent_devices() {
            node.add_device(&device.path);
        }
        node
    }

    pub fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn node_path(&self, host_path: &Path) -> PathBuf {
        self.root()
            .join(host_path.strip_prefix("/").expect("absolute"))
    }

    pub fn add_device(&self, host_path: &Path) {
        self.add_node(host_path, makedev(1, 3));
    }

    pub fn add_node(&self, host_path: &Path, dev: libc::dev_t) {
        mknod(
            &self.node_path(host_path),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o660),
            dev,
        )
        .expect("mknod (tests run as root)");
    }

    pub fn remove_device(&self, host_path: &Path) {
        std::fs::remove_file(self.node_path(host_path)).expect("rm device");
    }

    pub fn config(&self) -> DevicePluginConfig {
        let mut config = DevicePluginConfig::new(&self.plugin_dir(), &self.root());
        config.permissions = "rwm".into();
        config
    }

    pub fn socket(&self, device: &str) -> PathBuf {
        self.plugin_dir().join(format!("kubevirt-{device}.sock"))
    }

    /// The kubelet's device manager wipes its directory on start.
    pub fn wipe_plugin_dir(&self) {
        for entry in std::fs::read_dir(self.plugin_dir()).expect("read dir") {
            std::fs::remove_file(entry.expect("entry").path()).expect("rm");
        }
    }
}

/// Everything the fake kubelet has seen so far.
pub struct Observer {
    rx: mpsc::UnboundedReceiver<Seen>,
    pub registered: Vec<RegisterRequest>,
    pub latest: std::collections::HashMap<String, Vec<Device>>,
    pub emptied: Vec<String>,
    pub ended: Vec<String>,
}

impl Observer {
    pub fn new(rx: mpsc::UnboundedReceiver<Seen>) -> Self {
        Observer {
            rx,
            registered: Vec::new(),
            latest: Default::default(),
            emptied: Vec::new(),
            ended: Vec::new(),
        }
    }

    /// Takes in what the fake kubelet saw until `ok` holds.
    pub async fn wait(&mut self, what: &str, ok: impl Fn(&Observer) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !ok(self) {
            let seen = tokio::time::timeout_at(deadline, self.rx.recv())
                .await
                .unwrap_or_else(|_| panic!("{what}: not within {WAIT:?}"))
                .expect("fake kubelet channel open");
            match seen {
                Seen::Registered(r) => self.registered.push(r),
                Seen::List(r, devices) => {
                    if devices.is_empty() {
                        self.emptied.push(r.clone());
                    }
                    self.latest.insert(r, devices);
                }
                Seen::StreamEnded(r) => self.ended.push(r),
            }
        }
    }

    /// Waits for one registration per permanent device; returns them by resource.
    pub async fn registrations(&mut self) -> Vec<RegisterRequest> {
        self.wait("three registrations", |o| o.registered.len() >= 3)
            .await;
        let mut found = std::mem::take(&mut self.registered);
        found.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
        found
    }

    /// Waits until the latest list of `device` has 1000 devices, all with `health`.
    pub async fn all(&mut self, device: &str, health: &str) -> Vec<Device> {
        let resource = format!("devices.kubevirt.io/{device}");
        self.wait(&format!("{resource} all {health}"), |o| {
            o.latest.get(&resource).is_some_and(|devices| {
                devices.len() == 1000 && devices.iter().all(|d| d.health == health)
            })
        })
        .await;
        self.latest[&resource].clone()
    }
}

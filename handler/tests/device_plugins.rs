//! The handler's device plugins against a fake kubelet on real unix sockets.
//!
//! The fake plays the kubelet's side of the device-plugin API v1beta1: it serves
//! `Registration` on `kubelet.sock` in a temporary device-plugin directory and, like the
//! kubelet's device manager, dials each plugin back while handling `Register`, asks its
//! options and follows its `ListAndWatch` stream. The devices are fake nodes in a
//! temporary "host root" (character devices with /dev/null's numbers), never the real
//! /dev. Needs root (mknod).

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use handler::deviceplugins::{
    DevicePluginConfig, DevicePlugins, GenericDevice, Health, permanent_devices,
};
use nix::sys::stat::{Mode, SFlag, makedev, mknod};
use proto::grpc::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use proto::grpc::deviceplugin::v1beta1::registration_server::{Registration, RegistrationServer};
use proto::grpc::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, Device, DeviceSpec, Empty, PreStartContainerRequest,
    PreferredAllocationRequest, RegisterRequest,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const WAIT: Duration = Duration::from_secs(30);

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests create device nodes (mknod): run them as root"
    );
}

/// What the fake kubelet saw.
#[derive(Debug)]
enum Seen {
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
struct Kubelet {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Kubelet {
    fn start(plugin_dir: &Path) -> (Kubelet, mpsc::UnboundedReceiver<Seen>) {
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

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

/// A temporary node: the device-plugin directory and a host root with fake devices.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("plugins")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("root/dev/net")).expect("mkdir");
        let node = Node { dir };
        for device in permanent_devices() {
            node.add_device(&device.path);
        }
        node
    }

    fn plugin_dir(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn node_path(&self, host_path: &Path) -> PathBuf {
        self.root()
            .join(host_path.strip_prefix("/").expect("absolute"))
    }

    fn add_device(&self, host_path: &Path) {
        self.add_node(host_path, makedev(1, 3));
    }

    fn add_node(&self, host_path: &Path, dev: libc::dev_t) {
        mknod(
            &self.node_path(host_path),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o660),
            dev,
        )
        .expect("mknod (tests run as root)");
    }

    fn remove_device(&self, host_path: &Path) {
        std::fs::remove_file(self.node_path(host_path)).expect("rm device");
    }

    fn config(&self) -> DevicePluginConfig {
        let mut config = DevicePluginConfig::new(&self.plugin_dir(), &self.root());
        config.permissions = "rwm".into();
        config
    }

    fn socket(&self, device: &str) -> PathBuf {
        self.plugin_dir().join(format!("kubevirt-{device}.sock"))
    }

    /// The kubelet's device manager wipes its directory on start.
    fn wipe_plugin_dir(&self) {
        for entry in std::fs::read_dir(self.plugin_dir()).expect("read dir") {
            std::fs::remove_file(entry.expect("entry").path()).expect("rm");
        }
    }
}

/// Everything the fake kubelet has seen so far.
struct Observer {
    rx: mpsc::UnboundedReceiver<Seen>,
    registered: Vec<RegisterRequest>,
    latest: std::collections::HashMap<String, Vec<Device>>,
    emptied: Vec<String>,
    ended: Vec<String>,
}

impl Observer {
    fn new(rx: mpsc::UnboundedReceiver<Seen>) -> Self {
        Observer {
            rx,
            registered: Vec::new(),
            latest: Default::default(),
            emptied: Vec::new(),
            ended: Vec::new(),
        }
    }

    /// Takes in what the fake kubelet saw until `ok` holds.
    async fn wait(&mut self, what: &str, ok: impl Fn(&Observer) -> bool) {
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
    async fn registrations(&mut self) -> Vec<RegisterRequest> {
        self.wait("three registrations", |o| o.registered.len() >= 3)
            .await;
        let mut found = std::mem::take(&mut self.registered);
        found.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
        found
    }

    /// Waits until the latest list of `device` has 1000 devices, all with `health`.
    async fn all(&mut self, device: &str, health: &str) -> Vec<Device> {
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

async fn plugin_client(socket: &Path) -> DevicePluginClient<tonic::transport::Channel> {
    DevicePluginClient::new(
        proto::unix::channel(socket, Duration::from_secs(5))
            .await
            .expect("dial plugin"),
    )
}

async fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_register_report_health_allocate_and_survive_a_kubelet_restart() {
    require_root();
    let node = Node::new();
    let (kubelet, seen) = Kubelet::start(&node.plugin_dir());
    let mut seen = Observer::new(seen);
    let plugins = DevicePlugins::start(node.config(), permanent_devices());
    let ready = plugins.readiness();

    // Registration: KubeVirt's resource names, socket names and API version.
    let found = seen.registrations().await;
    let summary: Vec<_> = found
        .iter()
        .map(|r| {
            (
                r.resource_name.as_str(),
                r.endpoint.as_str(),
                r.version.as_str(),
                r.options.is_none(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "devices.kubevirt.io/kvm",
                "kubevirt-kvm.sock",
                "v1beta1",
                true
            ),
            (
                "devices.kubevirt.io/tun",
                "kubevirt-tun.sock",
                "v1beta1",
                true
            ),
            (
                "devices.kubevirt.io/vhost-net",
                "kubevirt-vhost-net.sock",
                "v1beta1",
                true
            ),
        ]
    );
    for device in ["kvm", "tun", "vhost-net"] {
        let socket = node.socket(device);
        let kind = std::fs::symlink_metadata(&socket)
            .expect("plugin socket")
            .file_type();
        assert!(kind.is_socket(), "{} is a socket", socket.display());
    }
    wait_until("every plugin counts as registered", || {
        ready.all_registered()
    })
    .await;

    // ListAndWatch: 1000 identical healthy devices per resource.
    let kvm = seen.all("kvm", "Healthy").await;
    assert_eq!(kvm[0].id, "kvm0");
    assert_eq!(kvm[999].id, "kvm999");

    // The node disappears: every kvm device turns unhealthy, and back.
    let kvm_path = Path::new("/dev/kvm");
    node.remove_device(kvm_path);
    seen.all("kvm", "Unhealthy").await;
    assert_eq!(plugins.health("kvm"), Some(Health::Unhealthy));
    assert_eq!(plugins.health("tun"), Some(Health::Healthy));
    // A node without a driver behind it does not open: still unhealthy.
    node.add_node(kvm_path, makedev(4000, 1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(plugins.health("kvm"), Some(Health::Unhealthy));
    node.remove_device(kvm_path);
    node.add_device(kvm_path);
    seen.all("kvm", "Healthy").await;
    assert!(ready.all_registered(), "health never unregisters a plugin");

    // A parent directory that goes and comes back (/dev/net) is followed too.
    std::fs::remove_dir_all(node.root().join("dev/net")).expect("rm dev/net");
    seen.all("tun", "Unhealthy").await;
    std::fs::create_dir(node.root().join("dev/net")).expect("mkdir dev/net");
    node.add_device(Path::new("/dev/net/tun"));
    seen.all("tun", "Healthy").await;

    // Allocate: the host node at the same path, with the configured permissions.
    let mut client = plugin_client(&node.socket("vhost-net")).await;
    let reply = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["vhost-net17".into()],
            }],
        })
        .await
        .expect("allocate")
        .into_inner();
    assert_eq!(reply.container_responses.len(), 1);
    assert_eq!(
        reply.container_responses[0].devices,
        vec![DeviceSpec {
            container_path: "/dev/vhost-net".into(),
            host_path: "/dev/vhost-net".into(),
            permissions: "rwm".into(),
        }]
    );
    let refused = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["kvm0".into()],
            }],
        })
        .await
        .expect_err("another plugin's device");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    client
        .pre_start_container(PreStartContainerRequest {
            devices_ids: vec!["vhost-net17".into()],
        })
        .await
        .expect("PreStartContainer answers empty");
    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest::default())
        .await
        .expect_err("not offered");
    assert_eq!(preferred.code(), tonic::Code::Unimplemented);

    // The kubelet restarts: it goes away, wipes the directory (our sockets with it) and
    // comes back a moment later. Every plugin registers again by itself.
    kubelet.stop().await;
    node.wipe_plugin_dir();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (kubelet, again) = Kubelet::start(&node.plugin_dir());
    let mut seen = Observer::new(again);
    let again = seen.registrations().await;
    assert_eq!(
        again
            .iter()
            .map(|r| r.endpoint.as_str())
            .collect::<Vec<_>>(),
        vec![
            "kubevirt-kvm.sock",
            "kubevirt-tun.sock",
            "kubevirt-vhost-net.sock"
        ]
    );
    seen.all("kvm", "Healthy").await;
    for device in ["kvm", "tun", "vhost-net"] {
        assert!(node.socket(device).exists(), "{device} socket is back");
    }
    wait_until("registered after the restart", || ready.all_registered()).await;

    // Stop: each stream gets an empty list and ends, the sockets go.
    plugins.stop().await;
    seen.wait("three streams ended", |o| o.ended.len() >= 3)
        .await;
    let mut emptied = seen.emptied.clone();
    emptied.sort();
    assert_eq!(
        emptied,
        vec![
            "devices.kubevirt.io/kvm",
            "devices.kubevirt.io/tun",
            "devices.kubevirt.io/vhost-net"
        ]
    );
    assert!(!ready.all_registered());
    for device in ["kvm", "tun", "vhost-net"] {
        assert!(!node.socket(device).exists(), "{device} socket removed");
    }
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_device_registers_with_no_healthy_device_and_plugins_wait_for_the_kubelet() {
    require_root();
    let node = Node::new();
    node.remove_device(Path::new("/dev/vhost-net"));
    // No kubelet yet: registration fails and is retried with back-off.
    let plugins = DevicePlugins::start(node.config(), permanent_devices());
    let ready = plugins.readiness();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!ready.all_registered());
    assert_eq!(plugins.registered("kvm"), Some(false));

    let (kubelet, seen) = Kubelet::start(&node.plugin_dir());
    let mut seen = Observer::new(seen);
    let found = seen.registrations().await;
    assert_eq!(found.len(), 3, "the missing device's plugin registers too");
    // Registered, but with 1000 unhealthy devices: capacity without allocatable.
    seen.all("vhost-net", "Unhealthy").await;
    seen.all("kvm", "Healthy").await;
    wait_until("registered", || ready.all_registered()).await;
    node.add_device(Path::new("/dev/vhost-net"));
    seen.all("vhost-net", "Healthy").await;
    plugins.stop().await;
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_plugin_per_device_with_its_own_socket_and_ids() {
    require_root();
    let node = Node::new();
    let (kubelet, seen) = Kubelet::start(&node.plugin_dir());
    let mut seen = Observer::new(seen);
    let custom = vec![GenericDevice::new("kvm", "/dev/kvm")];
    let mut config = node.config();
    config.max_devices = 3;
    let plugins = DevicePlugins::start(config, custom);
    seen.wait("kvm registered with 3 devices", |o| {
        o.registered.len() == 1
            && o.latest
                .get("devices.kubevirt.io/kvm")
                .is_some_and(|d| d.len() == 3)
    })
    .await;
    assert_eq!(seen.registered[0].resource_name, "devices.kubevirt.io/kvm");
    let ids: Vec<_> = seen.latest["devices.kubevirt.io/kvm"]
        .iter()
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(ids, vec!["kvm0", "kvm1", "kvm2"]);
    plugins.stop().await;
    kubelet.stop().await;
}

//! The handler's device plugins against a fake kubelet on real unix sockets
//! (`fake_kubelet`): registration, health, Allocate, a kubelet restart, stop.
//! The devices are fake nodes in a temporary host root, never the real /dev.
//! Needs root (mknod).

mod fake_kubelet;

use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::time::Duration;

use fake_kubelet::{FakeNode as Node, Kubelet, Observer, WAIT, require_root};
use handler::deviceplugins::{DevicePlugins, GenericDevice, Health, permanent_devices};
use nix::sys::stat::makedev;
use proto::grpc::deviceplugin::v1beta1::device_plugin_client::DevicePluginClient;
use proto::grpc::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, DeviceSpec, PreStartContainerRequest,
    PreferredAllocationRequest,
};

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

//! One generic device plugin: the `DevicePlugin` gRPC service on its socket, the
//! registration with the kubelet, the health watch, and the restart loop around them
//! (KubeVirt's `GenericDevicePlugin.Start` inside `controlledDevice.Start`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proto::grpc::deviceplugin::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use proto::grpc::deviceplugin::v1beta1::registration_client::RegistrationClient;
use proto::grpc::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
    DeviceSpec, Empty, KUBELET_SOCKET, ListAndWatchResponse, PreStartContainerRequest,
    PreStartContainerResponse, PreferredAllocationRequest, PreferredAllocationResponse,
    RegisterRequest, VERSION,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

use super::health::{self, DirWatch, Health};
use super::{DevicePluginConfig, GenericDevice};

/// Dialling the kubelet (`connectionTimeout`).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// The kubelet dials the plugin back while it handles `Register`; KubeVirt waits without
/// a deadline, this bounds a hung kubelet.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopping plugin waits for its `ListAndWatch` streams to send the empty
/// list (KubeVirt: one second).
const DEREGISTER_WAIT: Duration = Duration::from_secs(1);
/// How long the gRPC server may take to finish once asked to stop.
const SERVER_STOP_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub(crate) enum PluginError {
    #[error("device-plugin directory {0} does not exist (no kubelet here?)")]
    NoPluginDir(PathBuf),
    #[error("cannot watch {0}: {1}")]
    Watch(PathBuf, std::io::Error),
    #[error("error creating GRPC server socket {0}: {1}")]
    Socket(PathBuf, std::io::Error),
    #[error("error registering with device plugin manager at {0}: {1}")]
    Register(PathBuf, String),
    #[error("the device plugin's gRPC server stopped: {0}")]
    Server(String),
}

pub(crate) struct Plugin {
    device: GenericDevice,
    config: Arc<DevicePluginConfig>,
    /// The health of the device node, shared by every advertised device.
    health: watch::Sender<Health>,
    registered: AtomicBool,
}

/// The device list `ListAndWatch` sends: `max` devices with one health.
pub(crate) fn device_list(device: &GenericDevice, max: usize, health: Health) -> Vec<Device> {
    (0..max)
        .map(|i| Device {
            id: device.device_id(i),
            health: health.as_api_str().to_string(),
            topology: None,
        })
        .collect()
}

/// `Allocate`: every container gets the device node at its host path, with `permissions`.
/// Device IDs must be ours (the kubelet only picks advertised ones).
pub fn allocate(
    device: &GenericDevice,
    max: usize,
    permissions: &str,
    request: &AllocateRequest,
) -> Result<AllocateResponse, Status> {
    let mut container_responses = Vec::with_capacity(request.container_requests.len());
    for container in &request.container_requests {
        if let Some(unknown) = container
            .devices_ids
            .iter()
            .find(|id| !is_own_device_id(device, max, id))
        {
            return Err(Status::invalid_argument(format!(
                "device {unknown:?} is not a {} device",
                device.resource_name()
            )));
        }
        let path = device.path.to_string_lossy().into_owned();
        container_responses.push(ContainerAllocateResponse {
            devices: vec![DeviceSpec {
                container_path: path.clone(),
                host_path: path,
                permissions: permissions.to_string(),
            }],
            ..Default::default()
        });
    }
    Ok(AllocateResponse {
        container_responses,
    })
}

fn is_own_device_id(device: &GenericDevice, max: usize, id: &str) -> bool {
    id.strip_prefix(device.name.as_str())
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .filter(|n| n.len() == 1 || !n.starts_with('0'))
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n < max)
}

/// The gRPC face of one serving period of a plugin.
#[derive(Clone)]
struct Service {
    plugin: Arc<Plugin>,
    /// Turns true when the plugin stops: streams send the empty list and end.
    done: watch::Receiver<bool>,
    /// Open `ListAndWatch` streams.
    streams: Arc<watch::Sender<usize>>,
}

/// Counts one open stream for as long as it lives.
struct StreamGuard(Arc<watch::Sender<usize>>);

impl StreamGuard {
    fn new(streams: Arc<watch::Sender<usize>>) -> Self {
        streams.send_modify(|n| *n += 1);
        StreamGuard(streams)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: false,
        }))
    }

    type ListAndWatchStream = ReceiverStream<Result<ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let plugin = Arc::clone(&self.plugin);
        let mut health = plugin.health.subscribe();
        let mut done = self.done.clone();
        let guard = StreamGuard::new(Arc::clone(&self.streams));
        tokio::spawn(async move {
            let _guard = guard;
            let max = plugin.config.max_devices;
            let send = |h: Health| {
                Ok(ListAndWatchResponse {
                    devices: device_list(&plugin.device, max, h),
                })
            };
            let current = *health.borrow_and_update();
            if tx.send(send(current)).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    changed = health.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let now = *health.borrow_and_update();
                        if tx.send(send(now)).await.is_err() {
                            return;
                        }
                    }
                    _ = until_true(&mut done) => break,
                    _ = tx.closed() => return,
                }
            }
            // There is no explicit way to deregister: an empty list makes the kubelet
            // drop the devices at once.
            if tx
                .send(Ok(ListAndWatchResponse {
                    devices: Vec::new(),
                }))
                .await
                .is_err()
            {
                tracing::info!(device = %plugin.device.name, "device plugin failed to deregister");
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        _request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        // KubeVirt's plugin predates this RPC (its server answers UNIMPLEMENTED), and the
        // options above tell the kubelet not to call it.
        Err(Status::unimplemented(
            "GetPreferredAllocation is not offered by this device plugin",
        ))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let request = request.into_inner();
        tracing::info!(
            resource = %self.plugin.device.resource_name(),
            containers = request.container_requests.len(),
            "Allocate"
        );
        allocate(
            &self.plugin.device,
            self.plugin.config.max_devices,
            &self.plugin.config.permissions,
            &request,
        )
        .map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

impl Plugin {
    pub(crate) fn new(device: GenericDevice, config: Arc<DevicePluginConfig>) -> Self {
        Plugin {
            device,
            config,
            health: watch::channel(Health::Healthy).0,
            registered: AtomicBool::new(false),
        }
    }

    pub(crate) fn device(&self) -> &GenericDevice {
        &self.device
    }

    pub(crate) fn health(&self) -> Health {
        *self.health.borrow()
    }

    pub(crate) fn registered(&self) -> bool {
        self.registered.load(Ordering::SeqCst)
    }

    fn socket_path(&self) -> PathBuf {
        self.config.plugin_dir.join(self.device.socket_name())
    }

    /// The node as the handler sees it (under the device root).
    fn node(&self) -> PathBuf {
        let relative = self
            .device
            .path
            .strip_prefix("/")
            .unwrap_or(&self.device.path);
        self.config.device_root.join(relative)
    }

    /// The watched directories with the entry in each that leads to the node.
    fn watch_chain(&self) -> Vec<(PathBuf, std::ffi::OsString)> {
        let dirs = health::watched_dirs(&self.config.device_root, &self.device.path);
        let names = self.device.path.components().filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.to_os_string()),
            _ => None,
        });
        dirs.into_iter().zip(names).collect()
    }

    /// Looks at the node again and publishes a change of health.
    fn refresh_health(&self) {
        let now = health::probe(&self.node());
        let changed = self.health.send_if_modified(|h| {
            let changed = *h != now;
            *h = now;
            changed
        });
        if changed {
            match now {
                Health::Healthy => {
                    tracing::info!(device = %self.device.name, "monitored device appeared")
                }
                Health::Unhealthy => tracing::warn!(
                    device = %self.device.name,
                    node = %self.node().display(),
                    "monitored device is missing or unusable; its devices are unhealthy"
                ),
            }
        }
    }

    /// Keeps (re)starting the plugin until `stop`, pausing as KubeVirt does: 1 s after a
    /// clean end (socket removed), longer after failures in a row.
    pub(crate) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let backoff = if self.config.backoff.is_empty() {
            super::BACKOFF.to_vec()
        } else {
            self.config.backoff.clone()
        };
        let mut retries = 0usize;
        loop {
            match self.serve_once(&mut stop).await {
                Ok(()) => retries = 0,
                Err(e) => {
                    tracing::error!(device = %self.device.name, error = %e, "error starting the device plugin");
                    retries = (retries + 1).min(backoff.len() - 1);
                }
            }
            if *stop.borrow() {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff[retries]) => {}
                _ = until_true(&mut stop) => break,
            }
        }
    }

    /// Watches the node's directories (again; new ones may have appeared).
    fn rewatch_device(
        &self,
        watch: &DirWatch,
        watches: &mut Vec<(i32, PathBuf)>,
    ) -> Result<(), PluginError> {
        for (dir, _) in self.watch_chain() {
            let present = watch
                .watch(&dir, watches)
                .map_err(|e| PluginError::Watch(dir.clone(), e))?;
            if !present {
                break;
            }
        }
        Ok(())
    }

    /// One serving period: socket, server, registration, then watching until the plugin
    /// must stop (Ok) or its socket disappears (Ok: the kubelet restarted) or something
    /// breaks (Err).
    async fn serve_once(
        self: &Arc<Self>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), PluginError> {
        let socket = self.socket_path();
        remove_socket(&socket).map_err(|e| PluginError::Socket(socket.clone(), e))?;
        // Watch first, then look: no change between the two goes unseen.
        let watch = DirWatch::new().map_err(|e| PluginError::Watch(PathBuf::new(), e))?;
        let mut watches = Vec::new();
        self.rewatch_device(&watch, &mut watches)?;
        let plugin_dir = self.config.plugin_dir.clone();
        if !watch
            .watch(&plugin_dir, &mut watches)
            .map_err(|e| PluginError::Watch(plugin_dir.clone(), e))?
        {
            return Err(PluginError::NoPluginDir(plugin_dir));
        }
        self.refresh_health();

        let listener = proto::unix::SocketPath::new(&socket)
            .and_then(|short| tokio::net::UnixListener::bind(short.path()))
            .map_err(|e| PluginError::Socket(socket.clone(), e))?;
        let (done_tx, done_rx) = watch::channel(false);
        let streams = Arc::new(watch::channel(0usize).0);
        let service = Service {
            plugin: Arc::clone(self),
            done: done_rx,
            streams: Arc::clone(&streams),
        };
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let mut server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(DevicePluginServer::new(service))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = shutdown_rx.await;
                }),
        );
        let mut server_done = false;

        let socket_name = std::ffi::OsString::from(self.device.socket_name());
        let chain = self.watch_chain();
        let outcome = async {
            self.register().await?;
            self.registered.store(true, Ordering::SeqCst);
            tracing::info!(device = %self.device.name, resource = %self.device.resource_name(), "device plugin started");
            loop {
                tokio::select! {
                    _ = until_true(stop) => return Ok(()),
                    events = watch.next(&watches) => {
                        let events = events.map_err(|e| PluginError::Watch(plugin_dir.clone(), e))?;
                        let socket_gone = events.iter().any(|e| {
                            e.dir == plugin_dir
                                && e.gone
                                && (e.name.is_none() || e.name.as_ref() == Some(&socket_name))
                        });
                        if socket_gone {
                            tracing::info!(device = %self.device.name, "device socket file was removed, kubelet probably restarted");
                            return Ok(());
                        }
                        let device_changed = events.iter().any(|e| {
                            chain.iter().any(|(dir, next)| {
                                e.dir == *dir && (e.name.is_none() || e.name.as_ref() == Some(next))
                            })
                        });
                        if device_changed {
                            self.rewatch_device(&watch, &mut watches)?;
                            self.refresh_health();
                        }
                    }
                    ended = &mut server => {
                        server_done = true;
                        let reason = match ended {
                            Ok(Ok(())) => "ended".to_string(),
                            Ok(Err(e)) => e.to_string(),
                            Err(e) => e.to_string(),
                        };
                        return Err(PluginError::Server(reason));
                    }
                }
            }
        }
        .await;

        // KubeVirt's stopDevicePlugin: let the streams deregister (up to a second), then
        // stop the server and remove the socket.
        self.registered.store(false, Ordering::SeqCst);
        let _ = done_tx.send(true);
        let mut open_streams = streams.subscribe();
        let all_closed = async {
            let _ = open_streams.wait_for(|n| *n == 0).await;
        };
        let _ = tokio::time::timeout(DEREGISTER_WAIT, all_closed).await;
        let _ = shutdown_tx.send(());
        if !server_done
            && tokio::time::timeout(SERVER_STOP_WAIT, &mut server)
                .await
                .is_err()
        {
            server.abort();
        }
        if let Err(e) = remove_socket(&socket) {
            tracing::warn!(socket = %socket.display(), error = %e, "cannot remove the device plugin socket");
        }
        outcome
    }

    /// `Register` with the kubelet: our socket name, resource name and API version.
    async fn register(&self) -> Result<(), PluginError> {
        let kubelet = self.config.plugin_dir.join(KUBELET_SOCKET);
        let fail = |reason: String| PluginError::Register(kubelet.clone(), reason);
        let channel = proto::unix::channel(&kubelet, CONNECTION_TIMEOUT)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let mut request = Request::new(RegisterRequest {
            version: VERSION.to_string(),
            endpoint: self.device.socket_name(),
            resource_name: self.device.resource_name(),
            options: None,
        });
        request.set_timeout(REGISTER_TIMEOUT);
        RegistrationClient::new(channel)
            .register(request)
            .await
            .map_err(|e| fail(e.to_string()))?;
        Ok(())
    }
}

/// Waits until `flag` turns true (or its sender is gone).
async fn until_true(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|v| *v).await;
}

/// Removes a (stale) plugin socket; a missing one is fine.
fn remove_socket(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::grpc::deviceplugin::v1beta1::ContainerAllocateRequest;

    fn kvm() -> GenericDevice {
        GenericDevice::new("kvm", "/dev/kvm")
    }

    #[test]
    fn every_device_carries_the_node_health() {
        let list = device_list(&kvm(), 1000, Health::Healthy);
        assert_eq!(list.len(), 1000);
        assert_eq!(list[0].id, "kvm0");
        assert_eq!(list[999].id, "kvm999");
        assert!(
            list.iter()
                .all(|d| d.health == "Healthy" && d.topology.is_none())
        );
        let list = device_list(&kvm(), 3, Health::Unhealthy);
        assert!(list.iter().all(|d| d.health == "Unhealthy"));
    }

    fn request(ids: &[&[&str]]) -> AllocateRequest {
        AllocateRequest {
            container_requests: ids
                .iter()
                .map(|c| ContainerAllocateRequest {
                    devices_ids: c.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn allocate_gives_each_container_the_node_with_the_permissions() {
        let tun = GenericDevice::new("tun", "/dev/net/tun");
        let reply = allocate(
            &tun,
            1000,
            "rwm",
            &request(&[&["tun7"], &["tun0", "tun999"]]),
        )
        .expect("allocate");
        assert_eq!(reply.container_responses.len(), 2);
        for container in &reply.container_responses {
            assert_eq!(
                container.devices,
                vec![DeviceSpec {
                    container_path: "/dev/net/tun".into(),
                    host_path: "/dev/net/tun".into(),
                    permissions: "rwm".into(),
                }]
            );
            assert!(container.envs.is_empty() && container.mounts.is_empty());
            assert!(container.annotations.is_empty() && container.cdi_devices.is_empty());
        }
    }

    #[test]
    fn allocate_refuses_devices_it_never_advertised() {
        for bad in ["kvm1000", "kvm", "kvm-1", "tun0", "kvm01", "kvm+1", ""] {
            let err = allocate(&kvm(), 1000, "rw", &request(&[&[bad]])).expect_err(bad);
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad}");
        }
        assert!(allocate(&kvm(), 1000, "rw", &request(&[&["kvm0"]])).is_ok());
    }
}

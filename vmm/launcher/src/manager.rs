//! The domain manager: the one domain this launcher runs, its VM, and the
//! events that tell the handler about every change.
//!
//! Every lifecycle request goes through here and is serialized by one lock.
//! State changes are published as domain events in the order they happen.

use crate::converter::{self, Context};
use crate::disks;
use crate::network::{self, DhcpHandle};
use crate::paths::{PathName, Paths};
use crate::to_vm;
use proto::domain::{Domain, GracePeriodMetadata, LifeCycle, StateChangeReason};
use proto::grpc::cmd::v1::VirtualMachineOptions;
use proto::kubevirt::{Phase, VirtualMachineInstance};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use vmm::{Vm, VmConfig, VmExit, VmHandle, VmState};

mod migration;

/// A domain event for the handler (`DomainEventRequest`).
#[derive(Clone, Debug)]
pub(crate) struct DomainEvent {
    /// `ADDED` or `MODIFIED` (the Go launcher never sends `DELETED`).
    pub(crate) event_type: &'static str,
    pub(crate) domain: Domain,
}

/// A Kubernetes event about the VMI, for the handler to record (`K8sEventRequest`), as
/// KubeVirt's launcher sends them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct VmiEvent {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    /// `Normal` or `Warning`.
    pub(crate) kind: &'static str,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl VmiEvent {
    /// The `core/v1 Event` JSON the handler reads.
    pub(crate) fn to_json(&self) -> String {
        serde_json::json!({
            "involvedObject": {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "namespace": self.namespace,
                "name": self.name,
                "uid": self.uid,
            },
            "type": self.kind,
            "reason": self.reason,
            "message": self.message,
        })
        .to_string()
    }
}

/// What the notifier delivers to the handler, in order.
#[derive(Clone, Debug)]
pub(crate) enum Notification {
    /// Boxed: a domain is large, and the channel holds many of them.
    Domain(Box<DomainEvent>),
    Vmi(VmiEvent),
}

/// Where the launcher is in its life, for the main loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// No domain yet (waiting for SyncVirtualMachine, within --qemu-timeout).
    Waiting,
    /// The target of a live migration: the VM comes from the source (which also stops
    /// the --qemu-timeout wait).
    Incoming,
    /// A domain is defined (running, paused or stopped).
    Defined,
    /// The domain was deleted: the launcher may exit.
    Deleted,
}

/// How the VM of a [`Prepared`] comes to run here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// It boots here.
    Boot,
    /// It arrives from a migration's source.
    Migration,
}

/// A VM's configuration, ready to start or to receive (`Manager::prepare`).
struct Prepared {
    domain: Domain,
    config: VmConfig,
    dhcp: Option<DhcpHandle>,
    /// The disks (indexes into `config.disks`) a migration must not copy.
    shared_disks: Vec<usize>,
}

/// Options that do not come from the VMI.
#[derive(Clone, Debug, Default)]
pub(crate) struct ManagerOptions {
    pub(crate) paths: Paths,
    /// Where to read the pod's interfaces (`/sys/class/net`).
    pub(crate) sys_class_net: PathBuf,
    /// Start the DHCP server for masquerade interfaces (off in tests without a bridge).
    pub(crate) serve_dhcp: bool,
    /// How the VMM's threads are confined.
    pub(crate) sandbox: vmm::SandboxConfig,
}

pub(crate) struct Manager {
    options: ManagerOptions,
    state: Mutex<State>,
    events: mpsc::UnboundedSender<Notification>,
    /// Events handed to the notifier so far (see [`Manager::emitted_events`]).
    emitted: AtomicU64,
    stage: watch::Sender<Stage>,
}

#[derive(Default)]
struct State {
    domain: Option<Domain>,
    vm: Option<Arc<VmHandle>>,
    config: Option<VmConfig>,
    /// Bumped at every VM start: the exit watcher of an older VM is ignored.
    generation: u64,
    paused_by_user: bool,
    shutdown_requested: bool,
    killed: bool,
    dhcp: Option<DhcpHandle>,
    /// Copies the console into the serial log while the domain's VM runs
    /// (across reboots); dropped when the VM ends for good.
    console_log: Option<crate::console_log::ConsoleLog>,
    /// The last live migration, as source or target.
    migration: Option<migration::Migration>,
    /// The disks a migration must not copy (`Prepared::shared_disks`).
    shared_disks: Vec<usize>,
}

/// A failed request. Its text is the `Response.message` the handler shows (KubeVirt's
/// launcher answers with an error's text too); the variants keep what failed, and its source.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// The request is refused as it stands (no valid VMI, another VMI's launcher, the VM not
    /// running or paused, no domain yet): KubeVirt's message.
    #[error("{0}")]
    Refused(String),
    /// What no process of this project runs (`proto::contract::runnable`).
    #[error(transparent)]
    NotRunnable(#[from] proto::contract::runnable::Refusal),
    /// The VMI cannot become a domain (the field named).
    #[error(transparent)]
    Convert(#[from] converter::ConvertError),
    /// A disk of the VMI cannot be prepared or opened.
    #[error(transparent)]
    Disk(#[from] disks::DiskError),
    /// The domain cannot become a VM configuration.
    #[error(transparent)]
    ToVm(#[from] to_vm::ToVmError),
    /// The pod network's launcher side (DHCP) cannot start.
    #[error(transparent)]
    Network(#[from] network::NetworkError),
    /// The VMM refused or failed the request.
    #[error(transparent)]
    Vm(#[from] vmm::Error),
    /// The VMI's private directory cannot be made.
    #[error("{}: {source}", path.display())]
    PrivateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) type Result<T> = std::result::Result<T, Failure>;

fn fail<T>(msg: impl Into<String>) -> Result<T> {
    Err(Failure::Refused(msg.into()))
}

impl Manager {
    pub(crate) fn new(
        options: ManagerOptions,
    ) -> (
        Arc<Self>,
        mpsc::UnboundedReceiver<Notification>,
        watch::Receiver<Stage>,
    ) {
        let (events, rx) = mpsc::unbounded_channel();
        let (stage, stage_rx) = watch::channel(Stage::Waiting);
        let manager = Arc::new(Manager {
            options,
            state: Mutex::new(State::default()),
            events,
            emitted: AtomicU64::new(0),
            stage,
        });
        (manager, rx, stage_rx)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds the state lock as a long `sync` does (tests of the callers).
    #[cfg(test)]
    pub(crate) fn hold_lock(&self) -> impl Sized + '_ {
        self.lock()
    }

    fn emit(&self, event_type: &'static str, domain: &Domain) {
        // Counted before it is queued: the notifier never gets ahead of it.
        self.emitted.fetch_add(1, Ordering::SeqCst);
        let _ = self.events.send(Notification::Domain(Box::new(DomainEvent {
            event_type,
            domain: domain.clone(),
        })));
    }

    /// Asks the handler to record a Kubernetes event about the domain's VMI.
    fn record(&self, domain: &Domain, kind: &'static str, reason: &'static str, message: String) {
        self.emitted.fetch_add(1, Ordering::SeqCst);
        let _ = self.events.send(Notification::Vmi(VmiEvent {
            namespace: domain.object_meta.namespace.clone(),
            name: domain.object_meta.name.clone(),
            uid: domain.object_meta.uid.clone(),
            kind,
            reason,
            message,
        }));
    }

    /// Reports the entry a VM booted from its disk, as an event on the VMI.
    fn report_boot(&self, domain: &Domain, vm: &VmHandle) {
        if let Some(report) = vm.boot_report() {
            let message = format!(
                "booted disk {:?} ({}): {}",
                disk_name(domain, report.disk),
                report.firmware.name(),
                report.describe()
            );
            tracing::info!("{message}; command line: {}", report.cmdline);
            self.record(domain, "Normal", BOOTED_FROM_DISK, message);
        }
    }

    /// A boot disk with nothing to boot: as a firmware that finds no bootable device, but
    /// at once. The domain ends `Crashed` (the handler fails the VMI) and an event says
    /// which disk and why.
    fn boot_failed(
        &self,
        domain: &mut Domain,
        disk: usize,
        source: &vmm::boot_disk::BootError,
    ) -> String {
        let message = format!("cannot boot disk {:?}: {source}", disk_name(domain, disk));
        tracing::error!("{message}");
        self.record(domain, "Warning", BOOT_FAILED, message.clone());
        domain.status.status = LifeCycle::Shutoff;
        domain.status.reason = StateChangeReason::Crashed;
        message
    }

    /// How many domain events were queued for the handler so far; the
    /// launcher exits only once the notifier has dealt with as many.
    pub(crate) fn emitted_events(&self) -> u64 {
        self.emitted.load(Ordering::SeqCst)
    }

    /// The domain as `GetDomain` reports it (`None` when there is none).
    pub(crate) fn domain(&self) -> Option<Domain> {
        self.lock().domain.clone()
    }

    /// `SyncVirtualMachine`: defines and starts the domain the first time;
    /// afterwards idempotent. Never restarts a running VM and never unpauses
    /// a VM the user paused.
    pub(crate) fn sync(
        self: &Arc<Self>,
        vmi: &VirtualMachineInstance,
        options: Option<&VirtualMachineOptions>,
    ) -> Result<()> {
        let uid = vmi.metadata.uid.clone().unwrap_or_default();
        let mut state = self.lock();
        if let Some(domain) = &state.domain {
            if domain.spec.metadata.kubevirt.uid != uid {
                return fail(format!(
                    "this launcher runs the domain of VMI UID {}, not {uid}",
                    domain.spec.metadata.kubevirt.uid
                ));
            }
            // A VM paused by something other than the user is resumed.
            if let Some(vm) = &state.vm
                && vm.state() == VmState::Paused
                && !state.paused_by_user
            {
                vm.resume()?;
                self.set_status(&mut state, LifeCycle::Running, StateChangeReason::Unknown);
            }
            return Ok(());
        }
        let phase = vmi.phase();
        if phase == Phase::Running || phase.is_final() {
            return fail(format!(
                "no domain is defined and the VMI is {phase}: not starting a new VM"
            ));
        }

        if state.migration.is_some() {
            return fail(
                "this launcher is the target of a migration: its VM comes from the source",
            );
        }
        let Prepared {
            mut domain,
            config,
            dhcp,
            shared_disks,
        } = self.prepare(vmi, options, Arrival::Boot)?;

        let vm = match Vm::start(config.clone()) {
            Ok(vm) => Arc::new(vm),
            Err(vmm::Error::BootDisk { disk, source, .. }) => {
                // Defined and ended: the handler sees why the VMI failed.
                let message = self.boot_failed(&mut domain, disk, &source);
                state.dhcp = None;
                state.config = Some(config);
                self.emit("ADDED", &domain);
                state.domain = Some(domain);
                drop(state);
                self.stage.send_replace(Stage::Defined);
                return fail(message);
            }
            Err(e) => return Err(e.into()),
        };
        self.report_boot(&domain, &vm);
        let console_log = start_console_log(&domain);
        let paused = vmi.spec.start_strategy.as_deref() == Some("Paused");
        if paused {
            vm.pause()?;
        }
        domain.status.status = if paused {
            LifeCycle::Paused
        } else {
            LifeCycle::Running
        };
        domain.status.reason = if paused {
            StateChangeReason::User
        } else {
            StateChangeReason::Unknown
        };
        state.generation += 1;
        state.paused_by_user = paused;
        state.shutdown_requested = false;
        state.killed = false;
        state.dhcp = dhcp;
        state.console_log = console_log;
        state.config = Some(config);
        state.shared_disks = shared_disks;
        state.vm = Some(vm.clone());
        tracing::info!(domain = %domain.spec.name, "domain defined and started");
        self.emit("ADDED", &domain);
        state.domain = Some(domain);
        self.watch_exit(vm, state.generation);
        drop(state);
        self.stage.send_replace(Stage::Defined);
        Ok(())
    }

    /// What a VM is started from (`sync`, [`Arrival::Boot`]), or received into (a migration's target):
    /// the VMI converted to a domain, its disks prepared (pod-local files created once:
    /// a retry reuses them), the VMM configuration, the DHCP server of a masquerade
    /// interface.
    fn prepare(
        &self,
        vmi: &VirtualMachineInstance,
        options: Option<&VirtualMachineOptions>,
        arrival: Arrival,
    ) -> Result<Prepared> {
        let uid = vmi.metadata.uid.clone().unwrap_or_default();
        // What every process agrees this launcher runs, before a name becomes a path (the
        // disk plans below check their names again).
        proto::contract::runnable::check(vmi)?;
        let paths = &self.options.paths;
        let mut ctx = Context {
            paths: paths.clone(),
            pod_interface: network::pod_interface(&self.options.sys_class_net),
            interface_attachment: options
                .map(|o| o.interface_domain_attachment.clone().into_iter().collect())
                .unwrap_or_default(),
            smbios: options
                .and_then(|o| o.virtual_machine_sm_bios.as_ref())
                .map(|s| converter::SmbiosSettings {
                    manufacturer: s.manufacturer.clone(),
                    product: s.product.clone(),
                    version: s.version.clone(),
                    sku: s.sku.clone(),
                    family: s.family.clone(),
                }),
            // The guest's NICs keep the addresses it knows: a VM arriving here takes the
            // MACs the source reported (the target pod's own interface has another).
            guest_macs: match arrival {
                Arrival::Boot => Default::default(),
                Arrival::Migration => vmi
                    .status
                    .iter()
                    .flat_map(|s| &s.interfaces)
                    .filter_map(|i| Some((i.name.clone()?, i.mac.clone()?)))
                    .collect(),
            },
            ..Default::default()
        };
        let mut plans = Vec::new();
        for index in 0..vmi.spec.volumes.len() {
            let plan = disks::plan(paths, vmi, index)?;
            ctx.disks.insert(plan.volume.clone(), plan.clone());
            plans.push(plan);
        }
        ctx.kernel_boot = disks::kernel_boot(paths, vmi)?;
        // The converter refuses what the launcher cannot run before any
        // file is created.
        let mut domain = converter::convert(vmi, &ctx)?;

        // Pod-local files only, each created once: a sync that fails
        // further on and is retried reuses them.
        let mut opened = Vec::new();
        for plan in &plans {
            let done = disks::materialize(plan, vmi, paths, None)?;
            if let (Some(format), Some((base, _)), Some(devices)) = (
                done.base_format,
                &plan.backing,
                domain.spec.devices.as_mut(),
            ) {
                disks::record_backing_format(&mut devices.disks, base, format);
            }
            opened.push(done);
        }
        if let Some(kb) = &ctx.kernel_boot {
            disks::link_kernel_boot(paths, kb)?;
        }
        // The files exist now: decide each disk's cache mode (reported in
        // the domain, as KubeVirt's domain XML does).
        if let Some(devices) = domain.spec.devices.as_mut() {
            // A file opened by materialize is probed through its descriptor.
            disks::cache_mode::set_driver_cache_modes(&mut devices.disks, |path| {
                let opened = opened.iter().find_map(|o| o.opened_path(path));
                disks::cache_mode::supports_direct_io(opened.as_deref().unwrap_or(path))
            })?;
        }
        crate::live::as_libvirt_defines(&mut domain);
        // The one VMM configuration of this domain (also for reboots and
        // resets).
        let mut config = to_vm::vm_config(&domain)?;
        for done in &opened {
            done.hand_to(&mut config.disks);
        }
        config.sandbox = self.options.sandbox.clone();
        let private = paths.vmi_private_dir(
            &PathName::vmi_uid(&uid).map_err(|e| Failure::Refused(format!("metadata.uid: {e}")))?,
        );
        std::fs::create_dir_all(&private).map_err(|source| Failure::PrivateDir {
            path: private.clone(),
            source,
        })?;
        let dhcp = if self.options.serve_dhcp {
            network::start_dhcp(vmi, paths, &ctx.pod_interface)?
        } else {
            None
        };
        // Volumes both pods open as the same files (PVCs, DataVolumes, host disks): a
        // migration does not copy them (and refuses a writable one). The others are the
        // pod's own (overlays, empty disks, cloud-init images): copied.
        let shared_disks = config
            .disks
            .iter()
            .enumerate()
            .filter(|(_, disk)| {
                plans.iter().any(|plan| {
                    plan.path == disk.path
                        && matches!(
                            plan.action,
                            disks::Action::UseAsIs | disks::Action::CreateRawIfMissing(_)
                        )
                })
            })
            .map(|(index, _)| index)
            .collect();
        Ok(Prepared {
            domain,
            config,
            dhcp,
            shared_disks,
        })
    }

    /// Waits for the VM to end on its own thread and records how it ended.
    fn watch_exit(self: &Arc<Self>, vm: Arc<VmHandle>, generation: u64) {
        let manager = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("vm-exit".into())
            .spawn(move || {
                let exit = vm.wait();
                if let Some(manager) = manager.upgrade() {
                    manager.on_exit(generation, exit);
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cannot watch the VM's exit: {e}");
        }
    }

    fn on_exit(self: &Arc<Self>, generation: u64, exit: VmExit) {
        let mut state = self.lock();
        if state.generation != generation || state.domain.is_none() {
            return;
        }
        tracing::info!("VM ended: {exit}");
        // A guest reboot restarts the VM, unless a shutdown was asked for. The old
        // VM's `wait` (in `watch_exit`) returned only once its disks were flushed and
        // closed: the new VM (its boot loader thread first) opens them after that.
        if exit == VmExit::Reset
            && !state.shutdown_requested
            && !state.killed
            && let Some(config) = state.config.clone()
        {
            // A boot disk is read again: the guest may have changed its boot entry.
            match Vm::start(config) {
                Ok(vm) => {
                    let vm = Arc::new(vm);
                    if let Some(domain) = &state.domain {
                        self.report_boot(domain, &vm);
                    }
                    state.generation += 1;
                    state.vm = Some(vm.clone());
                    self.watch_exit(vm, state.generation);
                    return;
                }
                Err(vmm::Error::BootDisk { disk, source, .. }) => {
                    state.dhcp = None;
                    state.console_log = None;
                    if let Some(mut domain) = state.domain.clone() {
                        let _ = self.boot_failed(&mut domain, disk, &source);
                        self.set_status(&mut state, domain.status.status, domain.status.reason);
                    }
                    return;
                }
                Err(e) => tracing::error!("cannot restart the VM after a guest reboot: {e}"),
            }
        }
        state.dhcp = None;
        state.console_log = None;
        for (status, reason) in libvirt_states_at_exit(&exit, state.shutdown_requested) {
            self.set_status(&mut state, status, reason);
        }
    }

    /// Records a state change and reports it, as a libvirt lifecycle event
    /// does; staying in the same state reports nothing.
    fn set_status(&self, state: &mut State, status: LifeCycle, reason: StateChangeReason) {
        if let Some(domain) = state.domain.as_mut() {
            if domain.status.status == status && domain.status.reason == reason {
                return;
            }
            domain.status.status = status;
            domain.status.reason = reason;
            let domain = domain.clone();
            self.emit("MODIFIED", &domain);
        }
    }

    /// Reports the domain as it is after a change of KubeVirt's metadata
    /// (grace period), as the Go launcher's metadata-cache notification does.
    fn publish(&self, state: &State) {
        if let Some(domain) = &state.domain {
            self.emit("MODIFIED", domain);
        }
    }

    fn running_vm(state: &State) -> Result<Arc<VmHandle>> {
        match (&state.domain, &state.vm) {
            (Some(_), Some(vm)) if vm.exit().is_none() => Ok(vm.clone()),
            (Some(_), _) => fail("the VM is not running"),
            (None, _) => fail("no domain is defined"),
        }
    }

    pub(crate) fn pause(&self) -> Result<()> {
        let mut state = self.lock();
        let vm = Self::running_vm(&state)?;
        vm.pause()?;
        state.paused_by_user = true;
        self.set_status(&mut state, LifeCycle::Paused, StateChangeReason::User);
        Ok(())
    }

    pub(crate) fn unpause(&self) -> Result<()> {
        let mut state = self.lock();
        let vm = Self::running_vm(&state)?;
        vm.resume()?;
        state.paused_by_user = false;
        self.set_status(&mut state, LifeCycle::Running, StateChangeReason::Unknown);
        Ok(())
    }

    /// Graceful shutdown, as KubeVirt's `SignalShutdownVMI`: asks the guest
    /// (an ACPI power-button press, libvirt's default shutdown) and records when it was first asked, which the
    /// handler's grace timer reads. The state does not change: libvirt
    /// reports `ShuttingDown` only once the guest is going down, and the
    /// handler repeats the request until then. A paused VM stays paused
    /// (the request waits for it, as an ACPI event does); a stopped one is
    /// left alone. Repeats are harmless.
    pub(crate) fn shutdown(&self) -> Result<()> {
        let mut state = self.lock();
        let Ok(vm) = Self::running_vm(&state) else {
            return Ok(()); // no domain, or already stopped
        };
        state.shutdown_requested = true;
        vm.request_shutdown()?;
        let Some(domain) = state.domain.as_mut() else {
            return Ok(());
        };
        let grace = domain
            .spec
            .metadata
            .kubevirt
            .grace_period
            .get_or_insert_with(GracePeriodMetadata::default);
        if grace.deletion_timestamp.is_none() {
            grace.deletion_timestamp = Some(crate::now());
            self.publish(&state);
        }
        Ok(())
    }

    /// Forced stop; returns once the VM has ended.
    pub(crate) fn kill(&self) -> Result<()> {
        let vm = {
            let mut state = self.lock();
            let Ok(vm) = Self::running_vm(&state) else {
                return Ok(());
            };
            state.killed = true;
            vm
        };
        vm.kill();
        // The exit watcher records Shutoff/Destroyed; wait for it briefly so
        // that the reply reflects the new state.
        for _ in 0..100 {
            if self
                .lock()
                .domain
                .as_ref()
                .is_some_and(|d| d.status.status == LifeCycle::Shutoff)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Removes the domain (libvirt's undefine): kills a VM still running,
    /// then reports the domain as gone.
    pub(crate) fn delete(&self) -> Result<()> {
        // A migration's target deleted before its VM runs: it never will.
        Self::let_go_of_incoming(&self.lock());
        self.kill()?;
        let mut state = self.lock();
        let Some(domain) = state.domain.take() else {
            return Ok(());
        };
        state.generation += 1;
        state.vm = None;
        state.dhcp = None;
        state.console_log = None;
        state.config = None;
        let gone = Domain::gone(
            &domain.object_meta.namespace,
            &domain.object_meta.name,
            &domain.spec.metadata.kubevirt.uid,
            crate::now(),
        );
        self.emit("MODIFIED", &gone);
        drop(state);
        self.stage.send_replace(Stage::Deleted);
        Ok(())
    }

    /// Hard reset: the VM restarts from the kernel with the same disks.
    pub(crate) fn reset(self: &Arc<Self>) -> Result<()> {
        let mut state = self.lock();
        let old = Self::running_vm(&state)?;
        let config = state
            .config
            .clone()
            .ok_or_else(|| Failure::Refused("no VM configuration".into()))?;
        state.generation += 1; // the old VM's exit is not an ending of the domain
        old.kill();
        // The old VM's ordered end: its devices' batches done, its disks flushed and
        // closed (their locks released) before the new VM opens them; a kill ends the
        // vCPUs at once, the devices after their work in progress.
        old.wait();
        let vm = match Vm::start(config) {
            Ok(vm) => Arc::new(vm),
            Err(e) => {
                // The old VM is gone and no new one runs: the domain is down.
                tracing::error!("cannot restart the VM after a reset: {e}");
                state.dhcp = None;
                state.console_log = None;
                if let (vmm::Error::BootDisk { disk, source, .. }, Some(mut domain)) =
                    (&e, state.domain.clone())
                {
                    let _ = self.boot_failed(&mut domain, *disk, source);
                    self.set_status(&mut state, domain.status.status, domain.status.reason);
                } else {
                    self.set_status(&mut state, LifeCycle::Shutoff, StateChangeReason::Failed);
                }
                return Err(e.into());
            }
        };
        state.vm = Some(vm.clone());
        state.paused_by_user = false;
        self.watch_exit(vm, state.generation);
        self.set_status(&mut state, LifeCycle::Running, StateChangeReason::Unknown);
        Ok(())
    }

    /// Soft reboot: asks the guest to reboot (Ctrl-Alt-Del); the VM restarts
    /// when the guest resets.
    pub(crate) fn soft_reboot(&self) -> Result<()> {
        let state = self.lock();
        let vm = Self::running_vm(&state)?;
        if vm.state() == VmState::Paused {
            return fail("the VM is paused");
        }
        vm.request_ctrl_alt_del()?;
        Ok(())
    }

    /// SIGTERM to the launcher: asks the handler to shut the VM down
    /// (`MarkedForGracefulShutdown`), as the Go launcher's
    /// `MarkGracefulShutdownVMI` does. The handler then sends the shutdown
    /// request; the launcher itself only kills once its grace period is over.
    pub(crate) fn mark_for_graceful_shutdown(&self) {
        let mut state = self.lock();
        if let Some(domain) = state.domain.as_mut() {
            let grace = domain
                .spec
                .metadata
                .kubevirt
                .grace_period
                .get_or_insert_with(GracePeriodMetadata::default);
            if grace.marked_for_graceful_shutdown != Some(true) {
                grace.marked_for_graceful_shutdown = Some(true);
                self.publish(&state);
            }
        }
    }

    /// Whether a VM is still running (or paused).
    pub(crate) fn vm_alive(&self) -> bool {
        Self::running_vm(&self.lock()).is_ok()
    }

    /// Statistics (`GetDomainStats`, KubeVirt's `stats.DomainStats` JSON),
    /// `None` without a domain.
    pub(crate) fn stats_json(&self) -> Option<String> {
        let state = self.lock();
        let domain = state.domain.as_ref()?;
        let vm = state.vm.as_ref().map(|vm| vm.stats());
        let stats =
            crate::stats::domain_stats(domain, vm.as_ref(), crate::stats::ProcessUsage::current());
        Some(serde_json::to_string(&stats).expect("plain structs serialize"))
    }
}

/// The reason of the event naming the entry a VM booted from its disk.
pub(crate) const BOOTED_FROM_DISK: &str = "BootedFromDisk";
/// The reason of the event saying why a disk could not be booted.
pub(crate) const BOOT_FAILED: &str = "BootFailed";

/// The boot disk's name in the VMI (its alias), else its position.
fn disk_name(domain: &Domain, disk: usize) -> String {
    domain
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.disks.get(disk))
        .and_then(|d| d.alias.as_ref())
        .map(|a| a.name.clone())
        .unwrap_or_else(|| format!("#{disk}"))
}

/// The states a domain goes through when its VM ends, in order, each one a
/// lifecycle event, as libvirt's QEMU driver reports them (the pairs
/// `ConvState`/`ConvReason` of KubeVirt's `virtwrap/util` make of libvirt's
/// states and reasons):
///
/// - the guest powers off: QEMU's `SHUTDOWN` event puts the domain in
///   `VIR_DOMAIN_SHUTDOWN`/`_UNKNOWN` (ShuttingDown/Unknown), then the
///   process ends: `VIR_DOMAIN_SHUTOFF`/`_SHUTDOWN` (Shutoff/Shutdown);
/// - the guest resets after a shutdown request (a guest that answers the
///   power button, or a soft reboot's Ctrl-Alt-Del, by resetting): the
///   guest going down, reported as above;
/// - a reset whose restart failed: Shutoff/Failed;
/// - killed (`virDomainDestroy`): Shutoff/Destroyed;
/// - migrated away: Shutoff/Migrated;
/// - a guest crash: Shutoff/Crashed; a VMM failure: Shutoff/Failed.
fn libvirt_states_at_exit(
    exit: &VmExit,
    shutdown_requested: bool,
) -> Vec<(LifeCycle, StateChangeReason)> {
    use LifeCycle::{Shutoff, ShuttingDown};
    use StateChangeReason as R;
    match exit {
        VmExit::PowerOff { .. } => vec![(ShuttingDown, R::Unknown), (Shutoff, R::Shutdown)],
        VmExit::Reset if shutdown_requested => {
            vec![(ShuttingDown, R::Unknown), (Shutoff, R::Shutdown)]
        }
        VmExit::Reset => vec![(Shutoff, R::Failed)],
        VmExit::Killed => vec![(Shutoff, R::Destroyed)],
        // libvirt's VIR_DOMAIN_SHUTOFF_MIGRATED: the domain runs on the target now.
        VmExit::Migrated => vec![(Shutoff, R::Migrated)],
        VmExit::TripleFault { .. } | VmExit::Crash { .. } => vec![(Shutoff, R::Crashed)],
        VmExit::InternalError(_) => vec![(Shutoff, R::Failed)],
    }
}

/// Appends the console to the domain's serial log file, if it has one, until
/// the returned handle is dropped.
fn start_console_log(domain: &Domain) -> Option<crate::console_log::ConsoleLog> {
    let serial = domain.spec.devices.as_ref()?.serials.first()?;
    let (source, log) = (serial.source.as_ref()?, serial.log.as_ref()?);
    crate::console_log::start(source.path.clone().into(), log.file.clone().into())
        .inspect_err(|e| tracing::warn!("cannot start the console log: {e}"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_going_down_passes_through_shutting_down() {
        use LifeCycle::{Shutoff, ShuttingDown};
        use StateChangeReason as R;
        let down = vec![(ShuttingDown, R::Unknown), (Shutoff, R::Shutdown)];
        assert_eq!(
            libvirt_states_at_exit(&VmExit::PowerOff { code: 0 }, false),
            down
        );
        assert_eq!(libvirt_states_at_exit(&VmExit::Reset, true), down);
        assert_eq!(
            libvirt_states_at_exit(&VmExit::Reset, false),
            vec![(Shutoff, R::Failed)]
        );
        assert_eq!(
            libvirt_states_at_exit(&VmExit::Killed, true),
            vec![(Shutoff, R::Destroyed)]
        );
    }

    #[test]
    fn failures_carry_their_sources_messages() {
        let refusal = proto::contract::runnable::Refusal {
            field: "spec.domain.machine.type".into(),
            reason: "boom".into(),
        };
        let f: Failure = refusal.clone().into();
        assert_eq!(f.to_string(), refusal.to_string());
        let f = Failure::PrivateDir {
            path: "/x".into(),
            source: std::io::Error::other("boom"),
        };
        assert_eq!(f.to_string(), "/x: boom");
        assert!(std::error::Error::source(&f).is_some());
    }
}

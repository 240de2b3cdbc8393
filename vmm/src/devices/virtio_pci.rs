//! virtio devices on PCI: each device a function on bus 0 behind the host
//! bridge, its BAR placed in the PCI window by `vm-allocator`, its MSI-X
//! vectors routed through KVM (`pci::msi`). The transport is
//! `virtio_devices::PciTransport`; the devices are the same as on
//! virtio-mmio (`super::virtio::build_devices`).
//!
//! Each device runs on its own thread, as on virtio-mmio. Every queue has
//! its own notify address in BAR 0, so each queue's eventfd is an
//! ioeventfd on that address without a datamatch (any write there is a
//! notification of that queue, as the transport itself decides by the
//! address). The ioeventfds follow BAR 0: registered when the guest turns
//! memory decoding on, moved when it moves the BAR, removed when it turns
//! decoding off. Should KVM refuse one, notifications to that BAR exit to
//! the VMM and the transport forwards them to the thread: slower, same
//! behaviour.

use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use virtio_devices::GuestMemoryMmap;
use virtio_devices::pci::{BAR_SIZE, notify_offset};
use virtio_devices::{LogLimit, PciTransport};
use vm_allocator::{AddressAllocator, AllocPolicy};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::virtio::{Attached, Devices, Error, VirtioTransport, build_devices, thread_name};
use crate::bus::{Bus, lock};
use crate::config::VmConfig;
use crate::kvm::layout::{PCI_ECAM_BASE, PCI_ECAM_SIZE, PCI_MMIO_BASE, PCI_MMIO_SIZE};
use crate::pci::host_bridge::HostBridge;
use crate::pci::msi::{DeviceMsi, GsiRouter};
use crate::pci::{
    BarWindow, CONFIG_PORTS, CONFIG_PORTS_LEN, ConfigPorts, Ecam, PciBus, PciFunction,
};
use crate::sandbox::Sandbox;

/// A virtio transport as a function on the PCI bus, with the ioeventfds of
/// its queues.
struct VirtioFunction {
    transport: Arc<Mutex<PciTransport>>,
    notifiers: QueueNotifiers,
}

impl PciFunction for VirtioFunction {
    fn config_read(&self, offset: u64, data: &mut [u8]) {
        lock(&self.transport).config_read(offset, data);
    }

    fn config_write(&mut self, offset: u64, data: &[u8]) {
        let bar = {
            let mut transport = lock(&self.transport);
            transport.config_write(offset, data);
            transport.bar_address()
        };
        self.notifiers.follow(bar);
    }

    fn bar(&self) -> Option<(u64, u64)> {
        lock(&self.transport).bar_address().map(|a| (a, BAR_SIZE))
    }

    fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
        lock(&self.transport).bar_read(offset, data);
    }

    fn bar_write(&mut self, offset: u64, data: &[u8]) {
        lock(&self.transport).bar_write(offset, data);
    }
}

/// One eventfd per queue (the device thread's, duplicated), registered
/// with `KVM_IOEVENTFD` on the queue's notify address while BAR 0 decodes.
struct QueueNotifiers {
    vm: Arc<VmFd>,
    events: Vec<EventFd>,
    /// Where BAR 0 was when they were registered; `None`: not registered.
    registered_at: Option<u64>,
    /// KVM refusing a registration: a guest moving BAR 0 onto another
    /// device's, back and forth, would otherwise log every move.
    refused: LogLimit,
}

impl QueueNotifiers {
    fn address(bar: u64, queue: u16) -> IoEventAddress {
        IoEventAddress::Mmio(bar + notify_offset(queue))
    }

    /// Moves the registrations to BAR 0 at `bar` (`None`: decoding off).
    fn follow(&mut self, bar: Option<u64>) {
        if bar == self.registered_at {
            return;
        }
        if let Some(old) = self.registered_at.take() {
            for (queue, event) in (0u16..).zip(&self.events) {
                if let Err(e) =
                    self.vm
                        .unregister_ioevent(event, &Self::address(old, queue), NoDatamatch)
                    && let Some(suppressed) = self.refused.admit()
                {
                    tracing::error!(
                        suppressed,
                        "virtio-pci: cannot remove the ioeventfd of queue {queue} at BAR {old:#x}: {e}"
                    );
                }
            }
        }
        let Some(new) = bar else {
            return;
        };
        for (queue, event) in (0u16..).zip(&self.events) {
            if let Err(e) = self
                .vm
                .register_ioevent(event, &Self::address(new, queue), NoDatamatch)
            {
                // The queues registered so far go; every notification to
                // this BAR then exits and is forwarded by the transport.
                if let Some(suppressed) = self.refused.admit() {
                    tracing::warn!(
                        suppressed,
                        "virtio-pci: no ioeventfd for queue {queue} at BAR {new:#x} ({e}): its notifications exit to the VMM"
                    );
                }
                for (done, event) in (0u16..).zip(&self.events).take(usize::from(queue)) {
                    let _ =
                        self.vm
                            .unregister_ioevent(event, &Self::address(new, done), NoDatamatch);
                }
                return;
            }
        }
        self.registered_at = Some(new);
    }
}

/// One eventfd per queue, and a duplicate of each for the registrations.
fn queue_events(queues: usize) -> Result<(Vec<EventFd>, Vec<EventFd>), Error> {
    let io = |what: &str| {
        let what = format!("virtio-pci queue eventfd: {what}");
        move |source| Error::Io { what, source }
    };
    let mut thread = Vec::with_capacity(queues);
    let mut registered = Vec::with_capacity(queues);
    for _ in 0..queues {
        let event = EventFd::new(EFD_NONBLOCK).map_err(io("eventfd"))?;
        registered.push(event.try_clone().map_err(io("dup"))?);
        thread.push(event);
    }
    Ok((thread, registered))
}

/// Builds the host bridge and the configured devices (each on its own
/// thread, which enters `sandbox`), and puts the configuration space (ECAM,
/// 0xCF8/0xCFC) and the BAR window on the buses.
pub(crate) fn attach(
    config: &VmConfig,
    vm: &Arc<VmFd>,
    mem: &GuestMemoryMmap,
    pio: &mut Bus,
    mmio: &mut Bus,
    sandbox: &Arc<Sandbox>,
) -> Result<Attached, Error> {
    let Devices {
        devices,
        counters,
        disks,
    } = build_devices(config)?;
    let setup = |e: &dyn std::fmt::Display| Error::Setup(e.to_string());
    let router = Arc::new(GsiRouter::new(vm.clone()));
    let mut allocator =
        AddressAllocator::new(PCI_MMIO_BASE, PCI_MMIO_SIZE).map_err(|e| setup(&e))?;
    let mut bus = PciBus::new();
    bus.add(Arc::new(Mutex::new(HostBridge::new())));
    let mut transports = Vec::with_capacity(devices.len());
    for device in devices {
        let queues = device.queue_max_sizes().len();
        let msi = DeviceMsi::new(router.clone(), queues + 1).map_err(|e| setup(&e))?;
        let bar = allocator
            .allocate(BAR_SIZE, BAR_SIZE, AllocPolicy::FirstMatch)
            .map_err(|e| setup(&e))?;
        let (thread_events, registered) = queue_events(queues)?;
        let name = thread_name(device.device_type());
        let transport = PciTransport::with_thread(
            &name,
            device,
            mem.clone(),
            Arc::new(msi),
            bar.start(),
            thread_events,
            sandbox.clone(),
        )
        .map_err(|source| Error::Io {
            what: format!("{name} device thread"),
            source,
        })?;
        let transport = Arc::new(Mutex::new(transport));
        let function = VirtioFunction {
            transport: transport.clone(),
            notifiers: QueueNotifiers {
                vm: vm.clone(),
                events: registered,
                registered_at: None,
                refused: LogLimit::new(),
            },
        };
        bus.add(Arc::new(Mutex::new(function)))
            .ok_or(Error::TooMany(transports.len() + 1))?;
        transports.push(VirtioTransport::Pci(transport));
    }
    let bus = Arc::new(bus);
    pio.insert(
        CONFIG_PORTS,
        CONFIG_PORTS_LEN,
        Arc::new(Mutex::new(ConfigPorts::new(bus.clone()))),
    )
    .map_err(|e| setup(&e))?;
    mmio.insert(
        PCI_ECAM_BASE,
        PCI_ECAM_SIZE,
        Arc::new(Mutex::new(Ecam(bus.clone()))),
    )
    .map_err(|e| setup(&e))?;
    mmio.insert(
        PCI_MMIO_BASE,
        PCI_MMIO_SIZE,
        Arc::new(Mutex::new(BarWindow::new(bus, PCI_MMIO_BASE))),
    )
    .map_err(|e| setup(&e))?;
    Ok(Attached {
        transports,
        counters,
        disks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether an ioeventfd (any length, no datamatch) is registered at
    /// `address`: KVM refuses a second one there with EEXIST.
    fn registered(vm: &VmFd, address: u64) -> bool {
        let probe = EventFd::new(EFD_NONBLOCK).unwrap();
        let at = IoEventAddress::Mmio(address);
        match vm.register_ioevent(&probe, &at, NoDatamatch) {
            Ok(()) => {
                vm.unregister_ioevent(&probe, &at, NoDatamatch).unwrap();
                false
            }
            Err(e) => {
                assert_eq!(e.errno(), libc::EEXIST, "KVM_IOEVENTFD at {address:#x}");
                true
            }
        }
    }

    #[test]
    fn the_queue_ioeventfds_follow_bar_0() {
        let kvm = kvm_ioctls::Kvm::new().expect("these tests need /dev/kvm");
        let vm = Arc::new(kvm.create_vm().expect("KVM_CREATE_VM"));
        let (_thread, events) = queue_events(2).unwrap();
        let mut notifiers = QueueNotifiers {
            vm: vm.clone(),
            events,
            registered_at: None,
            refused: LogLimit::new(),
        };
        let (first, moved) = (PCI_MMIO_BASE, PCI_MMIO_BASE + BAR_SIZE);
        let queues = |bar: u64| (0..2).map(move |q| bar + notify_offset(q));

        notifiers.follow(Some(first));
        assert!(queues(first).all(|a| registered(&vm, a)));
        // Nothing between the queues' slots.
        assert!(!registered(&vm, first + notify_offset(0) + 2));

        notifiers.follow(Some(moved));
        assert!(queues(first).all(|a| !registered(&vm, a)));
        assert!(queues(moved).all(|a| registered(&vm, a)));

        // Memory decoding off: no ioeventfd anywhere.
        notifiers.follow(None);
        assert!(queues(moved).all(|a| !registered(&vm, a)));
        notifiers.follow(Some(moved));
        assert!(queues(moved).all(|a| registered(&vm, a)));
    }

    /// A guest moving a BAR onto another device's, again and again: KVM refuses
    /// each registration, and the log gets the first refusals, not one per move.
    #[test]
    fn bar_moves_onto_another_device_are_logged_at_a_bounded_rate() {
        let kvm = kvm_ioctls::Kvm::new().expect("these tests need /dev/kvm");
        let vm = Arc::new(kvm.create_vm().expect("KVM_CREATE_VM"));
        let notifiers = |vm: &Arc<VmFd>| QueueNotifiers {
            vm: vm.clone(),
            events: queue_events(1).unwrap().1,
            registered_at: None,
            refused: LogLimit::new(),
        };
        let (mut first, mut second) = (notifiers(&vm), notifiers(&vm));
        first.follow(Some(PCI_MMIO_BASE));
        let capture = virtio_devices::LogCapture::default();
        tracing::subscriber::with_default(capture.clone(), || {
            for _ in 0..1000 {
                second.follow(Some(PCI_MMIO_BASE));
                second.follow(None);
            }
        });
        assert_eq!(second.registered_at, None);
        let lines = capture.lines_with("no ioeventfd for queue 0");
        assert_eq!(
            u32::try_from(lines.len()),
            Ok(virtio_devices::LOG_BURST),
            "{lines:#?}"
        );
    }
}

//! MSI-X through KVM: every vector of every device gets its own GSI, an
//! irqfd registered on it once, and a route (`KVM_SET_GSI_ROUTING`) that
//! follows the message the guest programs. Sending a vector is an eventfd
//! write, as for the legacy lines.
//!
//! `KVM_SET_GSI_ROUTING` replaces the whole table, so the router keeps it:
//! the IOAPIC and PIC pins KVM routes by default (GSIs 0-23), then one MSI
//! route per programmed vector.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KvmIrqRouting, kvm_irq_routing_entry,
};
use kvm_ioctls::VmFd;
use virtio_devices::{MsiInterrupts, MsiMessage};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::bus::lock;
use crate::kvm::{self, kvm_err};

/// GSIs below this are IOAPIC pins.
const IOAPIC_PINS: u32 = 24;
/// The PIC's pins are the first 16 GSIs.
const PIC_PINS: u32 = 16;

/// The VM's GSI routing table and the GSIs handed out for MSI.
pub(crate) struct GsiRouter {
    vm: Arc<VmFd>,
    state: Mutex<RouterState>,
}

struct RouterState {
    next_gsi: u32,
    msi_routes: BTreeMap<u32, MsiMessage>,
}

impl GsiRouter {
    pub(crate) fn new(vm: Arc<VmFd>) -> Self {
        GsiRouter {
            vm,
            state: Mutex::new(RouterState {
                next_gsi: IOAPIC_PINS,
                msi_routes: BTreeMap::new(),
            }),
        }
    }

    fn allocate(&self) -> u32 {
        let mut state = lock(&self.state);
        let gsi = state.next_gsi;
        state.next_gsi += 1;
        gsi
    }

    /// Sets (or removes) the MSI route of `gsi` and installs the table.
    fn route(&self, gsi: u32, message: Option<MsiMessage>) -> std::io::Result<()> {
        let mut state = lock(&self.state);
        match message {
            Some(m) => state.msi_routes.insert(gsi, m),
            None => state.msi_routes.remove(&gsi),
        };
        let table = routing_table(&state.msi_routes);
        let mut routing = KvmIrqRouting::new(0).map_err(std::io::Error::other)?;
        for entry in table {
            routing.push(entry).map_err(std::io::Error::other)?;
        }
        self.vm
            .set_gsi_routing(&routing)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
    }
}

/// KVM's default pin routes plus the MSI routes.
fn routing_table(msi: &BTreeMap<u32, MsiMessage>) -> Vec<kvm_irq_routing_entry> {
    let mut table = Vec::new();
    let pin = |gsi: u32, chip: u32, pin: u32| {
        let mut e = kvm_irq_routing_entry {
            gsi,
            type_: KVM_IRQ_ROUTING_IRQCHIP,
            ..Default::default()
        };
        e.u.irqchip.irqchip = chip;
        e.u.irqchip.pin = pin;
        e
    };
    for gsi in 0..IOAPIC_PINS {
        if gsi < PIC_PINS {
            let (chip, p) = if gsi < 8 {
                (KVM_IRQCHIP_PIC_MASTER, gsi)
            } else {
                (KVM_IRQCHIP_PIC_SLAVE, gsi - 8)
            };
            table.push(pin(gsi, chip, p));
        }
        table.push(pin(gsi, KVM_IRQCHIP_IOAPIC, gsi));
    }
    for (&gsi, message) in msi {
        let mut e = kvm_irq_routing_entry {
            gsi,
            type_: KVM_IRQ_ROUTING_MSI,
            ..Default::default()
        };
        let [a0, a1, a2, a3, a4, a5, a6, a7] = message.address.to_le_bytes();
        e.u.msi.address_lo = u32::from_le_bytes([a0, a1, a2, a3]);
        e.u.msi.address_hi = u32::from_le_bytes([a4, a5, a6, a7]);
        e.u.msi.data = message.data;
        table.push(e);
    }
    table
}

/// One device's MSI-X vectors: a GSI and an irqfd each.
pub(crate) struct DeviceMsi {
    router: Arc<GsiRouter>,
    vectors: Vec<(u32, EventFd)>,
}

impl DeviceMsi {
    pub(crate) fn new(router: Arc<GsiRouter>, count: usize) -> kvm::Result<Self> {
        let mut vectors = Vec::with_capacity(count);
        for _ in 0..count {
            let gsi = router.allocate();
            let event =
                EventFd::new(EFD_NONBLOCK).map_err(|e| kvm::Error::Io("MSI-X eventfd", e))?;
            router
                .vm
                .register_irqfd(&event, gsi)
                .map_err(kvm_err("KVM_IRQFD"))?;
            vectors.push((gsi, event));
        }
        Ok(DeviceMsi { router, vectors })
    }
}

impl MsiInterrupts for DeviceMsi {
    fn set_route(&self, vector: u16, message: Option<MsiMessage>) -> std::io::Result<()> {
        match self.vectors.get(usize::from(vector)) {
            Some((gsi, _)) => self.router.route(*gsi, message),
            None => Ok(()),
        }
    }

    fn trigger(&self, vector: u16) -> std::io::Result<()> {
        match self.vectors.get(usize::from(vector)) {
            Some((_, event)) => event.write(1),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_keeps_the_default_pins_and_adds_msi_routes() {
        let mut msi = BTreeMap::new();
        msi.insert(
            30,
            MsiMessage {
                address: 0x1_fee0_0000,
                data: 0x41,
            },
        );
        let table = routing_table(&msi);
        // 16 PIC pins, 24 IOAPIC pins, one MSI route.
        assert_eq!(table.len(), 16 + 24 + 1);
        let last = table.last().unwrap();
        assert_eq!((last.gsi, last.type_), (30, KVM_IRQ_ROUTING_MSI));
        // SAFETY: the entry was built as an MSI route.
        let m = unsafe { last.u.msi };
        assert_eq!((m.address_lo, m.address_hi, m.data), (0xfee0_0000, 1, 0x41));
        let ioapic_pins = table
            .iter()
            .filter(|e| {
                e.type_ == KVM_IRQ_ROUTING_IRQCHIP
                    // SAFETY: irqchip entries were built as such.
                    && unsafe { e.u.irqchip.irqchip } == KVM_IRQCHIP_IOAPIC
            })
            .count();
        assert_eq!(ioapic_pins, 24);
    }
}

use super::*;
use crate::rng::Rng;
use crate::testing::{Desc, GuestDriver, test_memory};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};

const BAR: u64 = 0xe100_0000;

/// What the VMM side saw: routes set and vectors sent.
#[derive(Default)]
struct Recorder {
    routes: Mutex<Vec<(u16, Option<MsiMessage>)>>,
    sent: Mutex<Vec<u16>>,
}

impl MsiInterrupts for Recorder {
    fn set_route(&self, vector: u16, message: Option<MsiMessage>) -> std::io::Result<()> {
        self.routes.lock().unwrap().push((vector, message));
        Ok(())
    }
    fn trigger(&self, vector: u16) -> std::io::Result<()> {
        self.sent.lock().unwrap().push(vector);
        Ok(())
    }
}

fn setup(mem: &GuestMemoryMmap) -> (PciTransport, Arc<Recorder>) {
    let msi = Arc::new(Recorder::default());
    let t = PciTransport::new(Box::new(Rng::new()), mem.clone(), msi.clone(), BAR);
    (t, msi)
}

fn cfg32(t: &PciTransport, at: u64) -> u32 {
    let mut b = [0u8; 4];
    t.config_read(at, &mut b);
    u32::from_le_bytes(b)
}

fn bar_w(t: &mut PciTransport, at: u64, v: u64, len: usize) {
    t.bar_write(at, &v.to_le_bytes()[..len]);
}

fn bar_r(t: &mut PciTransport, at: u64, len: usize) -> u64 {
    let mut b = [0u8; 8];
    t.bar_read(at, &mut b[..len]);
    u64::from_le_bytes(b)
}

/// Walks the capability list: (id, offset) pairs, bounded.
fn capabilities(t: &PciTransport) -> Vec<(u8, u64)> {
    let mut caps = Vec::new();
    let mut at = u64::from(cfg32(t, 0x34).to_le_bytes()[0]);
    while at != 0 && caps.len() < 16 {
        let head = cfg32(t, at);
        caps.push((head.to_le_bytes()[0], at));
        at = u64::from(head.to_le_bytes()[1]);
    }
    caps
}

fn enable_memory(t: &mut PciTransport) {
    t.config_write(0x04, &0x0006u16.to_le_bytes());
}

/// Driver bring-up through the common configuration, one queue.
fn bring_up(t: &mut PciTransport, q: &GuestDriver) {
    let status = |s: u32| u64::from(s);
    bar_w(t, 0x14, 0, 1);
    bar_w(t, 0x14, status(VIRTIO_CONFIG_S_ACKNOWLEDGE), 1);
    bar_w(
        t,
        0x14,
        status(VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER),
        1,
    );
    bar_w(t, 0x00, 1, 4);
    assert_eq!(bar_r(t, 0x04, 4) & 1, 1, "VERSION_1 offered");
    bar_w(t, 0x08, 1, 4);
    bar_w(t, 0x0c, 1, 4);
    assert_eq!(bar_r(t, 0x0c, 4), 1, "driver features read back");
    let ok = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK;
    bar_w(t, 0x14, status(ok), 1);
    assert_eq!(bar_r(t, 0x14, 1), u64::from(ok));
    bar_w(t, 0x16, 0, 2);
    bar_w(t, 0x18, u64::from(q.size()), 2);
    bar_w(t, 0x20, q.desc_table(), 4);
    bar_w(t, 0x28, q.avail_ring(), 4);
    bar_w(t, 0x30, q.used_ring(), 4);
    bar_w(t, 0x1a, 1, 2); // queue 0 -> vector 1
    bar_w(t, 0x10, 0, 2); // config -> vector 0
    bar_w(t, 0x1c, 1, 2);
    bar_w(t, 0x14, status(ok | VIRTIO_CONFIG_S_DRIVER_OK), 1);
}

#[test]
fn the_function_identifies_itself_and_describes_its_registers() {
    let mem = test_memory();
    let (t, _) = setup(&mem);
    assert_eq!(cfg32(&t, 0), 0x1044_1af4, "virtio vendor, modern rng id");
    assert_eq!(cfg32(&t, 0x08) & 0xff, 1, "revision 1");
    assert_ne!(cfg32(&t, 0x04) >> 16 & u32::from(STATUS_CAP_LIST), 0);
    let caps = capabilities(&t);
    let ids: Vec<u8> = caps.iter().map(|c| c.0).collect();
    assert_eq!(ids, [0x11, 0x09, 0x09, 0x09, 0x09]);
    let types: Vec<u32> = caps[1..]
        .iter()
        .map(|&(_, at)| cfg32(&t, at) >> 24)
        .collect();
    assert_eq!(types, [1, 3, 4, 2], "common, ISR, device, notify");
    let notify = caps[4].1;
    assert_eq!(cfg32(&t, notify + 16), NOTIFY_MULTIPLIER);
    // MSI-X: two vectors (one queue plus configuration), table in BAR 0.
    let msix = caps[0].1;
    assert_eq!((cfg32(&t, msix) >> 16) & 0x7ff, 1);
    assert_eq!(
        cfg32(&t, msix + 4),
        const { int_cast::u32_of_u64(MSIX_TABLE_OFFSET) }
    );
    // Past the defined space: zero, not a panic.
    assert_eq!(cfg32(&t, 0xffc), 0);
    assert_eq!(cfg32(&t, u64::MAX - 1), 0);
}

#[test]
fn bar_sizing_and_relocation_follow_the_guest() {
    let mem = test_memory();
    let (mut t, _) = setup(&mem);
    assert_eq!(t.bar_address(), None, "memory decoding off at reset");
    enable_memory(&mut t);
    assert_eq!(t.bar_address(), Some(BAR));
    t.config_write(0x10, &u32::MAX.to_le_bytes());
    assert_eq!(
        cfg32(&t, 0x10),
        !(const { int_cast::u32_of_u64(BAR_SIZE) } - 1) | BAR_MEM64
    );
    t.config_write(0x10, &0xe200_0000u32.to_le_bytes());
    t.config_write(0x14, &1u32.to_le_bytes());
    assert_eq!(t.bar_address(), Some(0x1_e200_0000));
    // Read-only fields stay.
    t.config_write(0x00, &0u32.to_le_bytes());
    t.config_write(0x34, &[0x99]);
    assert_eq!(cfg32(&t, 0), 0x1044_1af4);
    assert_eq!(cfg32(&t, 0x34) & 0xff, 0x40);
}

#[test]
fn a_driver_gets_entropy_and_an_msix_interrupt() {
    let mem = test_memory();
    let (mut t, msi) = setup(&mem);
    enable_memory(&mut t);
    let mut q = GuestDriver::new(&mem, 8);
    bring_up(&mut t, &q);
    assert_eq!(bar_r(&mut t, 0x1a, 2), 1, "queue vector kept");
    // Program both vectors, enable MSI-X: the routes reach the VMM.
    for v in 0..2u64 {
        bar_w(&mut t, MSIX_TABLE_OFFSET + 16 * v, 0xfee0_0000, 8);
        bar_w(&mut t, MSIX_TABLE_OFFSET + 16 * v + 8, 0x30 + v, 4);
        bar_w(&mut t, MSIX_TABLE_OFFSET + 16 * v + 12, 0, 4);
    }
    let routes = msi.routes.lock().unwrap().clone();
    for v in 0..2u16 {
        let last = routes.iter().rev().find(|r| r.0 == v).unwrap();
        let message = MsiMessage {
            address: 0xfee0_0000,
            data: 0x30 + u32::from(v),
        };
        assert_eq!(last.1, Some(message));
    }
    t.config_write(MSIX_CONTROL as u64, &MSIX_ENABLE.to_le_bytes());
    q.add_chain(&[Desc::write(0x10_0000, 16)]);
    bar_w(&mut t, NOTIFY_OFFSET, 0, 2);
    assert_eq!(q.used_idx(), 1);
    assert_eq!(q.used_elem(0).1, 16);
    assert_eq!(*msi.sent.lock().unwrap(), [1], "the queue's vector");
    // ISR read returns the cause and clears it.
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 1), 1);
    assert_eq!(bar_r(&mut t, ISR_OFFSET, 1), 0);
}

#[test]
fn masked_vectors_wait_in_the_pending_bits() {
    let mem = test_memory();
    let (mut t, msi) = setup(&mem);
    enable_memory(&mut t);
    let mut q = GuestDriver::new(&mem, 8);
    bring_up(&mut t, &q);
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16, 0xfee0_0000, 8);
    t.config_write(MSIX_CONTROL as u64, &MSIX_ENABLE.to_le_bytes());
    // Entry 1 still masked (reset state).
    q.add_chain(&[Desc::write(0x10_0000, 8)]);
    bar_w(&mut t, NOTIFY_OFFSET, 0, 2);
    assert!(msi.sent.lock().unwrap().is_empty());
    assert_eq!(bar_r(&mut t, MSIX_PBA_OFFSET, 8), 0b10);
    bar_w(&mut t, MSIX_TABLE_OFFSET + 16 + 12, 0, 4);
    assert_eq!(*msi.sent.lock().unwrap(), [1]);
    assert_eq!(bar_r(&mut t, MSIX_PBA_OFFSET, 8), 0);
    // Function mask holds everything back too.
    t.config_write(
        MSIX_CONTROL as u64,
        &(MSIX_ENABLE | MSIX_FUNCTION_MASK).to_le_bytes(),
    );
    q.add_chain(&[Desc::write(0x10_0000, 8)]);
    bar_w(&mut t, NOTIFY_OFFSET, 0, 2);
    assert_eq!(msi.sent.lock().unwrap().len(), 1);
    t.config_write(MSIX_CONTROL as u64, &MSIX_ENABLE.to_le_bytes());
    assert_eq!(*msi.sent.lock().unwrap(), [1, 1]);
}

#[test]
fn vectors_out_of_range_read_back_as_no_vector() {
    let mem = test_memory();
    let (mut t, _) = setup(&mem);
    bar_w(&mut t, 0x10, 7, 2);
    assert_eq!(bar_r(&mut t, 0x10, 2), u64::from(NO_VECTOR));
    bar_w(&mut t, 0x16, 0, 2);
    bar_w(&mut t, 0x1a, 2, 2);
    assert_eq!(bar_r(&mut t, 0x1a, 2), u64::from(NO_VECTOR));
    // A queue that does not exist reads as zero.
    bar_w(&mut t, 0x16, 5, 2);
    assert_eq!(bar_r(&mut t, 0x18, 2), 0);
    assert_eq!(bar_r(&mut t, 0x12, 2), 1, "num_queues");
}

#[test]
fn the_inner_rules_hold_queue_changes_after_driver_ok_are_ignored() {
    let mem = test_memory();
    let (mut t, _) = setup(&mem);
    enable_memory(&mut t);
    let q = GuestDriver::new(&mem, 8);
    bring_up(&mut t, &q);
    bar_w(&mut t, 0x18, 2, 2);
    assert_eq!(bar_r(&mut t, 0x18, 2), 8, "size after DRIVER_OK unchanged");
    // A notification for a queue the device lacks changes nothing.
    bar_w(&mut t, NOTIFY_OFFSET + 4 * 9, 9, 2);
    assert_eq!(t.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    // Reset forgets sizes and vectors.
    bar_w(&mut t, 0x14, 0, 1);
    assert_eq!(bar_r(&mut t, 0x1a, 2), u64::from(NO_VECTOR));
    assert_eq!(t.status(), 0);
}

#[test]
fn random_register_traffic_never_panics() {
    let mem = test_memory();
    let (mut t, _) = setup(&mem);
    let mut seed = 0x2545_f491u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let r = next();
        let len = [1usize, 2, 4, 8][(r & 3) as usize];
        let value = next();
        if r & 4 == 0 {
            let offset = (r >> 8) % 0x1100;
            t.config_write(offset, &value.to_le_bytes()[..len]);
            let mut b = [0u8; 8];
            t.config_read(offset, &mut b[..len]);
        } else {
            let offset = (r >> 8) % BAR_SIZE;
            t.bar_write(offset, &value.to_le_bytes()[..len]);
            let mut b = [0u8; 8];
            t.bar_read(offset, &mut b[..len]);
        }
    }
}

/// A function the guest has just set up for a migration's tests: MSI-X vector 0
/// programmed, the driver's status up to FEATURES_OK.
fn saved_state(mem: &GuestMemoryMmap) -> PciState {
    let (mut t, _) = setup(mem);
    bar_w(&mut t, MSIX_TABLE_OFFSET, 0xfee0_0000, 8);
    bar_w(&mut t, MSIX_TABLE_OFFSET + 8, 0x41, 4);
    t.save().expect("an RNG can be saved")
}

#[test]
fn a_saved_function_restores_into_a_new_one_with_its_msix_routed_again() {
    let mem = test_memory();
    let state = saved_state(&mem);
    let (mut target, msi) = setup(&mem);
    msi.routes.lock().unwrap().clear();
    target.restore(&state).expect("the same device");
    assert_eq!(target.save().unwrap(), state);
    let routes = msi.routes.lock().unwrap().clone();
    assert!(
        routes.contains(&(
            0,
            Some(MsiMessage {
                address: 0xfee0_0000,
                data: 0x41
            })
        )),
        "{routes:?}"
    );
}

#[test]
fn a_restore_refuses_what_no_driver_could_have_set_and_leaves_the_function_untouched() {
    let mem = test_memory();
    let state = saved_state(&mem);
    let fresh = setup(&mem).0.save().unwrap();
    let refused = |change: &dyn Fn(&mut PciState)| {
        let mut bad = state.clone();
        change(&mut bad);
        let (mut target, _) = setup(&mem);
        let err = target.restore(&bad).expect_err("refused");
        assert_eq!(target.save().unwrap(), fresh, "{err}: the function changed");
        err
    };
    const DRIVER_OK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE
        | VIRTIO_CONFIG_S_DRIVER
        | VIRTIO_CONFIG_S_FEATURES_OK
        | VIRTIO_CONFIG_S_DRIVER_OK;
    // Bits of configuration space no driver writes: the device ID, BAR 0's size bits,
    // the MSI-X table size.
    assert!(refused(&|s| s.config[2] ^= 1).contains("no driver can write"));
    assert!(refused(&|s| s.config[0x11] |= 0x7f).contains("no driver can write"));
    assert!(refused(&|s| s.config[0x42] |= 7).contains("no driver can write"));
    assert!(refused(&|s| s.config.truncate(64)).contains("configuration space of 64"));
    assert!(refused(&|s| s.msix_enabled = !s.msix_enabled).contains("control register"));
    assert!(refused(&|s| s.queue_vectors[0] = 7).contains("MSI-X"));
    assert!(refused(&|s| s.msix_entries.push(Default::default())).contains("MSI-X"));
    assert!(refused(&|s| s.queue_sizes.push(8)).contains("queue sizes"));
    assert!(refused(&|s| s.transport.queues.clear()).contains("0 queues"));
    assert!(refused(&|s| s.transport.interrupt_status = 0x80).contains("interrupt status"));
    assert!(
        refused(&|s| {
            s.transport.status = VIRTIO_CONFIG_S_FEATURES_OK;
            s.transport.acked_features = u64::MAX;
        })
        .contains("does not offer")
    );
    // Running exactly when activated.
    assert!(refused(&|s| s.transport.activated = true).contains("activated"));
    assert!(refused(&|s| s.transport.status = DRIVER_OK).contains("not activated"));
    // Activated with a ring outside guest memory: checked as a driver's would be.
    assert!(
        refused(&|s| {
            s.transport.status = DRIVER_OK;
            s.transport.activated = true;
            s.transport.positions = vec![(0, 0)];
            s.transport.queues[0] = crate::transport::mmio::QueueRegisters {
                size: 8,
                ready: true,
                desc: u64::MAX - 0xfff,
                avail: 0x1000,
                used: 0x2000,
            };
        })
        .contains("queue 0")
    );
    // What a driver may leave mid-way is taken: acked features before FEATURES_OK, a
    // queue selected past the device's.
    let mut odd = state.clone();
    odd.transport.acked_features = u64::MAX;
    odd.queue_select = 7;
    setup(&mem)
        .0
        .restore(&odd)
        .expect("a driver may write these");
}

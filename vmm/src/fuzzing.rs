//! Entry points shared by the fuzz targets (vmm/fuzz) and the deterministic
//! random tests in the normal test suite: guest port I/O on the legacy
//! devices, which a guest controls completely, and the receiving side of a
//! live migration's stream, which whoever reaches the target's socket does.

use std::io::Read;
use std::sync::{Arc, Mutex};

use virtio_devices::GuestMemoryMmap;
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::acpi::platform::{self, AcpiPlatform};
use crate::bus::{Bus, lock};
use crate::config::SerialTarget;
use crate::devices::irq::{IrqLine, LevelIrqLine};
use crate::devices::legacy::exit_port::ExitPort;
use crate::devices::legacy::i8042::I8042;
use crate::devices::legacy::rtc::Rtc;
use crate::devices::legacy::serial::Console;
use crate::devices::legacy::*;
use crate::lifecycle::Control;
use crate::migration::{self, MigrationError};
use crate::wire::{self, Decoder, FormatError, Layout};
use block::{DirtyTracked, DiskError, SharedDisk};

/// Ports worth hitting: every legacy register and the bytes around them.
const PORTS: [u16; 15] = [
    0x3f8, 0x3f9, 0x3fa, 0x3fb, 0x3fc, 0x3fd, 0x3ff, 0x400, 0x60, 0x64, 0x65, 0xf4, 0x70, 0x71,
    0x72,
];

/// After a migration: the legacy ports and the ACPI platform's (sleep control,
/// reset, GED status), whose state came from the stream.
const RESTORED_PORTS: [u16; 18] = [
    0x3f8, 0x3f9, 0x3fa, 0x3fb, 0x3fc, 0x3fd, 0x3ff, 0x400, 0x60, 0x64, 0x65, 0xf4, 0x70, 0x71,
    0x72, 0x600, 0x604, 0x608,
];

thread_local! {
    /// The ACPI platform device, one per thread rather than one per input: its GED
    /// line runs a thread of its own, which would outlive each input for a moment
    /// (libFuzzer then takes the allocations it has not freed yet for a leak and
    /// scans the whole heap, 20 times slower). Its whole state, the pending events,
    /// comes from the stream before it is used ([`Legacy::restore`]).
    static ACPI: Arc<Mutex<AcpiPlatform>> = {
        // The resamplefd blocks, as KVM's: the line's thread waits on it until the
        // line is dropped.
        let irqfd = EventFd::new(EFD_NONBLOCK).expect("eventfd");
        let resample = EventFd::new(0).expect("eventfd");
        let ged = LevelIrqLine::unregistered(irqfd, resample).expect("GED line");
        Arc::new(Mutex::new(AcpiPlatform::new(Arc::new(Control::new(1)), ged)))
    };
}

/// The legacy devices of a VM, built without KVM (interrupt lines on plain
/// eventfds) and attached to a port bus as a VM attaches them.
struct Legacy {
    console: Console,
    i8042: Arc<Mutex<I8042>>,
    rtc: Arc<Mutex<Rtc>>,
    /// Only for the migration target: this thread's ([`ACPI`]).
    acpi: Option<Arc<Mutex<AcpiPlatform>>>,
    bus: Bus,
}

impl Legacy {
    fn new(with_acpi: bool) -> Legacy {
        let control = Arc::new(Control::new(1));
        let line = |gsi| IrqLine::from_eventfd(gsi, EventFd::new(EFD_NONBLOCK).expect("eventfd"));
        let sandbox =
            crate::sandbox::Sandbox::new(crate::sandbox::SandboxConfig::disabled(), Vec::new())
                .expect("no filters to build");
        let console = Console::new(
            &SerialTarget::Null,
            line(SERIAL_GSI),
            sandbox,
            Default::default(),
        )
        .expect("null console");
        let i8042 = Arc::new(Mutex::new(I8042::new(control.clone(), line(I8042_GSI))));
        let rtc = Arc::new(Mutex::new(Rtc::new(0)));
        let mut bus = Bus::new("fuzz");
        bus.insert(SERIAL_PORT, SERIAL_PORT_LEN, console.device.clone())
            .expect("free range");
        bus.insert(I8042_PORT, I8042_PORT_LEN, i8042.clone())
            .expect("free range");
        bus.insert(
            EXIT_PORT,
            EXIT_PORT_LEN,
            Arc::new(Mutex::new(ExitPort::new(control))),
        )
        .expect("free range");
        bus.insert(RTC_PORT, RTC_PORT_LEN, rtc.clone())
            .expect("free range");
        let acpi = with_acpi.then(|| {
            let acpi = ACPI.with(Arc::clone);
            bus.insert(platform::PORT_BASE, platform::PORT_LEN, acpi.clone())
                .expect("free range");
            acpi
        });
        Legacy {
            console,
            i8042,
            rtc,
            acpi,
            bus,
        }
    }

    /// Replays `data` as port accesses (op byte, port index, size, value) on
    /// `ports`, with Ctrl-Alt-Del typed on the keyboard as a third op.
    fn replay(&self, ports: &[u16], data: &[u8]) {
        for chunk in data.chunks(4) {
            let [op, port, size, value] = <[u8; 4]>::try_from(chunk).unwrap_or([chunk[0], 0, 1, 0]);
            let port = u64::from(ports[usize::from(port) % ports.len()]);
            let size = [1usize, 2, 4][usize::from(size) % 3];
            match op % 3 {
                0 => self.bus.read(port, &mut vec![0; size]),
                1 => self.bus.write(port, &vec![value; size]),
                _ => lock(&self.i8042).trigger_ctrl_alt_del(),
            }
        }
    }

    /// The devices' part of a platform frame, decoded as `vm::Devices::restore`
    /// does it, in its order: serial, i8042, RTC, ACPI, then (a virtio-pci VM) the
    /// PCI configuration address latch, which is read and dropped here (no host
    /// bridge behind it; any 4 bytes are an address), then nothing more.
    fn restore(&self, devices: &[u8]) -> Result<(), FormatError> {
        let mut d = Decoder::new(devices, "the devices' state");
        lock(&self.console.device).restore(&mut d)?;
        lock(&self.i8042).restore(&mut d)?;
        lock(&self.rtc).restore(&mut d)?;
        if let Some(acpi) = &self.acpi {
            lock(acpi).restore(&mut d)?;
        }
        let _latch: [u8; 4] = d.array()?;
        d.finish()
    }
}

/// Replays `data` as port accesses (op byte, port index, size, value) on
/// the legacy devices behind a bus. Must never panic.
pub fn legacy_port_io(data: &[u8]) {
    Legacy::new(false).replay(&PORTS, data);
}

/// Guest memory of the migration target: 2 MiB, so that page frames can land in it,
/// run past its end and cover it whole.
const TARGET_MEMORY: u64 = 2 << 20;

/// The VM the stream must match: one vCPU (a stream can complete with a single
/// vCPU frame) and the devices a VM without virtio devices has, with the host's
/// CPU (`vm::layout` names them so; migration refuses virtio devices for now).
fn target_layout() -> Layout {
    Layout {
        memory_bytes: TARGET_MEMORY,
        vcpus: 1,
        devices: "transport=pci com1,i8042,rtc,acpi-ged cpu=host".into(),
    }
}

/// The target's disks' size: a writable one (disk 0, copied) and a read-only one
/// (disk 1, shared).
const TARGET_DISK: u64 = 64 * 1024;

/// A disk in memory, for the block copy's frames without a file per input.
struct MemoryDisk {
    data: Mutex<Vec<u8>>,
    read_only: bool,
}

impl MemoryDisk {
    fn range(&self, offset: u64, len: usize) -> Result<std::ops::Range<usize>, DiskError> {
        self.check_range(offset, len as u64)?;
        let start = int_cast::u64_to_usize(offset);
        Ok(start..start + len)
    }
    fn write(&self, offset: u64, len: u64, bytes: Option<&[u8]>) -> Result<(), DiskError> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        let range = self.range(offset, int_cast::u64_to_usize(len))?;
        let mut data = lock(&self.data);
        match bytes {
            Some(bytes) => data[range].copy_from_slice(bytes),
            None => data[range].fill(0),
        }
        Ok(())
    }
}

impl SharedDisk for MemoryDisk {
    fn size(&self) -> u64 {
        TARGET_DISK
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DiskError> {
        let range = self.range(offset, buf.len())?;
        buf.copy_from_slice(&lock(&self.data)[range]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DiskError> {
        self.write(offset, buf.len() as u64, Some(buf))
    }
    fn flush(&self) -> Result<(), DiskError> {
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), DiskError> {
        self.write(offset, len, None)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _: bool) -> Result<(), DiskError> {
        self.write(offset, len, None)
    }
}

fn target_disks() -> [Arc<DirtyTracked>; 2] {
    [false, true].map(|read_only| {
        Arc::new(DirtyTracked::new(Arc::new(MemoryDisk {
            data: Mutex::new(vec![0; int_cast::u64_to_usize(TARGET_DISK)]),
            read_only,
        })))
    })
}

/// Feeds `data` to the receiving side of a live migration, as a target VM
/// reads its socket: `migration::receive_header`, then `migration::receive` into
/// 2 MiB of guest memory (no KVM) and two 64 KiB disks in memory, then, if the stream completed, the devices'
/// state into fresh legacy devices, which then take the rest of `data` as port
/// I/O (as [`legacy_port_io`]); and `data` as the target's reply, as the source
/// reads it. Must never panic; what it allocates is bounded by the format's
/// limits (a frame is 1 MiB at most).
///
/// The first byte chooses how `data` is read, so that most inputs get past the
/// header while the header's own checks stay reachable:
/// - below 128 (every frame kind is): a valid header for the target's layout is
///   put before `data`, which is read whole as frames;
/// - 128 or more: that byte is dropped and the rest is read as the stream itself,
///   header included.
pub fn migration_stream(data: &[u8]) {
    let _ = migration_stream_outcome(data);
}

/// [`migration_stream`], with what became of the stream: refused by `receive`, or
/// received and then the devices' restore's outcome.
fn migration_stream_outcome(data: &[u8]) -> Result<Result<(), FormatError>, MigrationError> {
    let _ = wire::read_reply(&mut &data[..]);
    let layout = target_layout();
    let mut header = Vec::new();
    let body = match data.split_first() {
        Some((&mode, rest)) if mode >= 128 => rest,
        _ => {
            wire::write_header(&mut header, &layout).expect("a short device list");
            data
        }
    };
    let mut stream = header.as_slice().chain(body);
    // As `Vm::receive`: the header is checked before the VM (its memory) is built.
    migration::receive_header(&mut stream, &layout)?;
    let memory =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), int_cast::u64_to_usize(TARGET_MEMORY))])
            .expect("2 MiB of anonymous memory");
    let disks = target_disks();
    let handles = disks.each_ref().map(Arc::downgrade);
    let incoming = migration::receive(&mut stream, &memory, &layout, &handles)?;
    let (_, after_complete) = stream.into_inner();
    let legacy = Legacy::new(true);
    let restored = legacy.restore(&incoming.devices);
    if restored.is_ok() {
        legacy.replay(&RESTORED_PORTS, after_complete);
    }
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use kvm_bindings::{
        KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, kvm_clock_data,
        kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_pit_state2,
        kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
    };

    use super::*;
    use crate::wire::{Encoder, Kind};

    #[test]
    fn random_port_io_never_panics() {
        // xorshift: the same sequence on every run.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            let data: Vec<u8> = (0..512)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state.to_le_bytes()[0]
                })
                .collect();
            super::legacy_port_io(&data);
        }
    }

    /// xorshift: the same sequence on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn index(&mut self, len: usize) -> usize {
            usize::try_from(self.below(u64::try_from(len).unwrap())).unwrap()
        }
        fn byte(&mut self) -> u8 {
            self.next().to_le_bytes()[0]
        }
        fn bytes(&mut self, len: usize) -> Vec<u8> {
            (0..len).map(|_| self.byte()).collect()
        }
        /// Fewer than `max` bytes.
        fn bytes_below(&mut self, max: usize) -> Vec<u8> {
            let len = self.index(max);
            self.bytes(len)
        }
    }

    /// `kind | length | payload`, the length as given (frames the encoder refuses).
    fn frame_with_length(out: &mut Vec<u8>, kind: u8, len: u32, payload: &[u8]) {
        out.push(kind);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(payload);
    }

    fn frame(out: &mut Vec<u8>, kind: Kind, payload: &[u8]) {
        wire::write_frame(out, kind, payload).unwrap();
    }

    /// The interrupt controllers, PIT and clock as `vm_state::save` writes them.
    fn vm_state() -> Vec<u8> {
        let mut e = Encoder::default();
        for chip_id in [
            KVM_IRQCHIP_PIC_MASTER,
            KVM_IRQCHIP_PIC_SLAVE,
            KVM_IRQCHIP_IOAPIC,
        ] {
            e.pod(&kvm_irqchip {
                chip_id,
                ..Default::default()
            });
        }
        e.pod(&kvm_pit_state2::default());
        e.pod(&kvm_clock_data::default());
        e.0
    }

    /// The devices' state as `vm::Devices::save` writes it, after `port_io` (as
    /// [`Legacy::replay`] reads it) on fresh devices; `typed`: with input in the
    /// serial FIFO and the power button pressed.
    fn devices_state(port_io: &[u8], typed: bool) -> Vec<u8> {
        let legacy = Legacy::new(true);
        legacy.replay(&RESTORED_PORTS, port_io);
        if typed {
            lock(&legacy.console.device).enqueue_input(b"typed\n");
            lock(legacy.acpi.as_ref().unwrap()).press_power_button();
        }
        let mut e = Encoder::default();
        lock(&legacy.console.device).save(&mut e);
        lock(&legacy.i8042).save(&mut e);
        lock(&legacy.rtc).save(&mut e);
        lock(legacy.acpi.as_ref().unwrap()).save(&mut e);
        e.bytes(&0x8000_0000u32.to_le_bytes());
        e.0
    }

    /// A vCPU frame's payload as `migration::send` writes it, with `msrs` MSRs.
    fn vcpu_frame(index: u8, msrs: u32) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u8(index);
        e.pod(&kvm_regs::default());
        e.pod(&kvm_sregs::default());
        e.pod(&kvm_xsave::default());
        e.pod(&kvm_xcrs::default());
        e.pod(&kvm_debugregs::default());
        e.pod(&kvm_lapic_state::default());
        e.pod(&kvm_mp_state::default());
        e.pod(&kvm_vcpu_events::default());
        e.u32(msrs);
        for index in 0..msrs {
            e.pod(&kvm_msr_entry {
                index,
                data: 7,
                ..Default::default()
            });
        }
        e.0
    }

    fn pages_frame(gpa: u64, count: u32, fill: u8) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u64(gpa);
        e.u32(count);
        e.bytes(&vec![fill; usize::try_from(count).unwrap() * 4096]);
        e.0
    }

    fn zero_pages_frame(gpa: u64, count: u64) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u64(gpa);
        e.u64(count);
        e.0
    }

    /// The target's disks as a source describes them.
    fn disks_frame() -> Vec<u8> {
        let mut e = Encoder::default();
        e.u8(2);
        e.u64(TARGET_DISK);
        e.u8(0);
        e.u64(TARGET_DISK);
        e.u8(1);
        e.0
    }

    fn disk_data_frame(disk: u8, offset: u64, data: &[u8]) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u8(disk);
        e.u64(offset);
        e.bytes(data);
        e.0
    }

    fn disk_zeroes_frame(disk: u8, offset: u64, len: u64) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u8(disk);
        e.u64(offset);
        e.u64(len);
        e.0
    }

    /// What a source sends after the header: the disks, pages, zero pages, disk
    /// contents, the platform's state and the one vCPU's, then `Complete`.
    fn complete_frames(devices: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame(&mut out, Kind::Disks, &disks_frame());
        frame(&mut out, Kind::Pages, &pages_frame(0x1000, 2, 0xab));
        frame(
            &mut out,
            Kind::DiskData,
            &disk_data_frame(0, 512, &[7; 1024]),
        );
        frame(
            &mut out,
            Kind::DiskZeroes,
            &disk_zeroes_frame(0, 0, TARGET_DISK),
        );
        frame(&mut out, Kind::ZeroPages, &zero_pages_frame(0x10_0000, 16));
        frame(&mut out, Kind::Pages, &pages_frame(0x1f_f000, 1, 0xcd));
        frame(
            &mut out,
            Kind::Platform,
            &[vm_state(), devices.to_vec()].concat(),
        );
        frame(&mut out, Kind::Vcpu, &vcpu_frame(0, 3));
        frame(&mut out, Kind::Complete, &[]);
        out
    }

    fn header(layout: &Layout) -> Vec<u8> {
        let mut out = Vec::new();
        wire::write_header(&mut out, layout).unwrap();
        out
    }

    #[test]
    fn hand_made_streams_reach_the_devices_or_are_refused() {
        let devices = devices_state(&[], false);
        let frames = complete_frames(&devices);
        let restored = |data: &[u8]| matches!(migration_stream_outcome(data), Ok(Ok(())));

        // Frames only: the harness puts the header first (their first byte is a kind).
        assert!(restored(&frames));
        // The whole stream after a byte of 128 or more, the header included.
        let raw = [&[0x80][..], &header(&target_layout()), &frames].concat();
        assert!(restored(&raw));
        // Port I/O on the restored devices after `Complete`: a write and a read
        // of every register.
        let port_io: Vec<u8> = (0..RESTORED_PORTS.len())
            .flat_map(|i| {
                let i = u8::try_from(i).unwrap();
                [1, i, 0, 0x80, 0, i, 2, 0]
            })
            .collect();
        assert!(restored(&[&frames[..], &port_io].concat()));
        // Devices saved in another state (input in the serial FIFO, the clock
        // stopped by status B's SET bit, the i8042's output buffer, the power
        // button pressed).
        let busy = devices_state(
            &[
                1, 12, 0, 0x0b, 1, 13, 0, 0x86, // RTC: index B, SET | binary | 24 h
                2, 0, 0, 0, // Ctrl-Alt-Del on the i8042
            ],
            true,
        );
        assert_ne!(busy, devices);
        assert!(restored(&complete_frames(&busy)));

        let refused = |data: &[u8]| migration_stream_outcome(data).err().unwrap().to_string();
        // Another VM's header.
        let other = Layout {
            vcpus: 2,
            ..target_layout()
        };
        let other_vm = [&[0xff][..], &header(&other), &frames].concat();
        assert!(refused(&other_vm).contains("differ"));
        // Not a stream at all, and one cut short everywhere.
        assert!(refused(&[0x80, b'X']).contains("ends early"));
        assert!(refused(&[0x80; 64]).contains("not a migration stream"));
        for cut in 0..frames.len() {
            if cut % 97 == 0 || cut + 8 > frames.len() {
                assert!(
                    refused(&frames[..cut]).contains("ends early"),
                    "cut at {cut}"
                );
            }
        }
        // The source gives up; or completes without a vCPU.
        let mut aborted = frames[..frames.len() - 5].to_vec();
        frame(&mut aborted, Kind::Abort, &[]);
        assert!(refused(&aborted).contains("gave the migration up"));
        let mut no_vcpu = Vec::new();
        frame(&mut no_vcpu, Kind::Disks, &disks_frame());
        frame(
            &mut no_vcpu,
            Kind::Platform,
            &[vm_state(), devices.clone()].concat(),
        );
        frame(&mut no_vcpu, Kind::Complete, &[]);
        assert!(refused(&no_vcpu).contains("without vCPU 0"));
        // A page frame past the guest's memory.
        let mut beyond = Vec::new();
        frame(
            &mut beyond,
            Kind::Pages,
            &pages_frame(TARGET_MEMORY - 4096, 2, 1),
        );
        assert!(refused(&beyond).contains("not guest memory"));
        // The disks: missing, described otherwise, twice; their data before their
        // description, on the read-only (shared) disk, on a disk that is not there,
        // not in whole sectors, past the end.
        let without_disks = &frames[5 + disks_frame().len()..];
        assert!(refused(without_disks).contains("disk data before the disks frame"));
        let mut other_disks = disks_frame();
        other_disks[1] = 1; // 64 KiB + 1 byte
        let mut differ = Vec::new();
        frame(&mut differ, Kind::Disks, &other_disks);
        assert!(refused(&differ).contains("disk 0: the source's has 65537 bytes"));
        let disk_frames = |frames: &[(Kind, Vec<u8>)]| {
            let mut out = Vec::new();
            frame(&mut out, Kind::Disks, &disks_frame());
            for (kind, payload) in frames {
                frame(&mut out, *kind, payload);
            }
            out
        };
        for (frames, why) in [
            (vec![(Kind::Disks, disks_frame())], "a second disks frame"),
            (
                vec![(Kind::DiskData, disk_data_frame(1, 0, &[1; 512]))],
                "disk 1 is read-only",
            ),
            (
                vec![(Kind::DiskZeroes, disk_zeroes_frame(2, 0, 512))],
                "disk 2 of a VM with 2 disks",
            ),
            (
                vec![(Kind::DiskData, disk_data_frame(0, 1, &[1; 512]))],
                "not whole sectors",
            ),
            (
                vec![(Kind::DiskData, disk_data_frame(0, 0, &[1; 100]))],
                "not whole sectors",
            ),
            (
                vec![(Kind::DiskZeroes, disk_zeroes_frame(0, 512, TARGET_DISK))],
                "not whole sectors inside it",
            ),
            (
                vec![(Kind::DiskZeroes, disk_zeroes_frame(0, u64::MAX - 511, 1024))],
                "not whole sectors inside it",
            ),
            (
                vec![(Kind::DiskZeroes, disk_zeroes_frame(0, 0, 0))],
                "not whole sectors",
            ),
        ] {
            let reason = refused(&disk_frames(&frames));
            assert!(reason.contains(why), "{why}: {reason}");
        }
        let mut no_disks = Vec::new();
        frame(
            &mut no_disks,
            Kind::Platform,
            &[vm_state(), devices.clone()].concat(),
        );
        frame(&mut no_disks, Kind::Vcpu, &vcpu_frame(0, 3));
        frame(&mut no_disks, Kind::Complete, &[]);
        assert!(refused(&no_disks).contains("complete without the disks frame"));

        // The devices' bytes are checked by the devices: cut short or one too many.
        let short = complete_frames(&devices[..devices.len() - 1]);
        assert!(matches!(migration_stream_outcome(&short), Ok(Err(_))));
        let long = complete_frames(&[&devices[..], &[0]].concat());
        assert!(matches!(migration_stream_outcome(&long), Ok(Err(_))));

        // And the public entry point takes them all.
        for data in [&frames[..], &raw, &other_vm, &aborted, &short, &long, &[]] {
            migration_stream(data);
        }
    }

    /// Guest pages in the target's memory.
    const PAGES: u64 = TARGET_MEMORY / 4096;

    /// One frame of any kind (now and then not a kind at all), close to what a
    /// source sends but often wrong somewhere: addresses, counts, lengths.
    fn damaged_frame(rng: &mut Rng, out: &mut Vec<u8>, vm: &[u8], devices: &[Vec<u8>]) {
        let gpa = |rng: &mut Rng| match rng.below(4) {
            0 => rng.next(),
            1 => rng.below(TARGET_MEMORY + 8192),
            _ => rng.below(PAGES + 2) * 4096,
        };
        let (kind, payload) = match rng.below(15) {
            0 => (rng.byte(), rng.bytes_below(64)),
            1..=3 => {
                let mut e = Encoder::default();
                e.u64(gpa(rng));
                let count = match rng.below(4) {
                    0 => u32::try_from(rng.below(1 << 32)).unwrap(),
                    1 => 257,
                    _ => u32::try_from(rng.below(4)).unwrap(),
                };
                e.u32(count);
                let pages = usize::try_from(count.min(4)).unwrap();
                let extra = [0, 0, 1, 4095][rng.index(4)];
                let fill = rng.byte();
                e.bytes(&vec![
                    fill;
                    (pages * 4096 + extra).saturating_sub(rng.index(2))
                ]);
                (Kind::Pages as u8, e.0)
            }
            4 | 5 => {
                let count = match rng.below(4) {
                    0 => rng.next(),
                    1 => PAGES,
                    _ => rng.below(8),
                };
                (Kind::ZeroPages as u8, zero_pages_frame(gpa(rng), count))
            }
            6 | 7 => {
                let mut payload = platform_frame(rng, vm, devices);
                match rng.below(3) {
                    0 => {
                        let at = rng.index(vm.len());
                        payload[at] = rng.byte();
                    }
                    1 => payload.truncate(rng.index(payload.len())),
                    _ => {}
                }
                (Kind::Platform as u8, payload)
            }
            8 | 9 => {
                let index = u8::try_from(rng.below(3)).unwrap();
                let msrs = match rng.below(4) {
                    0 => u32::try_from(rng.below(1 << 32)).unwrap(),
                    1 => 2049,
                    _ => u32::try_from(rng.below(4)).unwrap(),
                };
                let written = msrs.min(4);
                let mut payload = vcpu_frame(index, written);
                if msrs != written {
                    // The count says more than the entries that follow.
                    let entries = usize::try_from(written).unwrap() * size_of::<kvm_msr_entry>();
                    let at = payload.len() - entries - 4;
                    payload[at..at + 4].copy_from_slice(&msrs.to_le_bytes());
                }
                if rng.below(2) == 0 {
                    payload.truncate(rng.index(payload.len()));
                }
                (Kind::Vcpu as u8, payload)
            }
            10 => (Kind::Complete as u8, rng.bytes_below(4)),
            11 => {
                let mut payload = disks_frame();
                if rng.below(2) == 0 {
                    let at = rng.index(payload.len());
                    payload[at] = rng.byte();
                }
                (Kind::Disks as u8, payload)
            }
            12 | 13 => {
                let disk = u8::try_from(rng.below(3)).unwrap();
                let offset = match rng.below(3) {
                    0 => rng.next(),
                    1 => rng.below(TARGET_DISK + 1024),
                    _ => rng.below(TARGET_DISK / 512) * 512,
                };
                if rng.below(2) == 0 {
                    let len = match rng.below(3) {
                        0 => rng.next(),
                        _ => rng.below(4) * 512,
                    };
                    (Kind::DiskZeroes as u8, disk_zeroes_frame(disk, offset, len))
                } else {
                    let len = [0, 100, 512, 4096][rng.index(4)];
                    let data = vec![rng.byte(); len];
                    (Kind::DiskData as u8, disk_data_frame(disk, offset, &data))
                }
            }
            _ => (Kind::Abort as u8, Vec::new()),
        };
        let len = u32::try_from(payload.len()).unwrap();
        let len = match rng.below(4) {
            0 => u32::try_from(rng.below(1 << 32)).unwrap(),
            1 => len.saturating_sub(1),
            2 => len + 1,
            _ => len,
        };
        frame_with_length(out, kind, len, &payload);
    }

    /// A platform frame with one of `devices`, which is now and then changed: a
    /// byte (the devices check their values), cut short or one too many.
    fn platform_frame(rng: &mut Rng, vm: &[u8], devices: &[Vec<u8>]) -> Vec<u8> {
        let mut devices = devices[rng.index(devices.len())].clone();
        match rng.below(8) {
            0..=2 => {
                let at = rng.index(devices.len());
                devices[at] = rng.byte();
            }
            3 => devices.truncate(rng.index(devices.len())),
            4 => devices.push(rng.byte()),
            _ => {}
        }
        [vm, &devices].concat()
    }

    /// A stream a source could send (pages anywhere in memory, the state once),
    /// with the devices' part now and then changed.
    fn plausible_frames(rng: &mut Rng, out: &mut Vec<u8>, vm: &[u8], devices: &[Vec<u8>]) {
        frame(out, Kind::Disks, &disks_frame());
        for _ in 0..rng.below(3) {
            let sector = rng.below(TARGET_DISK / 512);
            let count = 1 + rng.below((TARGET_DISK / 512 - sector).min(8));
            if rng.below(2) == 0 {
                let data = vec![rng.byte(); usize::try_from(count * 512).unwrap()];
                frame(
                    out,
                    Kind::DiskData,
                    &disk_data_frame(0, sector * 512, &data),
                );
            } else {
                let zeroes = disk_zeroes_frame(0, sector * 512, count * 512);
                frame(out, Kind::DiskZeroes, &zeroes);
            }
        }
        for _ in 0..rng.below(6) {
            let page = rng.below(PAGES);
            let count = 1 + rng.below((PAGES - page).min(4));
            if rng.below(2) == 0 {
                let count = u32::try_from(count).unwrap();
                frame(
                    out,
                    Kind::Pages,
                    &pages_frame(page * 4096, count, rng.byte()),
                );
            } else {
                frame(out, Kind::ZeroPages, &zero_pages_frame(page * 4096, count));
            }
        }
        frame(out, Kind::Platform, &platform_frame(rng, vm, devices));
        frame(
            out,
            Kind::Vcpu,
            &vcpu_frame(0, u32::try_from(rng.below(4)).unwrap()),
        );
        frame(out, Kind::Complete, &[]);
    }

    #[test]
    fn random_migration_streams_never_panic() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let vm = vm_state();
        // Device states after random port I/O: stopped clocks, full buffers, …
        let devices: Vec<Vec<u8>> = (0..8)
            .map(|i| devices_state(&rng.bytes(if i == 0 { 0 } else { 256 }), i % 2 == 1))
            .collect();
        let (mut refused, mut devices_refused, mut restored) = (0, 0, 0);
        for _ in 0..3000 {
            let mut data = Vec::new();
            match rng.below(8) {
                // Anything at all.
                0 => data = rng.bytes_below(1024),
                // The stream itself after a byte of 128 or more, its header now
                // and then damaged, then damaged frames.
                1 => {
                    data = [&[0x80][..], &header(&target_layout())].concat();
                    if rng.below(2) == 0 {
                        let at = 1 + rng.index(data.len() - 1);
                        data[at] = rng.byte();
                    }
                    for _ in 0..rng.below(4) {
                        damaged_frame(&mut rng, &mut data, &vm, &devices);
                    }
                }
                // Damaged frames after the harness's header, and then the end of a
                // stream (which the damage often stops before).
                2 | 3 => {
                    for _ in 0..1 + rng.below(3) {
                        damaged_frame(&mut rng, &mut data, &vm, &devices);
                    }
                    plausible_frames(&mut rng, &mut data, &vm, &devices);
                }
                // What a source sends, now and then with bytes changed anywhere.
                _ => {
                    plausible_frames(&mut rng, &mut data, &vm, &devices);
                    if rng.below(4) == 0 {
                        for _ in 0..1 + rng.below(3) {
                            let at = rng.index(data.len());
                            data[at] = rng.byte();
                        }
                    }
                }
            }
            // Port I/O for the restored devices.
            let port_io = rng.bytes_below(256);
            data.extend_from_slice(&port_io);
            match migration_stream_outcome(&data) {
                Err(_) => refused += 1,
                Ok(Err(_)) => devices_refused += 1,
                Ok(Ok(())) => restored += 1,
            }
        }
        // Every outcome is reached often: the streams get past each check.
        assert!(
            refused > 500 && devices_refused > 200 && restored > 500,
            "refused {refused}, devices refused {devices_refused}, restored {restored}"
        );
    }
}

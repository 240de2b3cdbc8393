//! The guest's own checks (the virtio ones live in `crate::virtio`).

use crate::bootparams::{BootParams, E820_RAM};
use crate::cmdline;
use crate::io::{inb, mmio_read32, mmio_write32, outb};
use crate::report::{Detail, Reporter};

/// An I/O port no device of the VMM claims.
const UNCLAIMED_PORT: u16 = 0x0c50;
/// A guest-physical address between the PCI window and the IOAPIC where no
/// device lives.
const UNCLAIMED_MMIO: u64 = 0xf000_1000;
/// The end of the identity map the VMM builds.
pub const MAPPED_END: u64 = 1 << 32;
/// How long the `smp` check waits for vCPUs the VMM started itself before
/// starting them with INIT/SIPI.
const DIRECT_START_WAIT_MS: u32 = 100;
/// Longest wait for secondary vCPUs.
const SMP_TIMEOUT_MS: u32 = 5_000;

/// `serial`: the UART took our bytes (reaching this line at all is the proof
/// the host reads; the detail names the port).
pub fn serial(r: &mut dyn Reporter) {
    r.result("serial", true, "com1=0x3f8");
}

/// `bootparams`: the zero page has the Linux magic values, an e820 map and a
/// command line.
pub fn bootparams(r: &mut dyn Reporter, bp: Option<BootParams>) {
    let Some(bp) = bp else {
        r.result("bootparams", false, "rsi=0");
        return;
    };
    let mut d = Detail::new();
    d.str("e820=")
        .dec(bp.e820_len() as u64)
        .str(" cmdline=")
        .dec(bp.cmdline().len() as u64);
    let ok = bp.boot_flag() == 0xaa55 && bp.header_magic() == 0x5372_6448 && bp.e820_len() > 0;
    if !ok {
        d.str(" flag=")
            .hex(u64::from(bp.boot_flag()))
            .str(" header=")
            .hex(u64::from(bp.header_magic()));
    }
    r.result("bootparams", ok, d.as_str());
}

/// `initrd`: the initrd named in the zero page lies in RAM; the detail
/// carries its address, size and a byte sum the host can compare.
pub fn initrd(r: &mut dyn Reporter, bp: Option<BootParams>) {
    let Some(bp) = bp else {
        r.result("initrd", false, "no boot params");
        return;
    };
    let (addr, size) = bp.initrd();
    let mut d = Detail::new();
    d.str("addr=").hex(addr).str(" size=").dec(size);
    let in_ram = (0..bp.e820_len()).filter_map(|i| bp.e820(i)).any(|e| {
        e.kind == E820_RAM && addr >= e.addr && addr.saturating_add(size) <= e.addr + e.size
    });
    if size == 0 || !in_ram || addr.saturating_add(size) > MAPPED_END {
        r.result("initrd", false, d.as_str());
        return;
    }
    // Bounded by the size above and by the 4 GiB identity map.
    let sum = (0..size).fold(0u32, |s, i| {
        s.wrapping_add(u32::from(crate::io::mmio_read8(addr + i)))
    });
    d.str(" sum=").hex(u64::from(sum));
    r.result("initrd", true, d.as_str());
}

/// `idt`: an exception (#UD) reaches our handler and execution resumes.
pub fn idt(r: &mut dyn Reporter) {
    let caught = crate::idt::trigger_expected_ud();
    r.result(
        "idt",
        caught,
        if caught {
            "ud2 handled"
        } else {
            "ud2 not seen"
        },
    );
}

/// `mem`: the RAM in the e820 map is really there: write and read back a
/// pattern in the middle and at the last word of every RAM range between
/// 1 MiB and 4 GiB (the VMM's page tables map only the low 4 GiB).
pub fn mem(r: &mut dyn Reporter, bp: Option<BootParams>) {
    let Some(bp) = bp else {
        r.result("mem", false, "no boot params");
        return;
    };
    let mut d = Detail::new();
    let mut ok = true;
    for i in 0..bp.e820_len() {
        let Some(e) = bp.e820(i) else { continue };
        if e.kind != E820_RAM || e.addr < 0x10_0000 || e.size < 8 {
            continue;
        }
        let mapped_end = (e.addr + e.size).min(MAPPED_END);
        if mapped_end <= e.addr + 8 {
            continue;
        }
        let e = crate::bootparams::E820Entry {
            size: mapped_end - e.addr,
            ..e
        };
        // The first page of high RAM holds this program; test the last word
        // of the range and a word 2 MiB in (if the range is that big).
        let last = (e.addr + e.size - 4) & !3;
        let probes = [last, e.addr + (e.size / 2 & !3)];
        for (n, &addr) in probes.iter().enumerate() {
            let pattern = 0x5a5a_0000 | (i as u32) << 4 | n as u32;
            mmio_write32(addr, pattern);
            if mmio_read32(addr) != pattern {
                ok = false;
                d.str("bad@").hex(addr).str(" ");
            }
        }
    }
    d.str("ram_mib=").dec(bp.ram_bytes() >> 20);
    r.result("mem", ok, d.as_str());
}

/// `smp`: every vCPU ran the entry code and checked in. `smp=direct` only
/// waits for vCPUs the VMM started; `smp=sipi` starts them with INIT/SIPI at
/// once; by default the check waits briefly, then sends INIT/SIPI.
pub fn smp(r: &mut dyn Reporter, cmdline: &[u8]) {
    let expected = expected_cpus(cmdline);
    let mode = cmdline::value(cmdline, "smp");
    let mut started = "direct";
    let (mut seen, mut ids) = match mode {
        Some(b"sipi") => (0, 0),
        _ => crate::smp::wait_for_secondaries(expected, DIRECT_START_WAIT_MS),
    };
    if seen + 1 < expected && mode != Some(b"direct") {
        started = "sipi";
        crate::trampoline::start_secondaries();
        (seen, ids) = crate::smp::wait_for_secondaries(expected, SMP_TIMEOUT_MS);
    } else if seen + 1 < expected {
        (seen, ids) = crate::smp::wait_for_secondaries(expected, SMP_TIMEOUT_MS);
    }
    let mut d = Detail::new();
    d.str("cpus=")
        .dec(u64::from(seen) + 1)
        .str(" expected=")
        .dec(u64::from(expected))
        .str(" ids=")
        .hex(ids | 1)
        .str(" start=")
        .str(started);
    r.result("smp", seen + 1 == expected, d.as_str());
}

/// `mptable`: the Intel MP table a Linux guest uses to find its CPUs: the
/// floating pointer in the BIOS area, both checksums, and one processor
/// entry per vCPU (compared with CPUID, or `cpus=`).
pub fn mptable(r: &mut dyn Reporter, cmdline: &[u8]) {
    let expected = expected_cpus(cmdline);
    let Some(floating) = (0xf_0000u64..0x10_0000)
        .step_by(16)
        .find(|&a| mmio_read32(a) == u32::from_le_bytes(*b"_MP_"))
    else {
        r.result(
            "mptable",
            false,
            "no _MP_ floating pointer in 0xf0000-0xfffff",
        );
        return;
    };
    let table = u64::from(mmio_read32(floating + 4));
    let length = u64::from(mmio_read32(table + 4) & 0xffff);
    let count = (mmio_read32(table + 0x20) >> 16) as u64;
    let mut d = Detail::new();
    d.str("at=").hex(floating);
    let ok_floating = sum_bytes(floating, 16) == 0;
    let ok_table = mmio_read32(table) == u32::from_le_bytes(*b"PCMP")
        && length <= 0x1_0000
        && sum_bytes(table, length) == 0;
    if !ok_floating || !ok_table {
        d.str(" bad checksum or signature");
        r.result("mptable", false, d.as_str());
        return;
    }
    let mut at = table + 44;
    let mut processors = 0u64;
    for _ in 0..count {
        if at >= table + length {
            break;
        }
        let kind = crate::io::mmio_read8(at);
        if kind == 0 {
            processors += 1;
        }
        at += if kind == 0 { 20 } else { 8 };
    }
    d.str(" cpus=").dec(processors).str(" entries=").dec(count);
    r.result("mptable", processors == u64::from(expected), d.as_str());
}

fn sum_bytes(addr: u64, len: u64) -> u8 {
    (0..len).fold(0u8, |s, i| s.wrapping_add(crate::io::mmio_read8(addr + i)))
}

pub fn expected_cpus(cmdline: &[u8]) -> u32 {
    cmdline::value(cmdline, "cpus")
        .and_then(cmdline::parse_u64)
        .map(|n| n.min(64) as u32)
        .unwrap_or_else(crate::smp::expected_from_cpuid)
}

/// `badio`: ports and MMIO without a device read as all-ones and ignore
/// writes; the VMM keeps running.
pub fn badio(r: &mut dyn Reporter) {
    outb(UNCLAIMED_PORT, 0x55);
    let port = inb(UNCLAIMED_PORT);
    mmio_write32(UNCLAIMED_MMIO, 0x1234_5678);
    let mmio = mmio_read32(UNCLAIMED_MMIO);
    let mut d = Detail::new();
    d.str("port=")
        .hex(u64::from(port))
        .str(" mmio=")
        .hex(u64::from(mmio));
    r.result("badio", port == 0xff && mmio == 0xffff_ffff, d.as_str());
}

/// `panic`: a Rust panic in the guest (the panic handler reports it and
/// exits with code 101).
pub fn panic(r: &mut dyn Reporter) -> ! {
    r.result("panic", true, "panicking now");
    panic!("requested by the panic check");
}

/// `triplefault`: an exception with no usable IDT shuts the vCPU down.
pub fn triplefault(r: &mut dyn Reporter) -> ! {
    r.result("triplefault", true, "faulting now");
    crate::idt::load_empty();
    // SAFETY: deliberately faults; with an empty IDT this never returns.
    unsafe { core::arch::asm!("ud2", options(nostack, noreturn)) }
}

/// `cpuid`: the features the VMM's CPUID policy shows this vCPU (leaf 1
/// ECX/EDX, leaf 7 EBX/ECX), for the host to compare with `vmm cpuid`.
pub fn cpuid(r: &mut dyn Reporter) {
    let (_, _, ecx1, edx1) = crate::io::cpuid(1, 0);
    let (_, ebx7, ecx7, _) = crate::io::cpuid(7, 0);
    let mut d = Detail::new();
    d.str("leaf1.ecx=")
        .hex(u64::from(ecx1))
        .str(" leaf1.edx=")
        .hex(u64::from(edx1))
        .str(" leaf7.ebx=")
        .hex(u64::from(ebx7))
        .str(" leaf7.ecx=")
        .hex(u64::from(ecx7));
    r.result("cpuid", true, d.as_str());
}

/// The IOAPIC pin whose vector the `emulation` check raises with `int n`.
const SOFT_INT_PIN: u32 = 19;

/// `emulation`: instructions KVM's emulator may lack, finished by the VMM:
/// `int3` reaches the #BP handler with RIP past it, `int n` reaches
/// vector n, `stac`/`clac` set and clear RFLAGS.AC (or raise #UD where
/// CPUID shows no SMAP), `fwait` without a pending x87 exception returns.
pub fn emulation(r: &mut dyn Reporter) {
    let (bp_rip, after) = crate::idt::trigger_breakpoint();
    crate::idt::take_pending(SOFT_INT_PIN);
    // SAFETY: vector IRQ_BASE + 19 is an interrupt gate whose handler only
    // records the pending bit and writes EOI.
    unsafe { core::arch::asm!("int 0x33", options(nostack)) };
    let soft_int = crate::idt::take_pending(SOFT_INT_PIN);
    let smap = crate::io::cpuid(7, 0).1 & (1 << 20) != 0;
    let (ac_set, ac_after_clac, uds) = crate::idt::toggle_ac();
    // No x87 exception pending: fwait does nothing (and comes back).
    // SAFETY: fwait only checks the x87 status word.
    unsafe { core::arch::asm!("fwait", options(nomem, nostack)) };
    let ac_ok = if smap {
        ac_set && !ac_after_clac && uds == 0
    } else {
        uds == 2
    };
    let mut d = Detail::new();
    d.str("int3_rip=")
        .hex(bp_rip)
        .str(" expected=")
        .hex(after)
        .str(" int0x33=")
        .dec(u64::from(soft_int))
        .str(" smap=")
        .dec(u64::from(smap))
        .str(" stac_ac=")
        .dec(u64::from(ac_set))
        .str(" clac_ac=")
        .dec(u64::from(ac_after_clac))
        .str(" ud=")
        .dec(u64::from(uds))
        .str(" fwait=ok");
    r.result("emulation", bp_rip == after && soft_int && ac_ok, d.as_str());
}

/// `interrupts`: interrupts raised by instructions, which KVM's emulator
/// leaves to the VMM, reach the guest as on the CPU: `int 2` runs the NMI
/// handler and returns past it; `int3` reaches a DPL-0 gate from ring 0;
/// `int 21` (a vector whose hardware exception pushes an error code) pushes
/// none; `int n` through a gate marked not present is #NP, and beyond the
/// IDT's limit #GP, each with the IDT entry's selector as error code
/// (`vector << 3 | 2`). From ring 3 (`<vector>/<error code>` of what
/// arrived): `int 0x30` to a DPL-0 gate and `int 2` are #GP with that error
/// code, or #UD where KVM answers itself; never the vector, never an NMI.
pub fn interrupts(r: &mut dyn Reporter) {
    use crate::idt::{from_user, set_gate_dpl};
    use crate::user::{user_int2, user_int3, user_int_0x30};
    let (nmi_rip, nmi_after) = crate::idt::int2_nmi();
    let (bp_rip, bp_after) = crate::idt::trigger_breakpoint();
    let no_error_code = crate::idt::int21_pushes_no_error_code();
    let np = crate::idt::int_not_present();
    let limit = crate::idt::int_beyond_limit();

    crate::user::setup();
    crate::user::user_pages(true);
    let user_0x30 = from_user(user_int_0x30);
    let user_int3 = from_user(user_int3);
    let user_int2 = from_user(user_int2);
    let dpl = set_gate_dpl(0x30, 3);
    let user_dpl3 = from_user(user_int_0x30);
    set_gate_dpl(0x30, dpl);
    crate::user::user_pages(false);
    // A user `int n` to a DPL-0 gate, `int 2` included, must never reach
    // the vector (or the NMI handler) nor end the VM: the VMM answers #GP
    // with the selector where KVM leaves the instruction to it; KVM here
    // (kvm_pvm) answers #UD itself at CPL 3. `int3` and a DPL-3 gate are
    // reported as they come: this KVM delivers a user `int3` as #BP through
    // even a DPL-0 gate, and a user `int n` to a DPL-3 gate as #UD, neither
    // through the VMM.
    const UD: (u64, u64) = (6, 0);
    let user_ok = (user_0x30 == (13, 0x182) || user_0x30 == UD)
        && (user_int2 == (13, 0x12) || user_int2 == UD);

    let mut d = Detail::new();
    d.str("int2_nmi=")
        .str(if nmi_rip == nmi_after { "returned" } else { "missed" })
        .str(" int3=")
        .str(if bp_rip == bp_after { "returned" } else { "missed" })
        .str(" int21_error_code=")
        .str(match no_error_code {
            Some(true) => "none",
            Some(false) => "pushed",
            None => "missed",
        })
        .str(" not_present=")
        .hex(np)
        .str(" beyond_limit=")
        .hex(limit)
        .str(" user_int0x30=")
        .dec(user_0x30.0).str("/").hex(user_0x30.1)
        .str(" user_int3=")
        .dec(user_int3.0).str("/").hex(user_int3.1)
        .str(" user_int2=")
        .dec(user_int2.0).str("/").hex(user_int2.1)
        .str(" user_dpl3_gate=")
        .dec(user_dpl3.0).str("/").hex(user_dpl3.1);
    let ok = nmi_rip == nmi_after
        && bp_rip == bp_after
        && no_error_code == Some(true)
        && np == 0x282
        && limit == 0x302
        && user_ok;
    r.result("interrupts", ok, d.as_str());
}

/// `unemulated`: an SSE instruction with a memory operand in MMIO, which
/// KVM must emulate (on hardware too) and whose emulator lacks it; neither
/// can the VMM finish it, so the VM ends as a guest crash naming the
/// instruction's bytes. Does not return.
pub fn unemulated(r: &mut dyn Reporter) -> ! {
    r.result("unemulated", true, "pxor xmm0, [mmio] now");
    // SAFETY: deliberately stops the VM; xmm0 is never used by this program.
    unsafe {
        core::arch::asm!("pxor xmm0, [{0}]", in(reg) UNCLAIMED_MMIO, options(nostack));
    }
    crate::exit::exit(crate::exit::FAILED_CODE)
}

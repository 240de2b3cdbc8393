//! The guest's CPUID: a curated policy instead of the host's CPUID passed
//! through (as Firecracker's CPU templates normalise it).
//!
//! Built once per VM from what KVM supports (`KVM_GET_SUPPORTED_CPUID`),
//! identical for every vCPU except the fields that name the vCPU (APIC ids).
//! Always: the hypervisor bit, a flat topology (one thread per core, every
//! vCPU a core of one package) in leaves 1, 4, 0xb, 0x1f and AMD's
//! 0x80000008/0x8000001e, no performance monitoring (leaf 0xa), no power
//! management or thermal features beyond the always-running APIC timer
//! (leaf 6), no SGX or processor trace, no MONITOR/MWAIT, VMX or SMX.
//!
//! [`CpuProfile::Emulated`] further hides what an instruction-emulating KVM
//! (`kvm_pvm` on the project's machines) cannot run, so a stock kernel never
//! picks it: each bit in [`EMULATOR_HIDDEN`] names the instruction KVM's
//! emulator lacks (`cmpxchg16b`, `xsave`/`xrstor`, AVX and every SIMD
//! extension beyond SSE2, `popcnt`, `rdrand`/`rdseed`, `clac`/`stac`,
//! `rdfsbase`..., `invpcid`, `rdpid`, ...). Hiding XSAVE hides everything
//! that depends on it (leaf 0xd, AVX*, AMX), so the leaves stay consistent.
//! The profile is detected (the `kvm_pvm` module is loaded) or chosen.

use kvm_bindings::{CpuId, kvm_cpuid_entry2};

use crate::config::CpuProfile;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reg {
    Eax,
    Ebx,
    Ecx,
    Edx,
}

/// A feature bit: leaf, subleaf, register, bit, and the name Linux gives it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Feature {
    leaf: u32,
    subleaf: u32,
    reg: Reg,
    bit: u32,
    pub(crate) name: &'static str,
}

const fn f(leaf: u32, subleaf: u32, reg: Reg, bit: u32, name: &'static str) -> Feature {
    Feature {
        leaf,
        subleaf,
        reg,
        bit,
        name,
    }
}

use Reg::*;

/// Hidden in every profile: features a VMM without them must not offer.
const ALWAYS_HIDDEN: &[Feature] = &[
    f(1, 0, Ecx, 3, "monitor"),
    f(1, 0, Ecx, 4, "ds_cpl"),
    f(1, 0, Ecx, 5, "vmx"),
    f(1, 0, Ecx, 6, "smx"),
    f(1, 0, Ecx, 7, "est"),
    f(1, 0, Ecx, 8, "tm2"),
    f(1, 0, Ecx, 15, "pdcm"),
    f(1, 0, Edx, 21, "ds"),
    f(1, 0, Edx, 22, "acpi"),
    f(1, 0, Edx, 29, "tm"),
    f(1, 0, Edx, 31, "pbe"),
    f(7, 0, Ebx, 2, "sgx"),
    f(7, 0, Ebx, 25, "intel_pt"),
    f(7, 0, Ecx, 5, "waitpkg"),
    f(7, 0, Ecx, 30, "sgx_lc"),
    f(0x8000_0001, 0, Ecx, 2, "svm"),
    f(0x8000_0001, 0, Ecx, 29, "mwaitx"),
];

/// Hidden when KVM emulates every instruction: each needs an instruction
/// (or CPU state) KVM's x86 emulator does not implement, so a guest that
/// used it would stop with "instruction emulation failed".
pub(crate) const EMULATOR_HIDDEN: &[Feature] = &[
    f(1, 0, Ecx, 1, "pclmulqdq"),
    f(1, 0, Ecx, 9, "ssse3"),
    f(1, 0, Ecx, 12, "fma"),
    f(1, 0, Ecx, 13, "cx16"),
    f(1, 0, Ecx, 17, "pcid"),
    f(1, 0, Ecx, 19, "sse4_1"),
    f(1, 0, Ecx, 20, "sse4_2"),
    f(1, 0, Ecx, 23, "popcnt"),
    f(1, 0, Ecx, 25, "aes"),
    f(1, 0, Ecx, 26, "xsave"),
    f(1, 0, Ecx, 27, "osxsave"),
    f(1, 0, Ecx, 28, "avx"),
    f(1, 0, Ecx, 29, "f16c"),
    f(1, 0, Ecx, 30, "rdrand"),
    f(7, 0, Ebx, 0, "fsgsbase"),
    f(7, 0, Ebx, 3, "bmi1"),
    f(7, 0, Ebx, 4, "hle"),
    f(7, 0, Ebx, 5, "avx2"),
    f(7, 0, Ebx, 8, "bmi2"),
    f(7, 0, Ebx, 10, "invpcid"),
    f(7, 0, Ebx, 11, "rtm"),
    f(7, 0, Ebx, 14, "mpx"),
    f(7, 0, Ebx, 16, "avx512f"),
    f(7, 0, Ebx, 17, "avx512dq"),
    f(7, 0, Ebx, 18, "rdseed"),
    f(7, 0, Ebx, 19, "adx"),
    f(7, 0, Ebx, 20, "smap"),
    f(7, 0, Ebx, 21, "avx512ifma"),
    f(7, 0, Ebx, 23, "clflushopt"),
    f(7, 0, Ebx, 24, "clwb"),
    f(7, 0, Ebx, 26, "avx512pf"),
    f(7, 0, Ebx, 27, "avx512er"),
    f(7, 0, Ebx, 28, "avx512cd"),
    f(7, 0, Ebx, 29, "sha_ni"),
    f(7, 0, Ebx, 30, "avx512bw"),
    f(7, 0, Ebx, 31, "avx512vl"),
    f(7, 0, Ecx, 1, "avx512vbmi"),
    f(7, 0, Ecx, 2, "umip"),
    f(7, 0, Ecx, 3, "pku"),
    f(7, 0, Ecx, 4, "ospke"),
    f(7, 0, Ecx, 6, "avx512_vbmi2"),
    f(7, 0, Ecx, 8, "gfni"),
    f(7, 0, Ecx, 9, "vaes"),
    f(7, 0, Ecx, 10, "vpclmulqdq"),
    f(7, 0, Ecx, 11, "avx512_vnni"),
    f(7, 0, Ecx, 12, "avx512_bitalg"),
    f(7, 0, Ecx, 14, "avx512_vpopcntdq"),
    f(7, 0, Ecx, 16, "la57"),
    f(7, 0, Ecx, 22, "rdpid"),
    f(7, 0, Ecx, 27, "movdiri"),
    f(7, 0, Ecx, 28, "movdir64b"),
    f(7, 0, Edx, 2, "avx512_4vnniw"),
    f(7, 0, Edx, 3, "avx512_4fmaps"),
    f(7, 0, Edx, 8, "avx512_vp2intersect"),
    f(7, 0, Edx, 14, "serialize"),
    f(7, 0, Edx, 22, "amx_bf16"),
    f(7, 0, Edx, 23, "avx512_fp16"),
    f(7, 0, Edx, 24, "amx_tile"),
    f(7, 0, Edx, 25, "amx_int8"),
    f(7, 1, Eax, 4, "avx_vnni"),
    f(7, 1, Eax, 5, "avx512_bf16"),
    f(0x8000_0001, 0, Ecx, 5, "abm"),
    f(0x8000_0001, 0, Ecx, 6, "sse4a"),
    f(0x8000_0001, 0, Ecx, 7, "misalignsse"),
    f(0x8000_0001, 0, Ecx, 11, "xop"),
    f(0x8000_0001, 0, Ecx, 16, "fma4"),
    f(0x8000_0001, 0, Ecx, 21, "tbm"),
    f(0x8000_0001, 0, Edx, 26, "pdpe1gb"),
    f(0x8000_0008, 0, Ebx, 0, "clzero"),
    f(0x8000_0008, 0, Ebx, 9, "wbnoinvd"),
];

const LEAF1_HYPERVISOR: u32 = 1 << 31;
const LEAF1_HTT: u32 = 1 << 28;
const LEAF1_XSAVE: u32 = 1 << 26;
const LEAF6_ARAT: u32 = 1 << 2;

/// The guest CPUID of one VM.
#[derive(Clone, Debug)]
pub(crate) struct CpuidPolicy {
    profile: CpuProfile,
    vcpus: u8,
    /// Entries with the per-vCPU fields still zero.
    template: Vec<kvm_cpuid_entry2>,
}

impl CpuidPolicy {
    /// The policy for `vcpus` vCPUs from what KVM supports.
    pub(crate) fn new(supported: &CpuId, profile: CpuProfile, vcpus: u8) -> CpuidPolicy {
        let mut template: Vec<kvm_cpuid_entry2> = supported.as_slice().to_vec();
        let hidden: Vec<Feature> = match profile {
            CpuProfile::Host => ALWAYS_HIDDEN.to_vec(),
            CpuProfile::Emulated => [ALWAYS_HIDDEN, EMULATOR_HIDDEN].concat(),
        };
        for feature in &hidden {
            for entry in template.iter_mut().filter(|e| feature.matches(e)) {
                *reg_mut(entry, feature.reg) &= !(1 << feature.bit);
            }
        }
        let xsave = template
            .iter()
            .any(|e| e.function == 1 && e.ecx & LEAF1_XSAVE != 0);
        let count = u32::from(vcpus.max(1));
        // Bits of an APIC id that number the cores of the package.
        let core_bits = 32 - (count - 1).leading_zeros();
        for e in &mut template {
            match e.function {
                1 => {
                    e.ebx &= 0x0000_ffff; // keep brand index and CLFLUSH size
                    e.ebx |= count << 16;
                    e.ecx |= LEAF1_HYPERVISOR;
                    e.edx |= LEAF1_HTT;
                }
                // Deterministic cache parameters: cores per package, and
                // which caches they share (L3 only).
                4 if e.eax & 0x1f != 0 => {
                    let level = (e.eax >> 5) & 0x7;
                    let sharing = if level >= 3 { count - 1 } else { 0 };
                    e.eax = (e.eax & 0x3ff) | ((count - 1) << 26) | (sharing << 14);
                }
                // AMD cache topology: L3 shared by the package, the rest per core.
                0x8000_001d if e.eax & 0x1f != 0 => {
                    let level = (e.eax >> 5) & 0x7;
                    let sharing = if level >= 3 { count - 1 } else { 0 };
                    e.eax = (e.eax & !(0xfff << 14)) | (sharing << 14);
                }
                6 => {
                    e.eax &= LEAF6_ARAT;
                    e.ebx = 0;
                    e.ecx = 0;
                    e.edx = 0;
                }
                0xa | 0x12 | 0x14 => zero(e),
                0xd if !xsave => zero(e),
                // Topology: level 0 threads (one per core), level 1 cores.
                0xb | 0x1f => {
                    let (eax, ebx, ecx) = match e.index {
                        0 => (0, 1, 0x100),
                        1 => (core_bits, count, 0x200 | 1),
                        n => (0, 0, n),
                    };
                    (e.eax, e.ebx, e.ecx, e.edx) = (eax, ebx, ecx, 0);
                }
                // AMD: cores per package and how many APIC-id bits they use.
                0x8000_0008 => {
                    e.ecx = (e.ecx & !0xf0ff) | (core_bits.max(1) << 12) | (count - 1);
                }
                // AMD topology extension: per vCPU (below), one thread per core.
                0x8000_001e => {
                    e.eax = 0;
                    e.ebx = 0;
                    e.ecx = 0;
                }
                _ => {}
            }
        }
        CpuidPolicy {
            profile,
            vcpus,
            template,
        }
    }

    /// Leaf 1's EAX (family, model, stepping) and EDX (feature flags), the same on every
    /// vCPU: the processor id of the SMBIOS processor records.
    pub(crate) fn signature(&self) -> (u32, u32) {
        self.template
            .iter()
            .find(|e| e.function == 1)
            .map_or((0, 0), |e| (e.eax, e.edx))
    }

    /// The CPUID of vCPU `index`: the template with its APIC id.
    pub(crate) fn for_vcpu(&self, index: u8) -> CpuId {
        let apic_id = u32::from(index);
        let mut entries = self.template.clone();
        for e in &mut entries {
            match e.function {
                1 => e.ebx = (e.ebx & 0x00ff_ffff) | (apic_id << 24),
                0xb | 0x1f => e.edx = apic_id,
                0x8000_001e => {
                    e.eax = apic_id;
                    e.ebx = apic_id & 0xff;
                }
                _ => {}
            }
        }
        // The template came from a valid CpuId, so the count fits.
        CpuId::from_entries(&entries).unwrap_or_else(|_| CpuId::new(0).expect("empty CpuId"))
    }

    /// The names of the features this policy hides that KVM supports.
    pub(crate) fn hidden_features(&self, supported: &CpuId) -> Vec<&'static str> {
        let table = match self.profile {
            CpuProfile::Host => ALWAYS_HIDDEN.to_vec(),
            CpuProfile::Emulated => [ALWAYS_HIDDEN, EMULATOR_HIDDEN].concat(),
        };
        table
            .iter()
            .filter(|feat| {
                supported
                    .as_slice()
                    .iter()
                    .any(|e| feat.matches(e) && reg(e, feat.reg) & (1 << feat.bit) != 0)
            })
            .map(|feat| feat.name)
            .collect()
    }

    /// A table of every vCPU's leaves, one line per leaf of vCPU 0, then
    /// the fields where the other vCPUs differ (their APIC ids), for
    /// `vmm cpuid`.
    pub(crate) fn describe(&self, supported: &CpuId) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# profile={} vcpus={} hidden={}",
            self.profile.name(),
            self.vcpus,
            self.hidden_features(supported).join(",")
        );
        let _ = writeln!(out, "# leaf     sub  eax        ebx        ecx        edx");
        let first = self.for_vcpu(0);
        for e in first.as_slice() {
            let _ = writeln!(
                out,
                "{:#010x} {:#04x} {:#010x} {:#010x} {:#010x} {:#010x}",
                e.function, e.index, e.eax, e.ebx, e.ecx, e.edx
            );
        }
        for vcpu in 1..self.vcpus {
            let other = self.for_vcpu(vcpu);
            for (a, b) in first.as_slice().iter().zip(other.as_slice()) {
                for r in [Eax, Ebx, Ecx, Edx] {
                    if reg(a, r) != reg(b, r) {
                        let _ = writeln!(
                            out,
                            "vcpu{vcpu} {:#010x} {:#04x} {r:?}={:#010x}",
                            b.function,
                            b.index,
                            reg(b, r)
                        );
                    }
                }
            }
        }
        out
    }
}

impl Feature {
    fn matches(&self, e: &kvm_cpuid_entry2) -> bool {
        e.function == self.leaf && e.index == self.subleaf
    }
}

fn zero(e: &mut kvm_cpuid_entry2) {
    e.eax = 0;
    e.ebx = 0;
    e.ecx = 0;
    e.edx = 0;
}

fn reg(e: &kvm_cpuid_entry2, r: Reg) -> u32 {
    match r {
        Eax => e.eax,
        Ebx => e.ebx,
        Ecx => e.ecx,
        Edx => e.edx,
    }
}

fn reg_mut(e: &mut kvm_cpuid_entry2, r: Reg) -> &mut u32 {
    match r {
        Eax => &mut e.eax,
        Ebx => &mut e.ebx,
        Ecx => &mut e.ecx,
        Edx => &mut e.edx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax: regs[0],
            ebx: regs[1],
            ecx: regs[2],
            edx: regs[3],
            ..Default::default()
        }
    }

    /// A host offering everything.
    fn host() -> CpuId {
        let all = u32::MAX;
        CpuId::from_entries(&[
            entry(0, 0, [0x1f, 0, 0, 0]),
            entry(1, 0, [0x00a0_0f11, 0x0708_0800, all, all]),
            entry(4, 0, [0x0000_0121, 0, 0, 0]),
            entry(4, 3, [0x0000_0163, 0, 0, 0]),
            entry(6, 0, [all, all, all, all]),
            entry(7, 0, [0, all, all, all]),
            entry(7, 1, [all, 0, 0, 0]),
            entry(0xa, 0, [all, all, all, all]),
            entry(0xb, 0, [1, 2, 0x100, 9]),
            entry(0xb, 1, [4, 16, 0x201, 9]),
            entry(0xd, 0, [0x2e7, 0x988, 0x988, 0]),
            entry(0xd, 1, [0xf, 0, 0, 0]),
            entry(0x8000_0001, 0, [0, 0, all, all]),
            entry(0x8000_0008, 0, [0x3030, all, 0x0000_700f, 0]),
        ])
        .unwrap()
    }

    fn get(cpuid: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
        *cpuid
            .as_slice()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .unwrap()
    }

    #[test]
    fn the_emulated_profile_hides_what_the_emulator_cannot_run_consistently() {
        let policy = CpuidPolicy::new(&host(), CpuProfile::Emulated, 2);
        let c = policy.for_vcpu(0);
        let leaf1 = get(&c, 1, 0);
        for (bit, name) in [(13, "cx16"), (26, "xsave"), (28, "avx"), (23, "popcnt")] {
            assert_eq!(leaf1.ecx & (1 << bit), 0, "{name}");
        }
        assert_ne!(leaf1.ecx & (1 << 0), 0, "sse3 stays");
        assert_ne!(leaf1.edx & (1 << 26), 0, "sse2 stays");
        let leaf7 = get(&c, 7, 0);
        assert_eq!(leaf7.ebx & (1 << 20), 0, "smap");
        assert_eq!(leaf7.ebx & (1 << 5), 0, "avx2");
        assert_ne!(leaf7.ebx & (1 << 7), 0, "smep stays (no instruction)");
        assert_eq!(get(&c, 7, 1).eax & (3 << 4), 0, "avx_vnni, avx512_bf16");
        // No XSAVE: no XSAVE state leaf either.
        assert_eq!(get(&c, 0xd, 0).eax, 0);
        assert_eq!(get(&c, 0xd, 1).eax, 0);
        let names = policy.hidden_features(&host());
        assert!(names.contains(&"cx16") && names.contains(&"smap") && names.contains(&"vmx"));
    }

    #[test]
    fn the_host_profile_keeps_simd_but_normalises() {
        let c = CpuidPolicy::new(&host(), CpuProfile::Host, 1).for_vcpu(0);
        let leaf1 = get(&c, 1, 0);
        assert_ne!(leaf1.ecx & (1 << 13), 0, "cx16 stays");
        assert_ne!(leaf1.ecx & (1 << 26), 0, "xsave stays");
        assert_eq!(leaf1.ecx & (1 << 5), 0, "no vmx");
        assert_ne!(leaf1.ecx & LEAF1_HYPERVISOR, 0);
        assert_ne!(get(&c, 0xd, 0).eax, 0);
        assert_eq!(get(&c, 0xa, 0).eax, 0, "no PMU");
        assert_eq!(get(&c, 6, 0).eax, LEAF6_ARAT);
    }

    #[test]
    fn every_vcpu_gets_the_same_cpuid_but_its_apic_id() {
        let policy = CpuidPolicy::new(&host(), CpuProfile::Emulated, 3);
        let zero = policy.for_vcpu(0);
        for vcpu in 1..3u8 {
            let other = policy.for_vcpu(vcpu);
            assert_eq!(zero.as_slice().len(), other.as_slice().len());
            for (a, b) in zero.as_slice().iter().zip(other.as_slice()) {
                let id = u32::from(vcpu);
                match a.function {
                    1 => {
                        assert_eq!(b.ebx >> 24, id);
                        assert_eq!(a.ebx & 0x00ff_ffff, b.ebx & 0x00ff_ffff);
                        assert_eq!((a.eax, a.ecx, a.edx), (b.eax, b.ecx, b.edx));
                    }
                    0xb | 0x1f => {
                        assert_eq!(b.edx, id);
                        assert_eq!((a.eax, a.ebx, a.ecx), (b.eax, b.ebx, b.ecx));
                    }
                    _ => assert_eq!(
                        (a.eax, a.ebx, a.ecx, a.edx),
                        (b.eax, b.ebx, b.ecx, b.edx),
                        "leaf {:#x}",
                        a.function
                    ),
                }
            }
        }
        // Topology: 3 vCPUs are 3 cores of one package, one thread each.
        let leaf1 = get(&zero, 1, 0);
        assert_eq!((leaf1.ebx >> 16) & 0xff, 3);
        assert_eq!(get(&zero, 0xb, 0).ebx, 1);
        assert_eq!((get(&zero, 0xb, 1).eax, get(&zero, 0xb, 1).ebx), (2, 3));
        assert_eq!(get(&zero, 4, 0).eax >> 26, 2);
        assert_eq!(get(&zero, 0x8000_0008, 0).ecx & 0xff, 2);
        let table = policy.describe(&host());
        assert!(table.starts_with("# profile=emulated vcpus=3 hidden="));
        assert!(table.contains("vcpu2 0x00000001 0x00 Ebx=0x02"));
    }
}

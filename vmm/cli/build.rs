//! Link options for the `vmm` binary only (no dependency is rebuilt for
//! them).
//!
//! `-z pack-relative-relocs` stores the binary's relative relocations as
//! DT_RELR bitmaps instead of 24-byte `Elf64_Rela` entries: the dynamic
//! loader reads a few KiB at start instead of ~350 KiB (14,500 entries,
//! mostly vtables and string slices in `.data.rel.ro`), which is both page
//! faults and resident pages at every VMM start. Needs binutils 2.38 and
//! glibc 2.36 (older linkers ignore the option with a warning).
//!
//! The functions a boot runs are packed at the start of `.text` by the
//! `lean` build's linker wrapper (`text-order/linker.sh`, set by
//! `images/build.sh`), for `vmm` and `virt-launcher` alike.

fn main() {
    println!("cargo:rustc-link-arg-bin=vmm=-Wl,-z,pack-relative-relocs");
}

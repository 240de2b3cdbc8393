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
//! `--symbol-ordering-file text-order/vmm.order` puts the functions a boot
//! runs next to each other at the start of `.text`. Spread over the program,
//! they were touched in 33 separate 64 KiB windows, and each first touch
//! maps the whole window around it (the kernel's fault-around); packed, in 9
//! (`vmm/cli/text-order/README.md`). The option is LLD's, the default linker
//! of Rust 1.95 on x86_64 Linux; names the program lacks are ignored.

fn main() {
    println!("cargo:rustc-link-arg-bin=vmm=-Wl,-z,pack-relative-relocs");
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    for arg in [
        "--symbol-ordering-file",
        &format!("{dir}/text-order/vmm.order"),
        "--no-warn-symbol-ordering",
    ] {
        println!("cargo:rustc-link-arg-bin=vmm=-Xlinker");
        println!("cargo:rustc-link-arg-bin=vmm={arg}");
    }
}

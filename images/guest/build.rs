//! Link arguments for the bare-metal binary: no C runtime, no libc, and our
//! linker script (it needs an absolute path, hence a build script).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=linker.ld");
    for arg in [
        "-nostartfiles",
        "-nostdlib",
        "-static",
        "-Wl,--build-id=none",
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/linker.ld");
}

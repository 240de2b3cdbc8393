//! A dynamically linked program starts only where its ELF interpreter (`/lib64/ld-linux-x86-64.so.2`)
//! exists. Images here hold no C library, so a program built without `+crt-static` would fail in
//! the cluster with a bare "no such file or directory"; the builder refuses it up front instead.

use crate::error::Error;
use crate::spec::{Entry, Kind};
use object::Endianness;
use object::read::elf::{ElfFile64, ProgramHeader};
use std::collections::BTreeSet;

/// The ELF interpreter `data` asks for, if it is a 64-bit ELF file that has one.
pub fn interpreter(data: &[u8]) -> Option<String> {
    let elf = ElfFile64::<Endianness>::parse(data).ok()?;
    let endian = elf.endian();
    elf.elf_program_headers().iter().find_map(|header| {
        let raw = header.interpreter(endian, data).ok()??;
        Some(String::from_utf8_lossy(raw).into_owned())
    })
}

/// Refuses an ELF file whose interpreter is not an entry of the same image.
pub fn check_interpreters(entries: &[Entry]) -> Result<(), Error> {
    let present: BTreeSet<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    for entry in entries {
        let Kind::File(data) = &entry.kind else {
            continue;
        };
        if let Some(interpreter) = interpreter(data)
            && !present.contains(interpreter.trim_start_matches('/'))
        {
            return Err(Error::Spec(format!(
                "/{} is dynamically linked (interpreter {interpreter}), which this image lacks: \
                 link it statically (RUSTFLAGS=\"-C target-feature=+crt-static\")",
                entry.path
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ImageSpec;

    /// The test binary itself is an ordinary (dynamically linked) Rust program.
    fn dynamic_program() -> Vec<u8> {
        std::fs::read(std::env::current_exe().unwrap()).unwrap()
    }

    #[test]
    fn a_dynamic_program_names_its_interpreter() {
        let interpreter = interpreter(&dynamic_program()).expect("an interpreter");
        assert!(interpreter.contains("ld-linux"), "{interpreter}");
        assert_eq!(super::interpreter(b"#!/bin/sh\necho hi\n"), None);
    }

    #[test]
    fn a_dynamic_program_without_its_loader_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("prog"), dynamic_program()).unwrap();
        let spec = ImageSpec::from_yaml(
            "name: localhost/a/b:c\nentries:\n  - {path: /usr/bin/prog, from: prog, mode: \"0755\"}\n",
        )
        .unwrap();
        let error = spec.resolve(dir.path()).unwrap_err().to_string();
        assert!(error.contains("dynamically linked"), "{error}");

        // With the loader in the image the builder lets it through (the libraries are then
        // the spec's business).
        let loader = interpreter(&dynamic_program()).unwrap();
        std::fs::write(dir.path().join("ld"), b"loader").unwrap();
        let spec = ImageSpec::from_yaml(&format!(
            "name: localhost/a/b:c\nentries:\n  - {{path: /usr/bin/prog, from: prog}}\n  - {{path: {loader}, from: ld}}\n"
        ))
        .unwrap();
        spec.resolve(dir.path()).expect("accepted with its loader");
    }
}

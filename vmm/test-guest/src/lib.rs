//! The test guest (images/guest), built by build.rs and embedded here so the
//! `vmm` command can boot it without any file (`vmm selftest`,
//! `vmm test-guest --output PATH`) and tests can boot it through the library.
//! A crate of its own so that the VMM library never carries it.
//!
//! Its command line chooses what it does (see images/guest/src/cmdline.rs):
//! `checks=serial,bootparams,idt,mem,smp,badio,panic,triplefault,blk,net,rng`,
//! `exit=poweroff|reset|halt|tick`, `code=N`, `cpus=N`, `wait=SECONDS`. It
//! prints `TEST <name> PASS|FAIL <detail>` lines and `DONE passed=N failed=M`.

pub mod blkfill;
/// What the guest's `blk=tick` writes (images/guest/src/virtio/blktick.rs).
#[path = "../../../images/guest/src/virtio/blktick_pattern.rs"]
pub mod blktick;
pub mod disks;
pub mod stock_linux;

/// The guest's ELF image.
pub static ELF: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/test-guest.elf"));

/// One `TEST` line from the guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    pub name: String,
    pub pass: bool,
    pub detail: String,
}

/// The `TEST <name> PASS|FAIL <detail>` lines in serial output.
pub fn parse_results(output: &str) -> Vec<CheckResult> {
    output
        .lines()
        .filter_map(|line| {
            let rest = line.trim_end_matches('\r').strip_prefix("TEST ")?;
            let mut parts = rest.splitn(3, ' ');
            let name = parts.next()?.to_string();
            let pass = match parts.next()? {
                "PASS" => true,
                "FAIL" => false,
                _ => return None,
            };
            Some(CheckResult {
                name,
                pass,
                detail: parts.next().unwrap_or("").to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_guest_is_an_elf_entering_at_1_mib() {
        assert_eq!(&ELF[..4], b"\x7fELF");
        let entry = u64::from_le_bytes(ELF[24..32].try_into().unwrap());
        assert_eq!(entry, 0x10_0000);
    }

    #[test]
    fn result_lines_are_parsed_and_noise_ignored() {
        let out = "BOOT test-guest\nTEST serial PASS com1=0x3f8\r\nTEST smp FAIL cpus=1 expected=2\nTEST x MAYBE\nTESTING\nTEST idt PASS\n";
        let results = parse_results(out);
        assert_eq!(
            results,
            vec![
                CheckResult {
                    name: "serial".into(),
                    pass: true,
                    detail: "com1=0x3f8".into()
                },
                CheckResult {
                    name: "smp".into(),
                    pass: false,
                    detail: "cpus=1 expected=2".into()
                },
                CheckResult {
                    name: "idt".into(),
                    pass: true,
                    detail: String::new()
                },
            ]
        );
    }
}

//! The boot's text order list (`vmm/cli/text-order/boot.order`) is checked against the
//! `vmm` that cargo builds for these tests, so a list gone stale fails CI, not only the
//! release image build that links with it (`text-order/linker.sh`).
//!
//! The list's names carry no hashes, so they match this debug build too: every listed
//! function exists in it (a debug build inlines less than the `lean` one the list comes
//! from). What makes the list stale is the boot's code changing: functions renamed, moved or
//! removed. `generate.sh --check` counts the listed Rust functions the program defines, with
//! the same name matching as the linker wrapper (`hashless.sed`).

use std::path::Path;
use std::process::Command;

/// The share of listed Rust names the program must define, as `linker.sh` requires of the
/// `lean` `vmm` it links.
const NEEDED_PERCENT: usize = 90;

/// `text order: N of M listed Rust functions are defined in …` → (N, M).
fn counts(line: &str) -> Option<(usize, usize)> {
    let rest = line.strip_prefix("text order: ")?;
    let mut words = rest.split_whitespace();
    let found = words.next()?.parse().ok()?;
    let listed = words.nth(1)?.parse().ok()?;
    Some((found, listed))
}

#[test]
fn the_boot_text_order_list_matches_the_vmm_built_from_this_tree() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("text-order/generate.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--check")
        .arg(env!("CARGO_BIN_EXE_vmm"))
        .output()
        .expect("bash runs generate.sh (needs nm and sed: binutils)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "generate.sh --check failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (found, listed) = stdout
        .lines()
        .find_map(counts)
        .unwrap_or_else(|| panic!("no count in generate.sh's output: {stdout}"));
    assert!(listed > 300, "the list names only {listed} Rust functions");
    assert!(
        found * 100 >= listed * NEEDED_PERCENT,
        "the text order list is stale: {found} of its {listed} Rust functions are in vmm \
         (at least {NEEDED_PERCENT}% needed); regenerate it (vmm/cli/text-order/README.md)"
    );
}

#[test]
fn the_count_line_is_read() {
    assert_eq!(
        counts("text order: 417 of 439 listed Rust functions are defined in /x/vmm"),
        Some((417, 439))
    );
    assert_eq!(counts("text order: many of 439"), None);
    assert_eq!(counts("something else"), None);
}

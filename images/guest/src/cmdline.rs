//! The guest's command line: `key=value` words separated by spaces.
//!
//! Options this guest understands (all optional):
//! - `checks=a,b,c` — run only these checks, in the guest's fixed order.
//!   Without it the default checks run: `serial,bootparams,idt,mem,mptable,smp` and
//!   the virtio checks for every device found. Checks that need
//!   something extra (`initrd`) or end the run (`badio`, `panic`,
//!   `triplefault`) run only when named, as do `cpuid`, `emulation`,
//!   `interrupts` (`int n`, `int3`, `int 2` and their gate checks), `acpi`,
//!   `pci`, `smbios` (the SMBIOS tables) and `rtc` (the CMOS clock, which
//!   sleeps 1.1 s to see it tick).
//! - `exit=poweroff|reset|halt|tick` — how the guest ends (see `exit.rs`); in the waiting
//!   modes (`halt`, `tick`) the guest also echoes what arrives on its serial console.
//! - `dirty=MIB` — with `exit=tick`: rewrite and check MIB MiB of memory on every
//!   tick (see `dirty.rs`; live migration's tests).
//! - `rng=tick` — with `exit=tick`: keep the first virtio-rng running and ask it for
//!   64 bytes every 25 ticks (see `virtio/rng.rs`).
//! - `blk=tick` — with `exit=tick`: keep the first virtio-blk running and write,
//!   flush and read back a sector every 25 ticks (see `virtio/blktick.rs`).
//! - `net=tick` — with `exit=tick`: keep the first virtio-net running, send a frame
//!   every 25 ticks and print the test frames received (see `virtio/nettick.rs`).
//! - `acpi_delay=MS` — in the waiting exit modes, enable the power button
//!   (route the GED's interrupt) only MS milliseconds after the checks, as
//!   a guest whose ACPI comes up late: a press before must still arrive.
//! - `code=N` — exit code written to port 0xf4 when every check passed
//!   (default 0; any failure gives 1).
//! - `smp=direct|sipi` — how the `smp` check gets secondary vCPUs running:
//!   `direct` only waits for those the VMM started, `sipi` starts them with
//!   INIT/SIPI at once; by default it waits 100 ms, then sends INIT/SIPI.
//! - `cpus=N` — vCPUs the `smp` and `mptable` checks expect (default:
//!   CPUID leaf 1).
//! - `virtio_mmio.device=<size>@<base>:<irq>` — one per virtio-mmio device,
//!   as Linux reads them (`4K@0xd0000000:5`).

/// The words of the command line.
pub fn words(cmdline: &[u8]) -> impl Iterator<Item = &[u8]> {
    cmdline
        .split(|&b| b == b' ' || b == b'\t' || b == b'\n')
        .filter(|w| !w.is_empty())
}

/// The value of the last `key=value` word with this key.
pub fn value<'a>(cmdline: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let key = key.as_bytes();
    let mut found = None;
    for word in words(cmdline) {
        if word.len() > key.len() && word.starts_with(key) && word[key.len()] == b'=' {
            found = Some(&word[key.len() + 1..]);
        }
    }
    found
}

/// Whether `checks=` names this check.
pub fn check_named(cmdline: &[u8], name: &str) -> bool {
    match value(cmdline, "checks") {
        Some(list) => list.split(|&b| b == b',').any(|n| n == name.as_bytes()),
        None => false,
    }
}

/// Whether a default check should run: there is no `checks=` or it names the check.
pub fn check_selected(cmdline: &[u8], name: &str) -> bool {
    value(cmdline, "checks").is_none() || check_named(cmdline, name)
}

/// Parses a decimal or 0x-prefixed hex number with an optional K/M/G suffix.
pub fn parse_u64(text: &[u8]) -> Option<u64> {
    let (digits, shift) = match text.last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let (digits, radix) = match digits {
        [b'0', b'x' | b'X', rest @ ..] => (rest, 16),
        _ => (digits, 10),
    };
    if digits.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for &d in digits {
        let digit = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' if radix == 16 => d - b'a' + 10,
            b'A'..=b'F' if radix == 16 => d - b'A' + 10,
            _ => return None,
        };
        value = value.checked_mul(radix)?.checked_add(u64::from(digit))?;
    }
    value
        .checked_mul(1u64 << shift)
        .filter(|v| v >> shift == value)
}

/// Most virtio-mmio devices the guest keeps track of.
pub const MAX_VIRTIO_DEVICES: usize = 16;

/// The `virtio_mmio.device=<size>@<base>:<irq>` entries, as (base, irq).
/// Malformed entries are skipped (and counted in the second value).
pub fn virtio_devices(
    cmdline: &[u8],
    out: &mut [(u64, u32); MAX_VIRTIO_DEVICES],
) -> (usize, usize) {
    const KEY: &[u8] = b"virtio_mmio.device=";
    let mut count = 0;
    let mut bad = 0;
    for word in words(cmdline) {
        let Some(spec) = word.strip_prefix(KEY) else {
            continue;
        };
        match parse_virtio_device(spec) {
            Some(dev) if count < MAX_VIRTIO_DEVICES => {
                out[count] = dev;
                count += 1;
            }
            _ => bad += 1,
        }
    }
    (count, bad)
}

fn parse_virtio_device(spec: &[u8]) -> Option<(u64, u32)> {
    let at = spec.iter().position(|&b| b == b'@')?;
    let colon = spec.iter().rposition(|&b| b == b':')?;
    if colon < at {
        return None;
    }
    let size = parse_u64(&spec[..at])?;
    let base = parse_u64(&spec[at + 1..colon])?;
    let irq = parse_u64(&spec[colon + 1..])?;
    if size == 0 || irq > 255 {
        return None;
    }
    Some((base, irq as u32))
}

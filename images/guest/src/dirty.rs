//! `dirty=MIB` (with `exit=tick`): the guest keeps rewriting MIB MiB of its memory, from
//! 16 MiB up, one 8-byte word per 4 KiB page on every tick, and checks that each word
//! still holds what the previous pass wrote there (the pass number and the page). A VMM
//! that loses or stales a page the guest wrote (a live migration that missed one)
//! shows as `TEST dirty FAIL`; a pass that finds every page right every 100 ticks
//! prints `dirty ok pass=N`.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::cmdline;

/// Where the pages start: above the guest's image and stacks.
const BASE: u64 = 16 << 20;
const PAGE: u64 = 4096;

static PAGES: AtomicU64 = AtomicU64::new(0);
static PASS: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicBool = AtomicBool::new(false);

/// Reads `dirty=` (bounded by the RAM below 4 GiB the page tables map).
pub fn init(cmdline: &[u8], ram_bytes: u64) {
    let Some(mib) = cmdline::value(cmdline, "dirty").and_then(cmdline::parse_u64) else {
        return;
    };
    let end = ram_bytes.min(crate::checks::MAPPED_END);
    let room = end.saturating_sub(BASE) / PAGE;
    PAGES.store((mib.saturating_mul(256)).min(room), Ordering::Relaxed);
}

fn word(pass: u64, page: u64) -> u64 {
    (pass << 32) | page
}

/// One pass over the pages: check, then write the next pass's words.
pub fn pass() {
    let pages = PAGES.load(Ordering::Relaxed);
    if pages == 0 {
        return;
    }
    let pass = PASS.load(Ordering::Relaxed);
    let mut bad = None;
    for page in 0..pages {
        let ptr = (BASE + page * PAGE) as *mut u64;
        // SAFETY: the range lies in RAM mapped by the boot page tables (see `init`), above
        // this program, and nothing else uses it.
        let found = unsafe { ptr.read_volatile() };
        if pass > 0 && found != word(pass, page) && bad.is_none() {
            bad = Some((page, found));
        }
        // SAFETY: as above.
        unsafe { ptr.write_volatile(word(pass + 1, page)) };
    }
    PASS.store(pass + 1, Ordering::Relaxed);
    if let Some((page, found)) = bad
        && !FAILED.swap(true, Ordering::Relaxed)
    {
        let mut d = crate::report::Detail::new();
        d.str("TEST dirty FAIL page=")
            .dec(page)
            .str(" pass=")
            .dec(pass)
            .str(" found=")
            .hex(found)
            .str("\n");
        crate::serial::write(d.as_bytes());
    } else if (pass + 1) % 100 == 0 && !FAILED.load(Ordering::Relaxed) {
        let mut d = crate::report::Detail::new();
        d.str("dirty ok pass=").dec(pass + 1).str("\n");
        crate::serial::write(d.as_bytes());
    }
}

//! `dirty=MIB` (with `exit=tick`): the guest keeps rewriting MIB MiB of its memory, from
//! 16 MiB up, one 8-byte word per 4 KiB page, and checks that each word still holds
//! what was last written there (the pass number and the page). Every page is written
//! once at the start; then pass N (one per tick) rewrites the quarter of the pages whose
//! number is N mod 4, so the pages the guest dirties change from one tick to the next.
//! Another MIB MiB above them is written once at the start and checked on every pass.
//! A VMM that loses or stales a page the guest wrote (a live migration that missed one)
//! shows as `TEST dirty FAIL`; every 100 passes without one print `dirty ok pass=N`.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::cmdline;

/// Where the pages start: above the guest's image and stacks.
const BASE: u64 = 16 << 20;
const PAGE: u64 = 4096;
/// The pass that wrote the written-once pages.
const ONCE: u64 = 0xffff_ffff;

static PAGES: AtomicU64 = AtomicU64::new(0);
static PASS: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicBool = AtomicBool::new(false);

/// Reads `dirty=` (bounded by the RAM below 4 GiB the page tables map) and writes
/// every page once.
pub fn init(cmdline: &[u8], ram_bytes: u64) {
    let Some(mib) = cmdline::value(cmdline, "dirty").and_then(cmdline::parse_u64) else {
        return;
    };
    let end = ram_bytes.min(crate::checks::MAPPED_END);
    let room = end.saturating_sub(BASE) / PAGE / 2;
    let pages = mib.saturating_mul(256).min(room);
    for page in 0..pages {
        write(page, word(0, page));
        write(pages + page, word(ONCE, page));
    }
    PAGES.store(pages, Ordering::Relaxed);
}

fn word(pass: u64, page: u64) -> u64 {
    (pass << 32) | page
}

fn read(page: u64) -> u64 {
    // SAFETY: `init` bounded the pages to RAM mapped by the boot page tables, above
    // this program; nothing else uses them.
    unsafe { ((BASE + page * PAGE) as *const u64).read_volatile() }
}

fn write(page: u64, value: u64) {
    // SAFETY: as in `read`.
    unsafe { ((BASE + page * PAGE) as *mut u64).write_volatile(value) }
}

/// One pass: check the written-once pages and this pass's quarter, then rewrite the
/// quarter.
pub fn pass() {
    let pages = PAGES.load(Ordering::Relaxed);
    if pages == 0 {
        return;
    }
    let pass = PASS.load(Ordering::Relaxed) + 1;
    let mut bad = None;
    for page in 0..pages {
        if read(pages + page) != word(ONCE, page) && bad.is_none() {
            bad = Some((pages + page, read(pages + page)));
        }
    }
    // The quarter this pass rewrites was last written 4 passes ago (or at the start).
    let last = pass.saturating_sub(4);
    let mut page = pass % 4;
    while page < pages {
        let found = read(page);
        if found != word(last, page) && bad.is_none() {
            bad = Some((page, found));
        }
        write(page, word(pass, page));
        page += 4;
    }
    PASS.store(pass, Ordering::Relaxed);
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
    } else if pass % 100 == 0 && !FAILED.load(Ordering::Relaxed) {
        let mut d = crate::report::Detail::new();
        d.str("dirty ok pass=").dec(pass).str("\n");
        crate::serial::write(d.as_bytes());
    }
}

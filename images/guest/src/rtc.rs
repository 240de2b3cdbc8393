//! `rtc`: the CMOS real-time clock on ports 0x70/0x71, read as Linux's
//! `mc146818_get_time` does: wait for status A's update-in-progress bit to fall, read
//! the time registers, and read again if an update began meanwhile (UIP set, or the
//! seconds changed). Decodes BCD or binary and the 12-hour form as status B says,
//! checks status D's valid bit and that the clock ticks: a second reading after about
//! 1.1 s of local APIC timer sleep must be at least a second later. Every loop is bounded.

use crate::io::{inb, outb};
use crate::report::{Detail, Reporter};

const INDEX: u16 = 0x70;
const DATA: u16 = 0x71;
const STATUS_A: u8 = 0x0a;
const STATUS_B: u8 = 0x0b;
const STATUS_D: u8 = 0x0d;
const CENTURY: u8 = 0x32;
const A_UIP: u8 = 0x80;
const B_BINARY: u8 = 0x04;
const B_24_HOUR: u8 = 0x02;
const D_VALID: u8 = 0x80;
/// Reads of status A while waiting for UIP to fall (it is set for 244 µs at most).
const MAX_UIP_POLLS: u32 = 10_000;
/// Attempts at a consistent reading.
const MAX_ATTEMPTS: u32 = 8;
/// How long the check sleeps between its two readings, and the most the clock may
/// advance meanwhile (the sleep takes longer than its length under an emulating KVM).
const TICK_WAIT_MS: u32 = 1100;
const MAX_ELAPSED_S: i64 = 30;

fn cmos(register: u8) -> u8 {
    outb(INDEX, register);
    inb(DATA)
}

#[derive(Clone, Copy)]
struct Time {
    year: i64,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
}

impl Time {
    fn valid(&self) -> bool {
        (1..=12).contains(&self.month)
            && (1..=31).contains(&self.day)
            && self.hour < 24
            && self.minute < 60
            && self.second < 60
    }

    /// Seconds since 1970-01-01 (proleptic Gregorian calendar).
    fn epoch_seconds(&self) -> i64 {
        let month = i64::from(self.month);
        let year = if month <= 2 { self.year - 1 } else { self.year };
        let era = year.div_euclid(400);
        let year_of_era = year - era * 400;
        let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + i64::from(self.day) - 1;
        let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
        let days = era * 146_097 + day_of_era - 719_468;
        days * 86_400
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
    }
}

/// One reading, or None if UIP did not fall or an update began while reading.
fn read_once() -> Option<Time> {
    let mut polls = 0;
    while cmos(STATUS_A) & A_UIP != 0 {
        polls += 1;
        if polls == MAX_UIP_POLLS {
            return None;
        }
    }
    let raw = [0x00, 0x02, 0x04, 0x07, 0x08, 0x09, CENTURY].map(cmos);
    let b = cmos(STATUS_B);
    if cmos(STATUS_A) & A_UIP != 0 || cmos(0x00) != raw[0] {
        return None;
    }
    let decode = |v: u8| {
        if b & B_BINARY != 0 {
            v
        } else {
            (v >> 4) * 10 + (v & 0x0f)
        }
    };
    let hour = if b & B_24_HOUR != 0 {
        decode(raw[2])
    } else {
        decode(raw[2] & 0x7f) % 12 + if raw[2] & 0x80 != 0 { 12 } else { 0 }
    };
    Some(Time {
        year: i64::from(decode(raw[6])) * 100 + i64::from(decode(raw[5])),
        month: decode(raw[4]),
        day: decode(raw[3]),
        hour,
        minute: decode(raw[1]),
        second: decode(raw[0]),
    })
}

fn read_time() -> Option<Time> {
    (0..MAX_ATTEMPTS).find_map(|_| read_once())
}

fn two(d: &mut Detail, value: u8) {
    d.bytes(&[b'0' + value / 10 % 10, b'0' + value % 10]);
}

pub fn check(r: &mut dyn Reporter) {
    let valid_ram = cmos(STATUS_D) & D_VALID != 0;
    let Some(first) = read_time() else {
        r.result(
            "rtc",
            false,
            "no consistent reading: UIP stuck or updates racing",
        );
        return;
    };
    crate::irq::sleep_ms(TICK_WAIT_MS);
    let Some(second) = read_time() else {
        r.result("rtc", false, "no consistent second reading");
        return;
    };
    let mut d = Detail::new();
    d.str("time=");
    if (0..10_000).contains(&second.year) {
        d.dec(second.year as u64 / 1000)
            .dec(second.year as u64 / 100 % 10)
            .dec(second.year as u64 / 10 % 10)
            .dec(second.year as u64 % 10);
    } else {
        d.str("????");
    }
    d.str("-");
    two(&mut d, second.month);
    d.str("-");
    two(&mut d, second.day);
    d.str("T");
    two(&mut d, second.hour);
    d.str(":");
    two(&mut d, second.minute);
    d.str(":");
    two(&mut d, second.second);
    let valid = first.valid() && second.valid();
    let elapsed = second.epoch_seconds() - first.epoch_seconds();
    d.str(" elapsed=");
    if elapsed < 0 {
        d.str("-").dec(elapsed.unsigned_abs());
    } else {
        d.dec(elapsed as u64);
    }
    if !valid_ram {
        d.str(" status_d_invalid");
    }
    if !valid {
        d.str(" fields_out_of_range");
    }
    let ticks = (1..=MAX_ELAPSED_S).contains(&elapsed);
    r.result("rtc", valid_ram && valid && ticks, d.as_str());
}

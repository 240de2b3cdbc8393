//! The CMOS real-time clock (a Motorola MC146818 as PCs have it) on ports 0x70 (index) and
//! 0x71 (data): what a guest reads the date and time from at boot (Linux's `rtc_cmos`,
//! `hwclock`, firmware-less guests) and the 128 bytes of CMOS RAM around it.
//!
//! Written here: no well-kept crate emulates it (vm-superio has only the ARM PL031).
//!
//! - The index register keeps 7 bits; bit 7 (the NMI mask on real boards) is ignored.
//!   Reading port 0x70 gives 0xff (it is write-only).
//! - Seconds, minutes, hours, weekday (1 = Sunday), day, month, year (0x00-0x09, the alarm
//!   registers 0x01/0x03/0x05 being plain storage) and the century (0x32, also at 0x37 as
//!   QEMU has it) in BCD or binary (status B bit 2) and 24- or 12-hour form (bit 1, with
//!   bit 7 of the hour for PM); the default is 24-hour BCD (B = 0x02), A = 0x26 (the
//!   32.768 kHz time base, 1024 Hz rate).
//! - The time is computed at each read: the host's `CLOCK_REALTIME` plus an offset that
//!   starts as `VmConfig::rtc_offset_seconds` and changes when the guest sets the clock. As
//!   QEMU does, setting status B's SET bit (or resetting the divider, A bits 6-5) stops the
//!   clock: the time registers then hold what the guest writes, and clearing the bit starts
//!   the clock from them, keeping the new offset from the host's clock (Linux's `hwclock -w`
//!   works that way; a divider reset released starts the first second half a second later,
//!   as the chip's data sheet says). A time register written while the clock runs sets it
//!   at once, as on QEMU.
//! - Status A bit 7 (UIP) is set for the last 244 µs before each second's update (QEMU's
//!   window, 8 periods of 32.768 kHz): a guest waiting for it to fall never waits longer,
//!   and after it falls has at least that long before the registers change.
//! - Status C's flags are computed when it is read, and reading clears them: UF when a
//!   second ended since the last read, PF when a periodic-rate period (A's rate bits) did;
//!   IRQF when one of them is enabled in B. AF (alarm) is never set.
//! - Status D reads 0x80 (valid RAM and time).
//! - **No interrupts**: IRQ 8 is never raised, and the DSDT's RTC device declares none, so
//!   Linux's `rtc_cmos` probes it with "no alarms" and the RTC core emulates update
//!   interrupts by polling (`hwclock` busy-waits for the second to change).
//! - The rest of the 128 bytes is CMOS RAM the guest may read and write (0x0f, the shutdown
//!   status, among it); it starts as zeroes.
//!
//! The device runs on the vCPU threads (port I/O exits); reading the host's clock is
//! `clock_gettime` through the vDSO.

use crate::bus::BusDevice;
use crate::wire::{Decoder, Encoder, FormatError};

/// Where the guest's time comes from: nanoseconds since the Unix epoch.
pub(crate) type Clock = Box<dyn Fn() -> i128 + Send>;

const NS_PER_S: i128 = 1_000_000_000;
/// How long UIP is set before each update: 8 periods of 32.768 kHz (244.14 µs).
const UIP_HOLD_NS: i128 = 244_141;
/// Where in its second the clock starts when a divider reset is released.
const HALF_SECOND_NS: i128 = 500_000_000;
/// The largest offset from the host's clock taken from the configuration (about 31,700
/// years), so that the arithmetic below cannot overflow.
const MAX_OFFSET_S: i64 = 1_000_000_000_000;
const SECONDS_PER_DAY: i64 = 86_400;

const SECONDS: u8 = 0x00;
const MINUTES: u8 = 0x02;
const HOURS: u8 = 0x04;
const WEEKDAY: u8 = 0x06;
const DAY: u8 = 0x07;
const MONTH: u8 = 0x08;
const YEAR: u8 = 0x09;
const STATUS_A: u8 = 0x0a;
const STATUS_B: u8 = 0x0b;
const STATUS_C: u8 = 0x0c;
const STATUS_D: u8 = 0x0d;
const CENTURY: u8 = 0x32;
/// IBM PS/2's place for the century; the same register here.
const CENTURY_PS2: u8 = 0x37;

const A_UIP: u8 = 0x80;
/// Divider bits 6-5 both set: the divider is held in reset.
const A_DIVIDER_RESET: u8 = 0x60;
const A_DIVIDER: u8 = 0x70;
/// The divider values that run the clock (time bases of 4.19 MHz, 1.05 MHz, 32.768 kHz).
const A_DIVIDER_RUNNING_MAX: u8 = 0x20;
const A_RATE: u8 = 0x0f;
const A_DEFAULT: u8 = 0x26;
const B_SET: u8 = 0x80;
const B_PIE: u8 = 0x40;
const B_UIE: u8 = 0x10;
const B_BINARY: u8 = 0x04;
const B_24_HOUR: u8 = 0x02;
const B_DEFAULT: u8 = B_24_HOUR;
const C_IRQF: u8 = 0x80;
const C_PF: u8 = 0x40;
const C_UF: u8 = 0x10;
const D_VALID: u8 = 0x80;

/// The time registers' values as binary numbers, the hour in 24-hour form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fields {
    second: u8,
    minute: u8,
    hour: u8,
    /// 1 = Sunday.
    weekday: u8,
    day: u8,
    month: u8,
    /// The year of the century (0-99).
    year: u8,
    century: u8,
}

/// A value proven to be in 0..=255 (a calendar field or a remainder).
fn small(value: i64) -> u8 {
    u8::try_from(value).unwrap_or(0)
}

/// Days since 1970-01-01 of a date in the proleptic Gregorian calendar (month 1-12).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date (year, month 1-12, day 1-31) of a day counted from 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400;
    (if month <= 2 { year + 1 } else { year }, month, day)
}

impl Fields {
    fn from_seconds(seconds: i64) -> Fields {
        let days = seconds.div_euclid(SECONDS_PER_DAY);
        let in_day = seconds.rem_euclid(SECONDS_PER_DAY);
        let (year, month, day) = civil_from_days(days);
        Fields {
            second: small(in_day % 60),
            minute: small(in_day / 60 % 60),
            hour: small(in_day / 3600),
            // 1970-01-01 was a Thursday (5).
            weekday: small((days + 4).rem_euclid(7) + 1),
            day: small(day),
            month: small(month),
            year: small(year.rem_euclid(100)),
            century: small(year.div_euclid(100).rem_euclid(100)),
        }
    }

    /// Seconds since the epoch, leniently: whatever a guest wrote counts (a day past the end
    /// of its month runs into the next one, a month out of range is clamped), the weekday
    /// not at all.
    fn to_seconds(self) -> i64 {
        let year = i64::from(self.century) * 100 + i64::from(self.year);
        let days = days_from_civil(year, i64::from(self.month.clamp(1, 12)), 1)
            + i64::from(self.day.max(1))
            - 1;
        days * SECONDS_PER_DAY
            + i64::from(self.hour) * 3600
            + i64::from(self.minute) * 60
            + i64::from(self.second)
    }
}

/// The host's `CLOCK_REALTIME` in nanoseconds since the epoch.
pub(crate) fn host_realtime_ns() -> i128 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    match since {
        Ok(d) => i128::try_from(d.as_nanos()).unwrap_or(i128::MAX),
        Err(e) => i128::try_from(e.duration().as_nanos()).map_or(i128::MIN, |ns| -ns),
    }
}

pub(crate) struct Rtc {
    index: u8,
    /// Status A (without UIP) and B, the alarm registers and the CMOS RAM; the time
    /// registers and status C and D are not kept here.
    cmos: [u8; 128],
    /// Guest time = host time + this, while the clock runs.
    offset_ns: i128,
    /// While the clock is stopped (SET, or the divider in reset): the time registers and
    /// where in its second the clock stopped.
    stopped: Option<(Fields, i128)>,
    /// Guest time at the last read of status C.
    flags_since_ns: i128,
    clock: Clock,
}

/// Nanosecond values a restored clock may hold at most (about 40 million millennia):
/// sums and differences of them cannot overflow.
const MAX_RESTORED_NS: i128 = 1 << 100;

impl Fields {
    fn save(self, e: &mut Encoder) {
        let f = self;
        e.bytes(&[
            f.second, f.minute, f.hour, f.weekday, f.day, f.month, f.year, f.century,
        ]);
    }

    fn restore(d: &mut Decoder) -> Result<Fields, FormatError> {
        let [second, minute, hour, weekday, day, month, year, century] = d.array()?;
        Ok(Fields {
            second,
            minute,
            hour,
            weekday,
            day,
            month,
            year,
            century,
        })
    }
}

impl Rtc {
    /// The clock's state (for migration to a VMM on a host with the same time: the
    /// guest's time stays an offset from the host's).
    pub(crate) fn save(&self, e: &mut Encoder) {
        e.u8(self.index);
        e.bytes(&self.cmos);
        e.i128(self.offset_ns);
        e.i128(self.flags_since_ns);
        match self.stopped {
            None => e.u8(0),
            Some((fields, phase)) => {
                e.u8(1);
                fields.save(e);
                e.i128(phase);
            }
        }
    }

    /// The clock as [`Rtc::save`] wrote it.
    pub(crate) fn restore(&mut self, d: &mut Decoder) -> Result<(), FormatError> {
        let index = d.u8()?;
        let cmos: [u8; 128] = d.array()?;
        let offset_ns = d.i128()?;
        let flags_since_ns = d.i128()?;
        let stopped = match d.u8()? {
            0 => None,
            1 => Some((Fields::restore(d)?, d.i128()?)),
            other => return Err(FormatError::Invalid(format!("RTC stopped flag {other}"))),
        };
        let in_range = |ns: i128| (-MAX_RESTORED_NS..=MAX_RESTORED_NS).contains(&ns);
        if !in_range(offset_ns)
            || !in_range(flags_since_ns)
            || stopped.is_some_and(|(_, phase)| !(0..NS_PER_S).contains(&phase))
        {
            return Err(FormatError::Invalid("RTC time out of range".into()));
        }
        self.index = index;
        self.cmos = cmos;
        self.offset_ns = offset_ns;
        self.flags_since_ns = flags_since_ns;
        self.stopped = stopped;
        Ok(())
    }
    /// A running clock `offset_seconds` ahead of the host's (clamped to ±31,700 years).
    pub(crate) fn new(offset_seconds: i64) -> Self {
        Self::with_clock(offset_seconds, Box::new(host_realtime_ns))
    }

    pub(crate) fn with_clock(offset_seconds: i64, clock: Clock) -> Self {
        let offset = offset_seconds.clamp(-MAX_OFFSET_S, MAX_OFFSET_S);
        let mut cmos = [0u8; 128];
        cmos[usize::from(STATUS_A)] = A_DEFAULT;
        cmos[usize::from(STATUS_B)] = B_DEFAULT;
        let mut rtc = Rtc {
            index: 0,
            cmos,
            offset_ns: i128::from(offset) * NS_PER_S,
            stopped: None,
            flags_since_ns: 0,
            clock,
        };
        rtc.flags_since_ns = rtc.guest_ns();
        rtc
    }

    fn reg(&self, index: u8) -> u8 {
        self.cmos[usize::from(index & 0x7f)]
    }

    fn running(&self) -> bool {
        self.reg(STATUS_B) & B_SET == 0 && self.reg(STATUS_A) & A_DIVIDER <= A_DIVIDER_RUNNING_MAX
    }

    fn divider_reset(&self) -> bool {
        self.reg(STATUS_A) & A_DIVIDER_RESET == A_DIVIDER_RESET
    }

    /// The guest's time now (as if running).
    fn guest_ns(&self) -> i128 {
        (self.clock)().saturating_add(self.offset_ns)
    }

    /// The time registers and the position in the second, now.
    fn now(&self) -> (Fields, i128) {
        match self.stopped {
            Some(stopped) => stopped,
            None => {
                let ns = self.guest_ns();
                // Within ±(host time + 31,700 years): fits an i64 in seconds.
                let seconds = i64::try_from(ns.div_euclid(NS_PER_S)).unwrap_or(0);
                (Fields::from_seconds(seconds), ns.rem_euclid(NS_PER_S))
            }
        }
    }

    /// Runs the clock from `fields`, `phase_ns` into their second.
    fn start_at(&mut self, fields: Fields, phase_ns: i128) {
        let guest = i128::from(fields.to_seconds()) * NS_PER_S + phase_ns;
        self.offset_ns = guest.saturating_sub((self.clock)());
        self.flags_since_ns = guest;
    }

    /// Stops or starts the clock after status A or B changed from `was_running`.
    fn update_running(&mut self, was_running: bool, divider_released: bool) {
        match (was_running, self.running()) {
            (true, false) => self.stopped = Some(self.now()),
            (false, true) => {
                let (fields, phase) = self.stopped.take().unwrap_or_else(|| self.now());
                let phase = if divider_released {
                    HALF_SECOND_NS
                } else {
                    phase
                };
                self.start_at(fields, phase);
            }
            _ => {}
        }
    }

    fn binary(&self) -> bool {
        self.reg(STATUS_B) & B_BINARY != 0
    }

    fn encode(&self, value: u8) -> u8 {
        if self.binary() {
            value
        } else {
            ((value / 10 % 10) << 4) | (value % 10)
        }
    }

    fn decode(&self, raw: u8) -> u8 {
        if self.binary() {
            raw
        } else {
            (raw >> 4) * 10 + (raw & 0x0f)
        }
    }

    fn encode_hour(&self, hour: u8) -> u8 {
        if self.reg(STATUS_B) & B_24_HOUR != 0 {
            return self.encode(hour);
        }
        let twelve = match hour % 12 {
            0 => 12,
            h => h,
        };
        self.encode(twelve) | if hour >= 12 { 0x80 } else { 0 }
    }

    fn decode_hour(&self, raw: u8) -> u8 {
        if self.reg(STATUS_B) & B_24_HOUR != 0 {
            return self.decode(raw);
        }
        let pm = raw & 0x80 != 0;
        self.decode(raw & 0x7f) % 12 + if pm { 12 } else { 0 }
    }

    fn read_time(&self, index: u8) -> u8 {
        let (f, _) = self.now();
        match index {
            SECONDS => self.encode(f.second),
            MINUTES => self.encode(f.minute),
            HOURS => self.encode_hour(f.hour),
            WEEKDAY => self.encode(f.weekday),
            DAY => self.encode(f.day),
            MONTH => self.encode(f.month),
            YEAR => self.encode(f.year),
            _ => self.encode(f.century),
        }
    }

    fn write_time(&mut self, index: u8, raw: u8) {
        let (mut f, phase) = self.now();
        let value = if index == HOURS {
            self.decode_hour(raw)
        } else {
            self.decode(raw)
        };
        match index {
            SECONDS => f.second = value,
            MINUTES => f.minute = value,
            HOURS => f.hour = value,
            WEEKDAY => f.weekday = value,
            DAY => f.day = value,
            MONTH => f.month = value,
            YEAR => f.year = value,
            _ => f.century = value,
        }
        match &mut self.stopped {
            Some(stopped) => stopped.0 = f,
            None => self.start_at(f, phase),
        }
    }

    fn read_status_a(&self) -> u8 {
        let updating = self.running() && self.now().1 >= NS_PER_S - UIP_HOLD_NS;
        self.reg(STATUS_A) | if updating { A_UIP } else { 0 }
    }

    /// Status C: the flags raised since its last read, which this read clears.
    fn read_status_c(&mut self) -> u8 {
        if !self.running() {
            return 0;
        }
        let now = self.guest_ns();
        let since = self.flags_since_ns;
        self.flags_since_ns = now;
        let mut flags = 0;
        if now.div_euclid(NS_PER_S) > since.div_euclid(NS_PER_S) {
            flags |= C_UF;
        }
        let rate = self.reg(STATUS_A) & A_RATE;
        if rate != 0 {
            // Periods of the 32.768 kHz base: rates 1 and 2 are 256 and 128 Hz as 8 and 9.
            let cycles: i128 = if rate <= 2 {
                1 << (rate + 6)
            } else {
                1 << (rate - 1)
            };
            let ticks = |ns: i128| (ns * 32_768).div_euclid(NS_PER_S).div_euclid(cycles);
            if ticks(now) > ticks(since) {
                flags |= C_PF;
            }
        }
        let b = self.reg(STATUS_B);
        if (flags & C_UF != 0 && b & B_UIE != 0) || (flags & C_PF != 0 && b & B_PIE != 0) {
            flags |= C_IRQF;
        }
        flags
    }

    fn read_register(&mut self) -> u8 {
        match self.index {
            SECONDS | MINUTES | HOURS | WEEKDAY | DAY | MONTH | YEAR | CENTURY | CENTURY_PS2 => {
                self.read_time(self.index)
            }
            STATUS_A => self.read_status_a(),
            STATUS_C => self.read_status_c(),
            STATUS_D => D_VALID,
            index => self.reg(index),
        }
    }

    fn write_register(&mut self, value: u8) {
        let was_running = self.running();
        match self.index {
            SECONDS | MINUTES | HOURS | WEEKDAY | DAY | MONTH | YEAR | CENTURY | CENTURY_PS2 => {
                self.write_time(self.index, value);
            }
            STATUS_A => {
                let was_reset = self.divider_reset();
                self.cmos[usize::from(STATUS_A)] = value & !A_UIP;
                let released = was_reset && !self.divider_reset();
                self.update_running(was_running, released);
            }
            STATUS_B => {
                // Setting SET ends update interrupts, as on the chip.
                let value = if value & B_SET != 0 {
                    value & !B_UIE
                } else {
                    value
                };
                self.cmos[usize::from(STATUS_B)] = value;
                self.update_running(was_running, false);
            }
            STATUS_C | STATUS_D => {}
            index => self.cmos[usize::from(index & 0x7f)] = value,
        }
    }
}

impl BusDevice for Rtc {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        // A wider access reaches the next port with each byte, as on the ISA bus.
        for (port, byte) in (offset..).zip(data.iter_mut()) {
            *byte = match port {
                1 => self.read_register(),
                _ => 0xff,
            };
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        for (port, &byte) in (offset..).zip(data) {
            match port {
                0 => self.index = byte & 0x7f,
                1 => self.write_register(byte),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, Ordering};

    /// 2024-02-29T13:45:30Z, a Thursday.
    const LEAP_DAY: i64 = 1_709_214_330;

    /// A clock the test moves, in nanoseconds.
    struct TestClock(Arc<AtomicI64>);

    impl TestClock {
        fn at(seconds: i64) -> (Self, Clock) {
            let ns = Arc::new(AtomicI64::new(seconds * 1_000_000_000));
            let reader = ns.clone();
            (
                TestClock(ns),
                Box::new(move || i128::from(reader.load(Ordering::SeqCst))),
            )
        }
        fn set_ns(&self, ns: i64) {
            self.0.store(ns, Ordering::SeqCst);
        }
        fn advance_ms(&self, ms: i64) {
            self.0.fetch_add(ms * 1_000_000, Ordering::SeqCst);
        }
    }

    fn rtc_at(seconds: i64, offset: i64) -> (TestClock, Rtc) {
        let (clock, source) = TestClock::at(seconds);
        (clock, Rtc::with_clock(offset, source))
    }

    fn read(rtc: &mut Rtc, index: u8) -> u8 {
        rtc.write(0, &[index]);
        let mut data = [0];
        rtc.read(1, &mut data);
        data[0]
    }

    fn write(rtc: &mut Rtc, index: u8, value: u8) {
        rtc.write(0, &[index]);
        rtc.write(1, &[value]);
    }

    /// sec, min, hour, weekday, day, month, year, century as the guest reads them.
    fn time(rtc: &mut Rtc) -> [u8; 8] {
        [SECONDS, MINUTES, HOURS, WEEKDAY, DAY, MONTH, YEAR, CENTURY].map(|r| read(rtc, r))
    }

    #[test]
    fn the_default_is_24_hour_bcd_with_valid_time() {
        let (_clock, mut rtc) = rtc_at(LEAP_DAY, 0);
        assert_eq!(
            time(&mut rtc),
            [0x30, 0x45, 0x13, 0x05, 0x29, 0x02, 0x24, 0x20]
        );
        assert_eq!(read(&mut rtc, STATUS_A), 0x26);
        assert_eq!(read(&mut rtc, STATUS_B), 0x02);
        assert_eq!(read(&mut rtc, STATUS_D), 0x80);
        assert_eq!(read(&mut rtc, CENTURY_PS2), 0x20);
    }

    #[test]
    fn status_b_selects_binary_and_12_hour_forms() {
        let (clock, mut rtc) = rtc_at(LEAP_DAY, 0);
        write(&mut rtc, STATUS_B, B_BINARY | B_24_HOUR);
        assert_eq!(time(&mut rtc), [30, 45, 13, 5, 29, 2, 24, 20]);
        write(&mut rtc, STATUS_B, B_BINARY);
        assert_eq!(read(&mut rtc, HOURS), 0x80 | 1, "1 PM, binary");
        write(&mut rtc, STATUS_B, 0);
        assert_eq!(read(&mut rtc, HOURS), 0x80 | 0x01, "1 PM, BCD");
        // Midnight is 12 AM, noon 12 PM, 11 PM is BCD 0x11 with the PM bit.
        for (seconds, hour) in [(946_684_800, 0x12), (946_684_800 + 12 * 3600, 0x92)] {
            clock.set_ns(seconds * 1_000_000_000);
            assert_eq!(read(&mut rtc, HOURS), hour);
        }
        clock.set_ns(946_684_799 * 1_000_000_000);
        assert_eq!(read(&mut rtc, HOURS), 0x91);
        assert_eq!(time(&mut rtc)[4..], [0x31, 0x12, 0x99, 0x19]);
    }

    #[test]
    fn the_configured_offset_moves_the_clock() {
        let (_clock, mut rtc) = rtc_at(LEAP_DAY, 3600);
        assert_eq!(read(&mut rtc, HOURS), 0x14);
        let (_clock, mut rtc) = rtc_at(LEAP_DAY, -14 * 3600);
        assert_eq!(read(&mut rtc, HOURS), 0x23);
        assert_eq!(read(&mut rtc, DAY), 0x28);
        // Absurd offsets are clamped, never overflow.
        for offset in [i64::MAX, i64::MIN] {
            let (_clock, mut rtc) = rtc_at(LEAP_DAY, offset);
            time(&mut rtc);
            read(&mut rtc, STATUS_C);
        }
    }

    #[test]
    fn a_guest_setting_the_clock_keeps_an_offset_from_the_host() {
        let (clock, mut rtc) = rtc_at(LEAP_DAY, 0);
        // Linux's mc146818_set_time: SET, divider reset, the registers, then both restored.
        write(&mut rtc, STATUS_B, B_24_HOUR | B_SET);
        write(&mut rtc, STATUS_A, A_DEFAULT | 0x70);
        for (reg, value) in [
            (YEAR, 0x31),
            (MONTH, 0x07),
            (DAY, 0x04),
            (HOURS, 0x09),
            (MINUTES, 0x08),
            (SECONDS, 0x07),
            (CENTURY, 0x20),
        ] {
            write(&mut rtc, reg, value);
        }
        // Stopped: the time registers hold what was written, and stay.
        clock.advance_ms(5000);
        assert_eq!(time(&mut rtc)[..3], [0x07, 0x08, 0x09]);
        assert_eq!(read(&mut rtc, STATUS_A) & A_UIP, 0);
        write(&mut rtc, STATUS_B, B_24_HOUR);
        write(&mut rtc, STATUS_A, A_DEFAULT);
        // Running from 2031-07-04T09:08:07, the first second ending half a second later.
        assert_eq!(
            time(&mut rtc),
            [0x07, 0x08, 0x09, 0x06, 0x04, 0x07, 0x31, 0x20]
        );
        clock.advance_ms(499);
        assert_eq!(read(&mut rtc, SECONDS), 0x07);
        clock.advance_ms(2);
        assert_eq!(read(&mut rtc, SECONDS), 0x08);
        clock.advance_ms(3600 * 1000);
        assert_eq!(time(&mut rtc)[..3], [0x08, 0x08, 0x10]);

        // With SET alone the clock keeps its place in the second.
        let (clock, mut rtc) = rtc_at(LEAP_DAY, 0);
        clock.advance_ms(300);
        write(&mut rtc, STATUS_B, B_24_HOUR | B_SET);
        write(&mut rtc, YEAR, 0x25);
        write(&mut rtc, STATUS_B, B_24_HOUR);
        assert_eq!(read(&mut rtc, YEAR), 0x25);
        clock.advance_ms(699);
        assert_eq!(read(&mut rtc, SECONDS), 0x30);
        clock.advance_ms(2);
        assert_eq!(read(&mut rtc, SECONDS), 0x31);

        // A write while the clock runs sets it at once (binary and 12-hour here).
        let (clock, mut rtc) = rtc_at(LEAP_DAY, 0);
        write(&mut rtc, STATUS_B, B_BINARY);
        write(&mut rtc, HOURS, 0x80 | 11); // 11 PM
        write(&mut rtc, MINUTES, 59);
        clock.advance_ms(60 * 1000);
        write(&mut rtc, STATUS_B, B_24_HOUR | B_BINARY);
        assert_eq!(
            time(&mut rtc)[..6],
            [30, 0, 0, 6, 1, 3],
            "2024-03-01T00:00:30"
        );
    }

    #[test]
    fn uip_is_set_only_in_the_last_244_microseconds_of_each_second() {
        let (clock, mut rtc) = rtc_at(LEAP_DAY, 0);
        let base = LEAP_DAY * 1_000_000_000;
        let uip = |rtc: &mut Rtc| read(rtc, STATUS_A) & A_UIP != 0;
        for (into_second_ns, set) in [
            (0, false),
            (500_000_000, false),
            (999_755_000, false),
            (999_756_000, true),
            (999_999_999, true),
        ] {
            clock.set_ns(base + into_second_ns);
            assert_eq!(uip(&mut rtc), set, "{into_second_ns} ns into the second");
        }
        // A guest polling every 10 µs sees UIP fall within a second, and the seconds change
        // only after it was set.
        clock.set_ns(base + 999_000_000);
        let before = read(&mut rtc, SECONDS);
        let mut polls = 0;
        while !uip(&mut rtc) {
            clock.0.fetch_add(10_000, Ordering::SeqCst);
            polls += 1;
            assert!(polls < 100_000);
        }
        let mut held = 0;
        while uip(&mut rtc) {
            assert_eq!(read(&mut rtc, SECONDS), before);
            clock.0.fetch_add(10_000, Ordering::SeqCst);
            held += 1;
            assert!(held < 100_000, "UIP never falls");
        }
        assert!((24..=25).contains(&held), "UIP held for {held} polls");
        assert_ne!(read(&mut rtc, SECONDS), before);
        // Stopped (SET), never updating.
        write(&mut rtc, STATUS_B, B_24_HOUR | B_SET);
        clock.set_ns(base + 999_999_000);
        assert!(!uip(&mut rtc));
    }

    #[test]
    fn reading_status_c_clears_its_flags() {
        let (clock, mut rtc) = rtc_at(LEAP_DAY, 0);
        write(&mut rtc, STATUS_A, 0x20); // no periodic rate
        assert_eq!(read(&mut rtc, STATUS_C), 0);
        clock.advance_ms(1000);
        assert_eq!(read(&mut rtc, STATUS_C), C_UF, "a second ended");
        assert_eq!(read(&mut rtc, STATUS_C), 0, "the read cleared it");
        write(&mut rtc, STATUS_B, B_24_HOUR | B_UIE);
        clock.advance_ms(1000);
        assert_eq!(read(&mut rtc, STATUS_C), C_IRQF | C_UF);
        assert_eq!(read(&mut rtc, STATUS_C), 0);
        // 1024 Hz: a millisecond ends a period.
        write(&mut rtc, STATUS_A, A_DEFAULT);
        read(&mut rtc, STATUS_C);
        clock.advance_ms(1);
        assert_eq!(read(&mut rtc, STATUS_C), C_PF);
        assert_eq!(read(&mut rtc, STATUS_C), 0);
        // Status C and D are read-only.
        write(&mut rtc, STATUS_C, 0xff);
        write(&mut rtc, STATUS_D, 0);
        assert_eq!(
            (read(&mut rtc, STATUS_C), read(&mut rtc, STATUS_D)),
            (0, 0x80)
        );
    }

    #[test]
    fn the_index_keeps_seven_bits_and_the_ram_keeps_what_is_written() {
        let (_clock, mut rtc) = rtc_at(LEAP_DAY, 0);
        // The NMI bit is ignored: 0x8f selects the shutdown status byte 0x0f.
        write(&mut rtc, 0x8f, 0x0a);
        assert_eq!(read(&mut rtc, 0x0f), 0x0a);
        write(&mut rtc, 0xff, 0x5a);
        assert_eq!(read(&mut rtc, 0x7f), 0x5a);
        assert_eq!(rtc.index, 0x7f);
        let mut port = [0];
        rtc.read(0, &mut port);
        assert_eq!(port, [0xff], "the index port is write-only");
        for index in (0x0e..0x80u8).filter(|&i| i != CENTURY && i != CENTURY_PS2) {
            write(&mut rtc, index, index ^ 0xa5);
        }
        for index in (0x0e..0x80u8).filter(|&i| i != CENTURY && i != CENTURY_PS2) {
            assert_eq!(read(&mut rtc, index), index ^ 0xa5, "{index:#x}");
        }
        // The alarm registers are storage too.
        for index in [0x01, 0x03, 0x05] {
            write(&mut rtc, index, 0xc0 | index);
            assert_eq!(read(&mut rtc, index), 0xc0 | index);
        }
        // A 16-bit access writes the index, then the data (out 0x70, ax).
        rtc.write(0, &[0x10, 0x77]);
        assert_eq!(read(&mut rtc, 0x10), 0x77);
        let mut both = [0u8; 2];
        rtc.read(0, &mut both);
        assert_eq!(both, [0xff, 0x77]);
    }

    #[test]
    fn garbage_from_the_guest_never_panics() {
        let (clock, mut rtc) = rtc_at(LEAP_DAY, 0);
        let mut state = 0x1234_5678u32;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let [a, b, c, d] = state.to_le_bytes();
            match a % 3 {
                0 => rtc.write(u64::from(b % 2), &[c, d]),
                1 => rtc.read(u64::from(b % 2), &mut [0, 0]),
                _ => clock.advance_ms(i64::from(c)),
            }
        }
    }

    #[test]
    fn dates_round_trip_through_the_calendar() {
        for seconds in [
            0,
            LEAP_DAY,
            946_684_799,
            951_782_400,   // 2000-02-29
            4_102_444_800, // 2100-01-01
            -1,
            253_402_300_799, // 9999-12-31T23:59:59
        ] {
            let fields = Fields::from_seconds(seconds);
            assert_eq!(fields.to_seconds(), seconds, "{fields:?}");
        }
        assert_eq!(days_from_civil(2024, 2, 29), LEAP_DAY / SECONDS_PER_DAY);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(
            Fields::from_seconds(-1).weekday,
            4,
            "1969-12-31 was a Wednesday"
        );
    }
}

//! How checks report their results: one `TEST <name> PASS|FAIL <detail>`
//! line each on the serial port. The VMM's tests and `vmm selftest` parse
//! these lines, so their shape is a contract.
//!
//! Shared with the virtio checks (`crate::virtio::run_checks`), which get a
//! `&mut dyn Reporter`.

use crate::serial;

/// Receives the result of one check.
pub trait Reporter {
    /// Records one check. `name` is a single word; `detail` is free text on
    /// one line (no newline), may be empty.
    fn result(&mut self, name: &str, pass: bool, detail: &str);
}

/// Prints results on the serial port and counts them.
#[derive(Default)]
pub struct SerialReporter {
    pub passed: u32,
    pub failed: u32,
}

impl Reporter for SerialReporter {
    fn result(&mut self, name: &str, pass: bool, detail: &str) {
        if pass {
            self.passed += 1;
        } else {
            self.failed += 1;
        }
        serial::write_str("TEST ");
        serial::write_str(name);
        serial::write_str(if pass { " PASS" } else { " FAIL" });
        if !detail.is_empty() {
            serial::write_byte(b' ');
            // A newline inside the detail would break the line format.
            for &b in detail.as_bytes() {
                serial::write_byte(if b == b'\n' || b == b'\r' { b' ' } else { b });
            }
        }
        serial::write_byte(b'\n');
    }
}

/// A small fixed-size text buffer for building `detail` strings without
/// `core::fmt` (thousands of instructions per line at ~1 µs each here).
/// Text that does not fit is cut off.
pub struct Detail {
    buf: [u8; 256],
    len: usize,
}

impl Default for Detail {
    fn default() -> Self {
        Self::new()
    }
}

impl Detail {
    pub const fn new() -> Self {
        Self {
            buf: [0; 256],
            len: 0,
        }
    }

    /// Appends text.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    /// Appends raw bytes (non-ASCII bytes become '?').
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Self {
        for &b in bytes {
            if self.len == self.buf.len() {
                break;
            }
            self.buf[self.len] = if b.is_ascii() { b } else { b'?' };
            self.len += 1;
        }
        self
    }

    /// Appends an unsigned number in decimal.
    pub fn dec(&mut self, mut value: u64) -> &mut Self {
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            digits[n] = b'0' + (value % 10) as u8;
            n += 1;
            value /= 10;
            if value == 0 || n == digits.len() {
                break;
            }
        }
        while n > 0 {
            n -= 1;
            self.bytes(&[digits[n]]);
        }
        self
    }

    /// Appends an unsigned number as 0x-prefixed hex.
    pub fn hex(&mut self, value: u64) -> &mut Self {
        self.str("0x");
        let mut started = false;
        for shift in (0..16).rev() {
            let nibble = ((value >> (shift * 4)) & 0xf) as u8;
            if nibble != 0 || started || shift == 0 {
                started = true;
                self.bytes(&[if nibble < 10 {
                    b'0' + nibble
                } else {
                    b'a' + nibble - 10
                }]);
            }
        }
        self
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The text (always ASCII, see `bytes`).
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(self.as_bytes()).unwrap_or("")
    }
}

//! Output on the 8250 UART at COM1, by polling the line status register.

use crate::io::{inb, outb};

const COM1: u16 = 0x3f8;
const LSR: u16 = COM1 + 5;
const LSR_THR_EMPTY: u8 = 0x20;
/// Polls before a byte is sent anyway; a UART that never reports "empty"
/// must not hang the guest.
const MAX_POLLS: u32 = 10_000;

/// Turns off UART interrupts: the guest only polls.
pub fn init() {
    outb(COM1 + 1, 0x00);
}

/// Sends one byte.
pub fn write_byte(byte: u8) {
    let mut polls = 0;
    while inb(LSR) & LSR_THR_EMPTY == 0 && polls < MAX_POLLS {
        polls += 1;
    }
    outb(COM1, byte);
}

/// Sends bytes as they are.
pub fn write(bytes: &[u8]) {
    for &b in bytes {
        write_byte(b);
    }
}

/// Sends a string.
pub fn write_str(s: &str) {
    write(s.as_bytes());
}

/// Sends an unsigned number in decimal.
pub fn write_dec(value: u64) {
    let mut buf = crate::report::Detail::new();
    buf.dec(value);
    write(buf.as_bytes());
}

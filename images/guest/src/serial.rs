//! Output on the 8250 UART at COM1, by polling the line status register; in the waiting exit
//! modes also input, echoed back (a console round trip: `virtctl console` types, the guest's
//! answer comes back on the same console).

use crate::io::{inb, outb};

const COM1: u16 = 0x3f8;
const IER: u16 = COM1 + 1;
const LSR: u16 = COM1 + 5;
const LSR_DATA_READY: u8 = 0x01;
const LSR_THR_EMPTY: u8 = 0x20;
/// IER: interrupt when received data is available.
const IER_RECEIVED_DATA: u8 = 0x01;
/// COM1's ISA interrupt line.
pub const COM1_PIN: u32 = 4;
/// At most this many bytes are echoed per call (a guest must not spin on a flood).
const MAX_ECHO: usize = 256;
/// Polls before a byte is sent anyway; a UART that never reports "empty"
/// must not hang the guest.
const MAX_POLLS: u32 = 10_000;

/// Turns off UART interrupts: the guest only polls.
pub fn init() {
    outb(IER, 0x00);
}

/// Interrupts on received data (the waiting modes sleep until something arrives).
pub fn enable_receive_interrupt() {
    outb(IER, IER_RECEIVED_DATA);
}

/// Sends back every byte received so far (at most [`MAX_ECHO`]); how many.
pub fn echo_input() -> usize {
    let mut echoed = 0;
    while echoed < MAX_ECHO && inb(LSR) & LSR_DATA_READY != 0 {
        let byte = inb(COM1);
        write_byte(byte);
        echoed += 1;
    }
    echoed
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

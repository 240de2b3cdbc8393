//! virtio-rng check: 64 bytes of entropy, not all the same.

use crate::report::{Detail, Reporter};

use super::Name;
use super::queue::{Buf, Queue, buffers, fill, read8};
use super::transport::Device;

const BYTES: u32 = 64;
const TIMEOUT_MS: u32 = 1000;

pub fn check(dev: &Device, index: usize, r: &mut dyn Reporter) {
    let name = Name::new("virtio-rng", index, "read");
    let mut queue = Queue::new(0);
    if let Err(e) = dev.initialize(0, &[&queue]) {
        r.result(name.as_str(), false, e);
        dev.reset();
        return;
    }
    let buf = buffers();
    fill(buf, BYTES as usize, 0);
    queue.add(&[Buf {
        addr: buf,
        len: BYTES,
        writable: true,
    }]);
    dev.notify(0);
    let used = queue.wait_used(TIMEOUT_MS);
    dev.reset();
    let mut d = Detail::new();
    let Some((_, len)) = used else {
        r.result(name.as_str(), false, "no completion");
        return;
    };
    let first = read8(buf);
    let mut distinct = false;
    let mut head: u64 = 0;
    for i in 0..BYTES.min(len) as u64 {
        let b = read8(buf + i);
        distinct |= b != first;
        if i < 8 {
            head = head << 8 | u64::from(b);
        }
    }
    d.str("bytes=").dec(u64::from(len)).str(" first=").hex(head);
    r.result(name.as_str(), len == BYTES && distinct, d.as_str());
}

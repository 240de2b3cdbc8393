//! Port 0xf4: a guest writes its exit code there to power the VM off with
//! that code (the test guest does; a Linux guest never touches it).

use std::sync::Arc;

use crate::bus::BusDevice;
use crate::lifecycle::{Control, VmExit};

pub(crate) struct ExitPort {
    control: Arc<Control>,
}

impl ExitPort {
    pub(crate) fn new(control: Arc<Control>) -> Self {
        ExitPort { control }
    }
}

impl BusDevice for ExitPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        // Wider writes are accepted too; the low byte is the code.
        if let Some(&code) = data.first() {
            self.control.finish(VmExit::PowerOff { code });
        }
    }
}

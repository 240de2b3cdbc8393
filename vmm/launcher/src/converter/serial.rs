//! The serial console: a unix socket in the VMI's private directory (which
//! the handler's console proxy dials) and its log file.

use super::{Context, ConvertError, Result};
use crate::paths::PathName;
use proto::domain::{
    Console, ConsoleTarget, Devices, Serial, SerialLog, SerialSource, SerialTarget,
};
use proto::kubevirt::VirtualMachineInstance;

pub(crate) fn configure(
    vmi: &VirtualMachineInstance,
    ctx: &Context,
    devices: &mut Devices,
) -> Result<()> {
    let d = &vmi.spec.domain.devices;
    if d.autoattach_serial_console == Some(false) {
        return Ok(());
    }
    let uid = vmi.metadata.uid.as_deref().unwrap_or_default();
    // The UID names the VMI's private directory, where the console lives.
    let uid =
        PathName::vmi_uid(uid).map_err(|e| ConvertError::new("metadata.uid", e.to_string()))?;
    let log = (d.log_serial_console != Some(false)).then(|| SerialLog {
        file: ctx.paths.serial_log(&uid).to_string_lossy().into_owned(),
        append: "on".into(),
    });
    devices.serials.push(Serial {
        r#type: "unix".into(),
        target: Some(SerialTarget { port: Some(0) }),
        source: Some(SerialSource {
            mode: "bind".into(),
            path: ctx.paths.serial_socket(&uid).to_string_lossy().into_owned(),
        }),
        alias: None,
        log,
    });
    devices.consoles.push(Console {
        r#type: "pty".into(),
        target: Some(ConsoleTarget {
            r#type: Some("serial".into()),
            port: Some(0),
        }),
        alias: None,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converter::test_support::vmi;

    #[test]
    fn console_socket_and_log_in_the_private_dir() {
        let mut d = Devices::default();
        configure(&vmi("domain: {}"), &Context::default(), &mut d).unwrap();
        let s = &d.serials[0];
        assert_eq!(
            s.source.as_ref().unwrap().path,
            "/var/run/kubevirt-private/11111111-2222-3333-4444-555555555555/virt-serial0"
        );
        assert!(s.log.as_ref().unwrap().file.ends_with("/virt-serial0-log"));
        assert_eq!(d.consoles.len(), 1);
    }

    #[test]
    fn console_can_be_turned_off() {
        let mut d = Devices::default();
        configure(
            &vmi("domain:\n  devices:\n    logSerialConsole: false"),
            &Context::default(),
            &mut d,
        )
        .unwrap();
        assert!(d.serials[0].log.is_none());
        let mut d = Devices::default();
        configure(
            &vmi("domain:\n  devices:\n    autoattachSerialConsole: false"),
            &Context::default(),
            &mut d,
        )
        .unwrap();
        assert!(d.serials.is_empty());
    }
}

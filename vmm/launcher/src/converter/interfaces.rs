//! `devices.interfaces[]` → domain interfaces (the launcher side of the masquerade and
//! bridge bindings, KubeVirt v1.9.0 `pkg/network/domainspec/generators.go`): an
//! `ethernet` interface on `tap0` with the pod interface's MTU and, unless the VMI sets
//! one, its MAC (for bridge, the dummy `eth0` that keeps the pod's original MAC).

use super::{Context, ConvertError, Result};
use proto::domain::{
    Alias, BootOrder, Devices, Interface, InterfaceTarget, LinkState, Mac, Model, Mtu, Rom,
};
use proto::kubevirt::VirtualMachineInstance;

use proto::contract::pod_network::{BRIDGE_MAC as RESERVED_MAC, PRIMARY_TAP as POD_TAP};

pub(crate) fn configure(
    vmi: &VirtualMachineInstance,
    ctx: &Context,
    devices: &mut Devices,
) -> Result<()> {
    let interfaces = &vmi.spec.domain.devices.interfaces;
    if interfaces.len() > 1 {
        return Err(ConvertError::new(
            "spec.domain.devices.interfaces",
            "only one interface (on the pod network) is supported",
        ));
    }
    for (i, iface) in interfaces.iter().enumerate() {
        let field = format!("spec.domain.devices.interfaces[{i}]");
        match iface.binding_name() {
            Some("masquerade" | "bridge") => {}
            Some(other) => {
                return Err(ConvertError::new(
                    format!("{field}.{other}"),
                    "only the masquerade and bridge bindings are supported",
                ));
            }
            None => {
                return Err(ConvertError::new(
                    field,
                    "needs a binding (bridge: {} or masquerade: {})",
                ));
            }
        }
        if let Some(attachment) = ctx.interface_attachment.get(&iface.name)
            && attachment != "tap"
        {
            return Err(ConvertError::new(
                format!("{field}.binding"),
                format!("domain attachment {attachment:?} is not supported"),
            ));
        }
        let network = vmi.spec.networks.iter().find(|n| n.name == iface.name);
        match network {
            Some(n) if n.pod.is_some() => {}
            Some(_) => {
                return Err(ConvertError::new(
                    format!("spec.networks[name={}]", iface.name),
                    "only the pod network is supported",
                ));
            }
            None => {
                return Err(ConvertError::new(
                    format!("{field}.name"),
                    format!("no network named {:?}", iface.name),
                ));
            }
        }
        let model = iface.model.as_deref().unwrap_or("virtio");
        if model != "virtio" {
            return Err(ConvertError::new(
                format!("{field}.model"),
                format!("model {model:?} is not supported: only virtio"),
            ));
        }
        let mac = match iface
            .mac_address
            .as_ref()
            .or(ctx.guest_macs.get(&iface.name))
        {
            Some(mac) => {
                if vmm::config::parse_mac(mac).is_none() {
                    return Err(ConvertError::new(
                        format!("{field}.macAddress"),
                        format!("{mac:?} is not a MAC address"),
                    ));
                }
                mac.to_ascii_lowercase()
            }
            None => ctx.pod_interface.mac.clone().ok_or_else(|| {
                ConvertError::new(
                    format!("{field}.macAddress"),
                    "not set, and the pod interface has no MAC to take",
                )
            })?,
        };
        if mac == RESERVED_MAC {
            return Err(ConvertError::new(
                format!("{field}.macAddress"),
                "02:00:00:00:00:00 is reserved for the pod bridge",
            ));
        }
        let target = if ctx.pod_interface.tap_exists {
            POD_TAP
        } else {
            proto::contract::pod_network::PRIMARY_POD_IFACE
        };
        devices.interfaces.push(Interface {
            r#type: "ethernet".into(),
            target: Some(InterfaceTarget {
                device: target.into(),
                managed: "no".into(),
            }),
            model: Some(Model {
                r#type: "virtio-non-transitional".into(),
            }),
            mac: Some(Mac { mac }),
            mtu: (ctx.pod_interface.mtu > 0).then(|| Mtu {
                size: ctx.pod_interface.mtu.to_string(),
            }),
            boot_order: iface.boot_order.map(|order| BootOrder { order }),
            link_state: (iface.state.as_deref() == Some("down")).then(|| LinkState {
                state: "down".into(),
            }),
            alias: Some(Alias::user(&iface.name)),
            rom: iface.boot_order.is_none().then(|| Rom {
                enabled: "no".into(),
            }),
            ..Default::default()
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converter::PodInterface;
    use crate::converter::test_support::vmi;

    fn ctx() -> Context {
        Context {
            pod_interface: PodInterface {
                mtu: 1450,
                mac: Some("0a:58:0a:f4:00:1b".into()),
                tap_exists: true,
            },
            ..Default::default()
        }
    }

    const MASQ: &str = "domain:\n  devices:\n    interfaces:\n    - name: default\n      masquerade: {}\nnetworks:\n- name: default\n  pod: {}";

    #[test]
    fn masquerade_on_tap0_with_pod_mac_and_mtu() {
        let mut d = Devices::default();
        configure(&vmi(MASQ), &ctx(), &mut d).unwrap();
        let i = &d.interfaces[0];
        assert_eq!(i.r#type, "ethernet");
        assert_eq!(i.target.as_ref().unwrap().device, "tap0");
        assert_eq!(i.target.as_ref().unwrap().managed, "no");
        assert_eq!(i.mac.as_ref().unwrap().mac, "0a:58:0a:f4:00:1b");
        assert_eq!(i.mtu.as_ref().unwrap().size, "1450");
        assert_eq!(i.model.as_ref().unwrap().r#type, "virtio-non-transitional");
        assert_eq!(i.alias, Some(Alias::user("default")));
        assert_eq!(i.rom.as_ref().unwrap().enabled, "no");
    }

    #[test]
    fn vmi_mac_wins_and_reserved_mac_is_refused() {
        let with_mac = MASQ.replace(
            "masquerade: {}",
            "masquerade: {}\n      macAddress: DE:AD:00:00:BE:AF",
        );
        let mut d = Devices::default();
        configure(&vmi(&with_mac), &ctx(), &mut d).unwrap();
        assert_eq!(
            d.interfaces[0].mac.as_ref().unwrap().mac,
            "de:ad:00:00:be:af"
        );
        let reserved = MASQ.replace(
            "masquerade: {}",
            "masquerade: {}\n      macAddress: 02:00:00:00:00:00",
        );
        let err = configure(&vmi(&reserved), &ctx(), &mut Devices::default()).unwrap_err();
        assert_eq!(err.field, "spec.domain.devices.interfaces[0].macAddress");
    }

    #[test]
    fn a_migrating_guest_keeps_its_mac_unless_the_vmi_names_one() {
        let mut arriving = ctx();
        arriving
            .guest_macs
            .insert("default".into(), "8E:F0:0D:9D:3E:86".into());
        let mut d = Devices::default();
        configure(&vmi(MASQ), &arriving, &mut d).unwrap();
        assert_eq!(
            d.interfaces[0].mac.as_ref().unwrap().mac,
            "8e:f0:0d:9d:3e:86"
        );
        let with_mac = MASQ.replace(
            "masquerade: {}",
            "masquerade: {}\n      macAddress: DE:AD:00:00:BE:AF",
        );
        let mut d = Devices::default();
        configure(&vmi(&with_mac), &arriving, &mut d).unwrap();
        assert_eq!(
            d.interfaces[0].mac.as_ref().unwrap().mac,
            "de:ad:00:00:be:af"
        );
        arriving
            .guest_macs
            .insert("default".into(), "not a mac".into());
        assert!(configure(&vmi(MASQ), &arriving, &mut Devices::default()).is_err());
    }

    #[test]
    fn bridge_is_the_same_tap_interface() {
        let mut masquerade = Devices::default();
        configure(&vmi(MASQ), &ctx(), &mut masquerade).unwrap();
        let mut bridge = Devices::default();
        configure(
            &vmi(&MASQ.replace("masquerade", "bridge")),
            &ctx(),
            &mut bridge,
        )
        .unwrap();
        assert_eq!(bridge.interfaces, masquerade.interfaces);
        let i = &bridge.interfaces[0];
        assert_eq!(i.target.as_ref().unwrap().device, "tap0");
        assert_eq!(
            i.mac.as_ref().unwrap().mac,
            "0a:58:0a:f4:00:1b",
            "the dummy eth0's MAC"
        );
    }

    #[test]
    fn other_bindings_and_networks_are_refused() {
        let passt = MASQ.replace("masquerade", "passtBinding");
        let err = configure(&vmi(&passt), &ctx(), &mut Devices::default()).unwrap_err();
        assert_eq!(err.field, "spec.domain.devices.interfaces[0].passtBinding");
        let multus = MASQ.replace("pod: {}", "multus:\n    networkName: x");
        let err = configure(&vmi(&multus), &ctx(), &mut Devices::default()).unwrap_err();
        assert!(err.field.starts_with("spec.networks"));
        let e1000 = MASQ.replace("masquerade: {}", "masquerade: {}\n      model: e1000");
        let err = configure(&vmi(&e1000), &ctx(), &mut Devices::default()).unwrap_err();
        assert_eq!(err.field, "spec.domain.devices.interfaces[0].model");
    }
}

//! Domain name, UUID, type and KubeVirt's metadata (VMI UID, grace period).

use super::Result;
use proto::domain::{DomainSpec, GracePeriodMetadata};
use proto::kubevirt::VirtualMachineInstance;

pub(crate) fn configure(vmi: &VirtualMachineInstance, spec: &mut DomainSpec) -> Result<()> {
    let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
    let name = vmi.metadata.name.as_deref().unwrap_or_default();
    spec.r#type = "kvm".into();
    spec.name = proto::domain::Domain::domain_name(namespace, name);
    // The SMBIOS UUID: the firmware UUID the API defaults, else one derived
    // from the VMI UID so that it is stable across launcher restarts.
    spec.uuid = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.uuid.clone())
        .unwrap_or_else(|| {
            let uid = vmi.metadata.uid.as_deref().unwrap_or(name);
            uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, uid.as_bytes()).to_string()
        });
    spec.metadata.kubevirt.uid = vmi.metadata.uid.clone().unwrap_or_default();
    // Published from the start: the handler reads it to decide between a
    // graceful shutdown and an immediate kill.
    spec.metadata.kubevirt.grace_period = Some(GracePeriodMetadata {
        deletion_grace_period_seconds: vmi.grace_period_seconds(),
        deletion_timestamp: None,
        marked_for_graceful_shutdown: None,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converter::test_support::vmi;

    #[test]
    fn names_and_grace_period() {
        let v = vmi(
            "domain:\n  firmware:\n    uuid: 5f0b6a0a-2a8c-4d7e-8a1e-7c3d9f7b2e10\nterminationGracePeriodSeconds: 7",
        );
        let mut spec = DomainSpec::default();
        configure(&v, &mut spec).unwrap();
        assert_eq!(spec.name, "ns1_testvmi");
        assert_eq!(spec.r#type, "kvm");
        assert_eq!(spec.uuid, "5f0b6a0a-2a8c-4d7e-8a1e-7c3d9f7b2e10");
        assert_eq!(
            spec.metadata.kubevirt.uid,
            "11111111-2222-3333-4444-555555555555"
        );
        let gp = spec.metadata.kubevirt.grace_period.unwrap();
        assert_eq!(gp.deletion_grace_period_seconds, 7);
        assert!(gp.deletion_timestamp.is_none());
    }

    #[test]
    fn default_grace_period_and_stable_uuid() {
        let v = vmi("domain: {}");
        let mut a = DomainSpec::default();
        let mut b = DomainSpec::default();
        configure(&v, &mut a).unwrap();
        configure(&v, &mut b).unwrap();
        assert_eq!(
            a.metadata
                .kubevirt
                .grace_period
                .unwrap()
                .deletion_grace_period_seconds,
            30
        );
        assert_eq!(a.uuid, b.uuid);
        assert!(uuid::Uuid::parse_str(&a.uuid).is_ok());
    }
}

//! `spec.domain.firmware.kernelBoot`: the one way to read it from a VMI.

use crate::kubevirt::{KernelBoot, KernelBootContainer, VirtualMachineInstance};

/// The dotted path of the field, for messages that name it.
pub const FIELD: &str = "spec.domain.firmware.kernelBoot";

/// `spec.domain.firmware.kernelBoot`, if the VMI has one.
pub fn kernel_boot(vmi: &VirtualMachineInstance) -> Option<&KernelBoot> {
    vmi.spec.domain.firmware.as_ref()?.kernel_boot.as_ref()
}

/// `spec.domain.firmware.kernelBoot.container`, if the VMI has one.
pub fn container(vmi: &VirtualMachineInstance) -> Option<&KernelBootContainer> {
    kernel_boot(vmi)?.container.as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_container_when_present() {
        let with: VirtualMachineInstance = serde_json::from_str(
            r#"{"metadata":{},"spec":{"domain":{"devices":{},"firmware":{"kernelBoot":
                {"kernelArgs":"console=ttyS0","container":{"image":"k","kernelPath":"/vmlinuz"}}}}}}"#,
        )
        .unwrap();
        assert_eq!(container(&with).unwrap().image, "k");
        assert_eq!(
            kernel_boot(&with).unwrap().kernel_args.as_deref(),
            Some("console=ttyS0")
        );
        let without: VirtualMachineInstance =
            serde_json::from_str(r#"{"metadata":{},"spec":{"domain":{"devices":{}}}}"#).unwrap();
        assert!(kernel_boot(&without).is_none() && container(&without).is_none());
    }
}

//! Generated gRPC code for the handler <-> launcher contract and the kubelet's
//! device-plugin API.

/// `kubevirt.cmd.v1`: commands the handler sends to a launcher.
pub mod cmd {
    pub mod v1 {
        tonic::include_proto!("kubevirt.cmd.v1");

        /// The version of the cmd protocol this package implements
        /// (`cmdv1.CmdVersion` in KubeVirt).
        pub const CMD_VERSION: u32 = 1;
    }
    /// `kubevirt.cmd.info`: version negotiation, served by the launcher.
    pub mod info {
        tonic::include_proto!("kubevirt.cmd.info");
    }
}

/// `kubevirt.notify.v1`: events a launcher sends to the handler.
pub mod notify {
    pub mod v1 {
        tonic::include_proto!("kubevirt.notify.v1");

        /// The version of the notify protocol (`NotifyVersion` in KubeVirt).
        pub const NOTIFY_VERSION: u32 = 1;
    }
    /// `kubevirt.notify.info`: version negotiation, served by the handler.
    pub mod info {
        tonic::include_proto!("kubevirt.notify.info");
    }
}

/// The kubelet's device-plugin API (`k8s.io/kubelet/pkg/apis/deviceplugin`), which the
/// handler serves to provide `devices.kubevirt.io/*` resources.
pub mod deviceplugin {
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");

        /// `RegisterRequest.version` of this API (`pluginapi.Version`).
        pub const VERSION: &str = "v1beta1";
        /// `Device.health` of a usable device (`pluginapi.Healthy`).
        pub const HEALTHY: &str = "Healthy";
        /// `Device.health` of an unusable device (`pluginapi.Unhealthy`).
        pub const UNHEALTHY: &str = "Unhealthy";
        /// The kubelet's directory of plugin sockets (`pluginapi.DevicePluginPath`).
        pub const DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins";
        /// The kubelet's registration socket in that directory (`pluginapi.KubeletSocket`).
        pub const KUBELET_SOCKET: &str = "kubelet.sock";
    }
}

/// The compiled descriptors of every proto above (a `FileDescriptorSet`).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/kubevirt_descriptor.bin"));

/// Picks the highest version both sides speak, as KubeVirt's
/// `GetHighestCompatibleVersion` does: the server's list is searched from the
/// highest down for a version the client also lists.
pub fn highest_compatible_version(server: &[u32], client: &[u32]) -> Option<u32> {
    let mut sorted = server.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    sorted.into_iter().find(|v| client.contains(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_picks_highest_common_version() {
        assert_eq!(highest_compatible_version(&[1], &[1]), Some(1));
        assert_eq!(highest_compatible_version(&[1, 3, 2], &[1, 2]), Some(2));
        assert_eq!(highest_compatible_version(&[2], &[1]), None);
        assert_eq!(highest_compatible_version(&[], &[1]), None);
    }
}

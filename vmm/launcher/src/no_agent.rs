//! What KubeVirt's launcher answers for a guest whose agent is not
//! connected. This launcher's guests have no agent channel; the handler
//! and virt-probe see the same answers as from a stock launcher whose
//! guest runs no agent.

/// `GetGuestInfo`: Go's JSON of an empty `VirtualMachineInstanceGuestAgentInfo`
/// (`LibvirtDomainManager.GetGuestInfo`): structs are never omitted, and the
/// time zone is formatted from an empty zone and offset 0.
pub(crate) const GUEST_INFO: &str = r#"{"os":{},"timezone":", 0","fsInfo":{"disks":null}}"#;

/// `GetUsers`, `GetFilesystems`: the lists start empty, not nil.
pub(crate) const EMPTY_LIST: &str = "[]";

/// libvirt's error for an agent command when the agent is not connected
/// (`VIR_ERR_AGENT_UNRESPONSIVE`, from the QEMU driver).
const CODE: u32 = 86;
const DOMAIN: u32 = 10;
const MESSAGE: &str = "Guest agent is not responding: QEMU guest agent is not connected";

/// The libvirt error as Go's `libvirt.Error.Error()` prints it (what an
/// RPC that returns the error carries as its gRPC message).
pub(crate) fn libvirt_error() -> String {
    format!("virError(Code={CODE}, Domain={DOMAIN}, Message='{MESSAGE}')")
}

/// The libvirt error as the cmd server's `getErrorMessage` formats it for
/// a `Response.message`.
pub(crate) fn formatted_error() -> String {
    format!("LibvirtError(Code={CODE}, Domain={DOMAIN}, Message='{MESSAGE}')")
}

/// `GetVMStats`' answer for one agent command (`GetAgentData` wraps the
/// libvirt error).
pub(crate) fn agent_data_error(command: &str) -> String {
    format!(
        "failed to get agent data for {command}: {}",
        libvirt_error()
    )
}

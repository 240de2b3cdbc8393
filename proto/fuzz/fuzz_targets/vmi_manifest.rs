//! VMI JSON/YAML from the wire (SyncVirtualMachine, STANDALONE_VMI, manifests):
//! parsing must never panic, and whatever parses must serialize and parse again.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(vmi) = proto::kubevirt::parse_vmi(text) {
        let json = serde_json::to_string(&vmi).expect("a parsed VMI serializes");
        proto::kubevirt::parse_vmi(&json).expect("a serialized VMI parses again");
    }
    let _ = proto::kubevirt::parse_vm(text);
});

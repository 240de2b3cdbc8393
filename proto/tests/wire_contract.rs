//! The protos must stay wire-identical to KubeVirt v1.9.0 and the kubelet.
//!
//! `golden/wire-contract.txt` is the canonical listing (see `proto::wire`) of
//! KubeVirt v1.9.0's own `pkg/handler-launcher-com/**/*.proto` and of Kubernetes
//! v1.36.3's `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto`, each produced
//! with `protoc --descriptor_set_out` on the upstream files and `proto-wire-listing`,
//! the two listings merged line by line (`LC_ALL=C sort -m`).
//! Any change of a package, service, RPC, message, field name, number, label
//! or type fails this test.

use proto::grpc::FILE_DESCRIPTOR_SET;

const GOLDEN: &str = include_str!("golden/wire-contract.txt");

#[test]
fn protos_match_kubevirt_v1_9_0_field_for_field() {
    let ours = proto::wire::listing(FILE_DESCRIPTOR_SET).expect("our descriptor set decodes");
    if ours != GOLDEN {
        let missing: Vec<_> = GOLDEN.lines().filter(|l| !ours.contains(l)).collect();
        let added: Vec<_> = ours.lines().filter(|l| !GOLDEN.contains(l)).collect();
        panic!(
            "wire contract changed.\nmissing from ours: {missing:#?}\nnot in KubeVirt v1.9.0: {added:#?}"
        );
    }
}

#[test]
fn cmd_service_has_the_36_rpcs_of_v1_9_0() {
    let rpcs = GOLDEN
        .lines()
        .filter(|l| l.starts_with("rpc kubevirt.cmd.v1.Cmd/"))
        .count();
    assert_eq!(rpcs, 36);
}

#[test]
fn golden_pins_the_numbers_the_handler_depends_on() {
    for line in [
        "field kubevirt.cmd.v1.VMI.vmiJson = 1 singular bytes json=vmiJson",
        "field kubevirt.cmd.v1.Response.success = 1 singular bool json=success",
        "field kubevirt.cmd.v1.DomainResponse.domain = 2 singular string json=domain",
        "field kubevirt.notify.v1.DomainEventRequest.eventType = 3 singular string json=eventType",
        "rpc kubevirt.notify.v1.Notify/HandleK8sEvent(.kubevirt.notify.v1.K8sEventRequest) returns (.kubevirt.notify.v1.Response)",
        "rpc kubevirt.cmd.info.CmdInfo/Info(.kubevirt.cmd.info.CmdInfoRequest) returns (.kubevirt.cmd.info.CmdInfoResponse)",
    ] {
        assert!(GOLDEN.contains(line), "golden lacks {line}");
    }
}

#[test]
fn golden_pins_the_device_plugin_api_the_kubelet_calls() {
    for line in [
        "rpc v1beta1.Registration/Register(.v1beta1.RegisterRequest) returns (.v1beta1.Empty)",
        "rpc v1beta1.DevicePlugin/ListAndWatch(.v1beta1.Empty) returns (stream .v1beta1.ListAndWatchResponse)",
        "rpc v1beta1.DevicePlugin/Allocate(.v1beta1.AllocateRequest) returns (.v1beta1.AllocateResponse)",
        "field v1beta1.RegisterRequest.resource_name = 3 singular string json=resourceName",
        "field v1beta1.Device.ID = 1 singular string json=ID",
        "field v1beta1.ContainerAllocateResponse.devices = 3 repeated .v1beta1.DeviceSpec json=devices",
        "field v1beta1.DeviceSpec.permissions = 3 singular string json=permissions",
    ] {
        assert!(GOLDEN.contains(line), "golden lacks {line}");
    }
    let rpcs = GOLDEN
        .lines()
        .filter(|l| l.starts_with("rpc v1beta1.DevicePlugin/"))
        .count();
    assert_eq!(rpcs, 5);
}

#[test]
fn a_changed_field_number_is_detected() {
    // Guard against a listing that ignores numbers: re-encode our descriptor
    // set with one number changed and check the listing differs.
    use prost::Message;
    let mut set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).unwrap();
    let cmd = set
        .file
        .iter_mut()
        .find(|f| f.package() == "kubevirt.cmd.v1")
        .unwrap();
    let vmi = cmd
        .message_type
        .iter_mut()
        .find(|m| m.name() == "VMI")
        .unwrap();
    vmi.field[0].number = Some(2);
    let changed = proto::wire::listing(&set.encode_to_vec()).unwrap();
    assert_ne!(changed, GOLDEN);
    assert!(changed.contains("field kubevirt.cmd.v1.VMI.vmiJson = 2 singular bytes"));
}

#[test]
fn generated_messages_use_the_contract_numbers_on_the_wire() {
    use prost::Message;
    use proto::grpc::cmd::v1::{Response, Vmi, VmiRequest};
    let request = VmiRequest {
        vmi: Some(Vmi {
            vmi_json: b"{}".to_vec(),
        }),
        options: None,
    };
    // field 1, wire type 2 (0x0a), length 4: nested field 1 (0x0a), length 2, "{}".
    assert_eq!(request.encode_to_vec(), vec![0x0a, 4, 0x0a, 2, b'{', b'}']);
    let ok = Response {
        success: true,
        message: String::new(),
    };
    assert_eq!(ok.encode_to_vec(), vec![0x08, 1]);
    // A default reply decodes as success=false: the handler treats it as an error.
    assert!(!Response::decode(&[][..]).unwrap().success);
}

//! A canonical, line-per-fact listing of compiled protos.
//!
//! One line per package/service/RPC/message/field with the field's number,
//! label and type. Two descriptor sets describe the same wire contract exactly
//! when their listings are equal, whatever the comments and ordering of the
//! `.proto` sources. `tests/wire_contract.rs` compares ours with a golden
//! listing taken from KubeVirt v1.9.0's protos.

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

/// Renders the listing of an encoded `FileDescriptorSet`.
pub fn listing(encoded_set: &[u8]) -> Result<String, prost::DecodeError> {
    let set = FileDescriptorSet::decode(encoded_set)?;
    let mut lines = Vec::new();
    for file in &set.file {
        let package = file.package();
        lines.push(format!("package {package} syntax={}", file.syntax()));
        for service in &file.service {
            lines.push(format!("service {package}.{}", service.name()));
            for m in &service.method {
                lines.push(format!(
                    "rpc {package}.{}/{}({}{}) returns ({}{})",
                    service.name(),
                    m.name(),
                    if m.client_streaming() { "stream " } else { "" },
                    m.input_type(),
                    if m.server_streaming() { "stream " } else { "" },
                    m.output_type(),
                ));
            }
        }
        for message in &file.message_type {
            message_lines(
                &format!("{package}.{}", message.name()),
                message,
                &mut lines,
            );
        }
    }
    lines.sort();
    Ok(lines.join("\n") + "\n")
}

fn message_lines(path: &str, message: &DescriptorProto, lines: &mut Vec<String>) {
    lines.push(format!("message {path}"));
    for f in &message.field {
        let ty = match f.r#type() {
            Type::Message | Type::Enum => f.type_name().to_string(),
            other => format!("{other:?}").to_lowercase(),
        };
        let label = match f.label() {
            Label::Repeated => "repeated",
            Label::Required => "required",
            Label::Optional if f.proto3_optional() => "optional",
            Label::Optional => "singular",
        };
        lines.push(format!(
            "field {path}.{} = {} {label} {ty} json={}",
            f.name(),
            f.number(),
            f.json_name()
        ));
    }
    for nested in &message.nested_type {
        message_lines(&format!("{path}.{}", nested.name()), nested, lines);
    }
}

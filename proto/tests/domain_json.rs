//! The domain JSON keeps KubeVirt's exact keys and casing.

use proto::domain::*;
use serde_json::{Value, json};

fn testdata(name: &str) -> String {
    let path = format!("{}/tests/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn realistic_running_domain_round_trips_exactly() {
    let text = testdata("domain-running.json");
    let domain = Domain::from_json(&text).unwrap();
    assert_eq!(domain.status.status, LifeCycle::Running);
    assert_eq!(domain.status.reason, StateChangeReason::Unknown);
    assert_eq!(domain.key(), "default/vmi-masquerade");
    let spec = &domain.spec;
    assert_eq!(spec.metadata.kubevirt.uid, domain.object_meta.uid);
    let devices = spec.devices.as_ref().unwrap();
    assert_eq!(
        devices.interfaces[0].alias.as_ref().unwrap().name,
        "testmasquerade"
    );
    assert_eq!(
        devices.interfaces[0].mac.as_ref().unwrap().mac,
        "0a:58:0a:f4:00:2c"
    );
    assert_eq!(devices.disks[0].target.device, "vda");
    assert!(spec.features.as_ref().unwrap().acpi.is_some());
    // Everything is typed: no key fell into an `extra` map.
    assert!(domain.extra.is_empty() && spec.extra.is_empty() && devices.extra.is_empty());

    let back: Value = serde_json::from_str(&domain.to_json()).unwrap();
    let original: Value = serde_json::from_str(&text).unwrap();
    pretty_assertions::assert_eq!(back, original);
}

#[test]
fn new_domain_uses_go_field_names() {
    let mut domain = Domain::new("default", "vmi-a", "uid-1");
    domain.spec.name = Domain::domain_name("default", "vmi-a");
    domain.spec.metadata.kubevirt.grace_period = Some(GracePeriodMetadata {
        deletion_grace_period_seconds: 30,
        ..Default::default()
    });
    domain.status.status = LifeCycle::Paused;
    domain.status.reason = StateChangeReason::User;
    let v: Value = serde_json::from_str(&domain.to_json()).unwrap();
    assert_eq!(
        v,
        json!({
            "kind": "Domain", "apiVersion": "1.2.2",
            "ObjectMeta": {"name": "vmi-a", "namespace": "default", "uid": "uid-1", "creationTimestamp": null},
            "Spec": {
                "Name": "default_vmi-a",
                "Metadata": {"KubeVirt": {"UID": "uid-1", "GracePeriod": {
                    "DeletionGracePeriodSeconds": 30, "DeletionTimestamp": null, "MarkedForGracefulShutdown": null}}}
            },
            "Status": {"Status": "Paused", "Reason": "User", "Interfaces": null, "OSInfo": {},
                       "FSFreezeStatus": {"Status": ""}, "GuestPanicInfo": null, "PanicCount": 0}
        })
    );
}

#[test]
fn gone_event_marks_deletion() {
    let now = proto::kubevirt::Time("2026-08-22T10:00:00Z".parse().unwrap());
    let gone = Domain::gone("default", "vmi-a", "uid-1", now);
    assert!(gone.is_gone());
    let v: Value = serde_json::from_str(&gone.to_json()).unwrap();
    assert_eq!(
        v["ObjectMeta"]["deletionTimestamp"],
        json!("2026-08-22T10:00:00Z")
    );
    assert_eq!(v["Status"]["Status"], json!("NoState"));
    assert_eq!(v["Status"]["Reason"], json!("NonExistent"));
    assert_eq!(v["Spec"]["Metadata"]["KubeVirt"]["UID"], json!("uid-1"));
}

#[test]
fn every_state_and_reason_string_round_trips() {
    for s in [
        "NoState",
        "Running",
        "Blocked",
        "Paused",
        "ShuttingDown",
        "Shutoff",
        "Crashed",
        "PMSuspended",
        "Unknown",
        "",
    ] {
        let parsed: LifeCycle = serde_json::from_value(json!(s)).unwrap();
        assert_eq!(serde_json::to_value(parsed).unwrap(), json!(s));
    }
    for r in [
        "Unknown",
        "User",
        "Shutdown",
        "Destroyed",
        "Migrated",
        "Crashed",
        "Panicked",
        "Saved",
        "Failed",
        "FromSnapshot",
        "NonExistent",
        "Migration",
        "Save",
        "Dump",
        "IOError",
        "Watchdog",
        "ShuttingDown",
        "Snapshot",
        "StartingUp",
        "Postcopy",
        "PostcopyFailed",
        "",
    ] {
        let parsed: StateChangeReason = serde_json::from_value(json!(r)).unwrap();
        assert_eq!(serde_json::to_value(parsed).unwrap(), json!(r));
    }
}

#[test]
fn unknown_domain_keys_are_kept() {
    let text = r#"{"kind":"Domain","ObjectMeta":{"name":"a","namespace":"b"},
        "Spec":{"Name":"b_a","Clock":{"Offset":"utc"},"Devices":{"Video":[{"Model":{"Type":"vga"}}]}},
        "Status":{"Status":"Running","Reason":"Unknown","Future":1}}"#;
    let d = Domain::from_json(text).unwrap();
    let v: Value = serde_json::from_str(&d.to_json()).unwrap();
    assert_eq!(v["Spec"]["Clock"], json!({"Offset": "utc"}));
    assert_eq!(
        v["Spec"]["Devices"]["Video"][0]["Model"]["Type"],
        json!("vga")
    );
    assert_eq!(v["Status"]["Future"], json!(1));
}

/// Found by the `domain_json` fuzz target: an unknown number beyond u64
/// (kept as a float) drifted by one unit in the last place on every
/// read-write cycle until serde_json parsed floats exactly
/// (`float_roundtrip`).
#[test]
fn unknown_numbers_survive_repeated_round_trips() {
    let text = r#"{"uSatus1":111111111156246616058,"f":0.1,"g":1e-300,"h":18446744073709551615}"#;
    let first = Domain::from_json(text).unwrap().to_json();
    let second = Domain::from_json(&first).unwrap().to_json();
    assert_eq!(first, second);
    let v: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(v["uSatus1"].as_f64(), Some(111111111156246616058.0));
    assert_eq!(v["h"].as_u64(), Some(u64::MAX));
}

#[test]
fn bad_domain_json_is_an_error() {
    assert!(Domain::from_json("").is_err());
    assert!(Domain::from_json(r#"{"Status":{"Status":"Exploded"}}"#).is_err());
    assert!(Domain::from_json(r#"{"Spec":{"Memory":{"Value":-1,"Unit":"b"}}}"#).is_err());
}

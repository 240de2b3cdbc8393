//! Cloud-init disks: KubeVirt's data rules, and images read back by real ISO readers
//! (`isoinfo` from genisoimage, `xorriso`, `bsdtar` from libarchive-tools).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use int_cast::u64_to_usize;
use launcher::disks::cloudinit::{
    CloudInitData, CloudInitError, DataSource, MAX_INPUT_BYTES, config_drive_data, iso_path,
    nocloud_data, prepare_cloud_init_disk, write_config_drive_iso, write_nocloud_iso,
};
use launcher::paths::PathName;
use proto::kubevirt::{CloudInitSource, VirtualMachineInstance};
use serde_json::json;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cloudinit");
const UUID: &str = "5d307ca9-b3ef-428c-8861-06e72d69f223";

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(FIXTURES).join(name);
    fs::read(&path).unwrap_or_else(|e| panic!("reading fixture {}: {e}", path.display()))
}

/// The reader must be installed: a missing one fails the test (scripts/setup.sh installs them).
/// Looks in `PATH` and the sbin directories (`blkid` lives there and a user's PATH may lack them).
fn tool(name: &str, package: &str) -> &'static str {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/sbin"].map(PathBuf::from));
    let found = dirs
        .iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed: `apt-get install {package}` (scripts/setup.sh does it)"
            )
        });
    // Leaked: a few short strings per test, and call sites stay simple.
    Box::leak(found.to_string_lossy().into_owned().into_boxed_str())
}

/// Probes the filesystem type and label the way the guest's cloud-init finds its disk.
fn blkid_probe(iso: &Path) -> String {
    run_text(
        tool("blkid", "util-linux"),
        &["-p", "-o", "export", path_str(iso)],
    )
}

fn isoinfo() -> &'static str {
    tool("isoinfo", "genisoimage")
}

fn run(program: &str, args: &[&str]) -> Vec<u8> {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

fn run_text(program: &str, args: &[&str]) -> String {
    String::from_utf8(run(program, args)).expect("tool output is UTF-8")
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

/// Every regular file under `dir`, by path relative to it.
fn files_under(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in fs::read_dir(dir).expect("listing extracted tree") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                out.insert(
                    rel.to_string_lossy().into_owned(),
                    fs::read(&path).expect("reading extracted file"),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn extract_with_xorriso(iso: &Path, dest: &Path) -> BTreeMap<String, Vec<u8>> {
    let xorriso = tool("xorriso", "xorriso");
    run(
        xorriso,
        &[
            "-indev",
            path_str(iso),
            "-osirrox",
            "on",
            "-extract",
            "/",
            path_str(dest),
        ],
    );
    files_under(dest)
}

fn extract_with_bsdtar(iso: &Path, dest: &Path) -> BTreeMap<String, Vec<u8>> {
    let bsdtar = tool("bsdtar", "libarchive-tools");
    fs::create_dir_all(dest).expect("creating extraction dir");
    run(bsdtar, &["-xf", path_str(iso), "-C", path_str(dest)]);
    files_under(dest)
}

fn expected_files(pairs: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(name, data)| (name.to_string(), data.to_vec()))
        .collect()
}

fn vmi(value: serde_json::Value) -> VirtualMachineInstance {
    serde_json::from_value(value).expect("test VMI deserialises")
}

fn base_vmi() -> serde_json::Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "testvmi", "namespace": "default"},
        "spec": {
            "domain": {"devices": {}, "firmware": {"uuid": UUID}},
            "volumes": [{"name": "cloudinitdisk", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}]
        }
    })
}

fn source(value: serde_json::Value) -> CloudInitSource {
    serde_json::from_value(value).expect("test CloudInitSource deserialises")
}

fn sample_data(with_network: bool) -> CloudInitData {
    CloudInitData {
        user_data: fixture("user-data.yaml"),
        meta_data: format!(r#"{{"instance-id":"{UUID}","local-hostname":"testvmi"}}"#).into_bytes(),
        network_config: with_network.then(|| fixture("network-config.yaml")),
    }
}

// ---------------------------------------------------------------------------------------------
// NoCloud image, read back

#[test]
fn nocloud_iso_has_cidata_label_joliet_and_rock_ridge() {
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("noCloud.iso");
    write_nocloud_iso(&sample_data(true), &iso).unwrap();

    let info = run_text(isoinfo(), &["-d", "-i", path_str(&iso)]);
    assert!(info.contains("Volume id: cidata\n"), "{info}");
    assert!(info.contains("Joliet with UCS level 3 found"), "{info}");
    assert!(
        info.contains("Rock Ridge signatures version 1 found"),
        "{info}"
    );
    // Padded to whole MiB like `xorrisofs -partition_cyl_align on`, and the descriptor says so.
    assert!(info.contains("Volume size is: 512\n"), "{info}");
    assert_eq!(fs::metadata(&iso).unwrap().len(), 1 << 20);

    let probe = blkid_probe(&iso);
    assert!(probe.contains("\nLABEL=cidata\n"), "{probe}");
    assert!(probe.contains("\nTYPE=iso9660\n"), "{probe}");
}

#[test]
fn nocloud_iso_files_read_back_with_isoinfo_rock_ridge_and_joliet() {
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("noCloud.iso");
    let data = sample_data(true);
    write_nocloud_iso(&data, &iso).unwrap();

    let files: [(&str, &[u8]); 3] = [
        ("/user-data", &data.user_data),
        ("/meta-data", &data.meta_data),
        ("/network-config", data.network_config.as_deref().unwrap()),
    ];
    for extension in ["-R", "-J"] {
        for (name, expected) in files {
            let got = run(isoinfo(), &["-i", path_str(&iso), extension, "-x", name]);
            assert_eq!(got, expected, "{name} read with isoinfo {extension}");
        }
    }

    let listing = run_text(isoinfo(), &["-i", path_str(&iso), "-R", "-l"]);
    let names: Vec<&str> = listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    assert_eq!(
        names,
        ["meta-data", "network-config", "user-data"],
        "{listing}"
    );
}

#[test]
fn nocloud_iso_extracts_byte_exact_with_xorriso() {
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("noCloud.iso");
    let data = sample_data(true);
    write_nocloud_iso(&data, &iso).unwrap();

    let got = extract_with_xorriso(&iso, &dir.path().join("out"));
    assert_eq!(
        got,
        expected_files(&[
            ("meta-data", &data.meta_data),
            ("network-config", data.network_config.as_deref().unwrap()),
            ("user-data", &data.user_data),
        ])
    );
}

#[test]
fn nocloud_iso_without_network_data_has_no_network_config() {
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("noCloud.iso");
    let data = sample_data(false);
    write_nocloud_iso(&data, &iso).unwrap();

    let got = extract_with_bsdtar(&iso, &dir.path().join("out"));
    assert_eq!(
        got,
        expected_files(&[
            ("meta-data", &data.meta_data),
            ("user-data", &data.user_data)
        ])
    );
}

#[test]
fn binary_and_multi_sector_contents_survive() {
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("noCloud.iso");
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let big: Vec<u8> = (0..300 * 1024)
        .map(|_| rng.next().to_le_bytes()[0])
        .collect();
    let every_byte: Vec<u8> = (0..=255u8).collect();
    let data = CloudInitData {
        user_data: big,
        meta_data: every_byte,
        network_config: Some(Vec::new()),
    };
    write_nocloud_iso(&data, &iso).unwrap();

    let expected = expected_files(&[
        ("meta-data", &data.meta_data),
        ("network-config", b""),
        ("user-data", &data.user_data),
    ]);
    assert_eq!(extract_with_xorriso(&iso, &dir.path().join("x")), expected);
    assert_eq!(extract_with_bsdtar(&iso, &dir.path().join("b")), expected);
    assert!(fs::metadata(&iso).unwrap().len().is_multiple_of(1 << 20));
}

#[test]
fn same_input_gives_byte_identical_image_at_another_time() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("a/noCloud.iso");
    let second = dir.path().join("b/noCloud.iso");
    write_nocloud_iso(&sample_data(true), &first).unwrap();
    // Cross a second boundary so any wall-clock timestamp would differ.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    write_nocloud_iso(&sample_data(true), &second).unwrap();
    assert!(
        fs::read(&first).unwrap() == fs::read(&second).unwrap(),
        "two images of the same data differ"
    );

    let xorriso = tool("xorriso", "xorriso");
    let pvd = run_text(xorriso, &["-indev", path_str(&first), "-pvd_info"]);
    assert!(pvd.contains("Creation Time: 1970010100000000"), "{pvd}");
    assert!(pvd.contains("Modif. Time  : 1970010100000000"), "{pvd}");
    for extension in ["-R", "-J"] {
        let listing = run_text(isoinfo(), &["-i", path_str(&first), extension, "-l"]);
        let entries: Vec<&str> = listing
            .lines()
            .filter(|l| l.starts_with('-') || l.starts_with('d'))
            .collect();
        assert!(!entries.is_empty(), "{listing}");
        for line in entries {
            assert!(line.contains("Jan  1 1970"), "{extension}: {line}");
        }
    }
}

#[test]
fn different_input_gives_a_different_image() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("a.iso");
    let second = dir.path().join("b.iso");
    let mut data = sample_data(true);
    write_nocloud_iso(&data, &first).unwrap();
    data.user_data.push(b'\n');
    write_nocloud_iso(&data, &second).unwrap();
    assert_ne!(fs::read(&first).unwrap(), fs::read(&second).unwrap());
}

#[test]
fn write_goes_through_staging_and_replaces_old_files() {
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("cloud-init-data/ns/vmi/noCloud.iso");
    let staging = dir
        .path()
        .join("cloud-init-data/ns/vmi/noCloud.iso.staging");
    fs::create_dir_all(iso.parent().unwrap()).unwrap();
    fs::write(&staging, b"left over from a crash").unwrap();
    fs::write(&iso, b"an older image").unwrap();

    let data = sample_data(false);
    write_nocloud_iso(&data, &iso).unwrap();
    assert!(!staging.exists(), "staging file left behind");
    let got = run(isoinfo(), &["-i", path_str(&iso), "-R", "-x", "/user-data"]);
    assert_eq!(got, data.user_data);
}

#[test]
fn write_creates_missing_parent_directories() {
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("new/nested/noCloud.iso");
    write_nocloud_iso(&sample_data(false), &iso).unwrap();
    assert!(iso.is_file());
}

#[test]
fn write_into_an_unusable_directory_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_dir = dir.path().join("file");
    fs::write(&not_a_dir, b"x").unwrap();
    let err = write_nocloud_iso(&sample_data(false), &not_a_dir.join("noCloud.iso")).unwrap_err();
    assert!(matches!(err, CloudInitError::Io { .. }), "{err}");
    assert!(err.to_string().contains("file"), "{err}");
}

#[test]
fn oversized_data_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("noCloud.iso");
    let data = CloudInitData {
        user_data: vec![b'a'; MAX_INPUT_BYTES + 1],
        meta_data: b"{}".to_vec(),
        network_config: None,
    };
    let err = write_nocloud_iso(&data, &iso).unwrap_err();
    assert!(matches!(err, CloudInitError::TooLarge { .. }), "{err}");
    assert!(!iso.exists());
}

// ---------------------------------------------------------------------------------------------
// ConfigDrive image

#[test]
fn config_drive_iso_reads_back_under_openstack_latest() {
    let dir = tempfile::tempdir().unwrap();
    let iso = dir.path().join("configdrive.iso");
    let data = CloudInitData {
        user_data: fixture("user-data.yaml"),
        meta_data: br#"{"instance_id":"testvmi.default","hostname":"testvmi"}"#.to_vec(),
        network_config: Some(br#"{"links":[]}"#.to_vec()),
    };
    write_config_drive_iso(&data, &iso).unwrap();

    let info = run_text(isoinfo(), &["-d", "-i", path_str(&iso)]);
    assert!(info.contains("Volume id: config-2\n"), "{info}");
    let probe = blkid_probe(&iso);
    assert!(probe.contains("\nLABEL=config-2\n"), "{probe}");
    for extension in ["-R", "-J"] {
        let got = run(
            isoinfo(),
            &[
                "-i",
                path_str(&iso),
                extension,
                "-x",
                "/openstack/latest/meta_data.json",
            ],
        );
        assert_eq!(got, data.meta_data, "isoinfo {extension}");
    }
    let expected = expected_files(&[
        ("openstack/latest/meta_data.json", &data.meta_data),
        (
            "openstack/latest/network_data.json",
            data.network_config.as_deref().unwrap(),
        ),
        ("openstack/latest/user_data", &data.user_data),
    ]);
    assert_eq!(extract_with_xorriso(&iso, &dir.path().join("x")), expected);
    assert_eq!(extract_with_bsdtar(&iso, &dir.path().join("b")), expected);
}

// ---------------------------------------------------------------------------------------------
// Data sources

fn nocloud(
    vmi_json: serde_json::Value,
    src: serde_json::Value,
    secrets: &Path,
) -> Result<CloudInitData, CloudInitError> {
    nocloud_data(&vmi(vmi_json), "cloudinitdisk", &source(src), secrets)
}

fn no_secrets() -> PathBuf {
    PathBuf::from("/nonexistent/cloudinit-test-secrets")
}

#[test]
fn inline_user_data_and_exact_meta_data() {
    let data = nocloud(
        base_vmi(),
        json!({"userData": "#cloud-config\nfoo: 1\n"}),
        &no_secrets(),
    )
    .unwrap();
    assert_eq!(data.user_data, b"#cloud-config\nfoo: 1\n");
    assert_eq!(data.network_config, None);
    assert_eq!(
        String::from_utf8(data.meta_data).unwrap(),
        format!(r#"{{"instance-id":"{UUID}","local-hostname":"testvmi"}}"#)
    );
}

#[test]
fn base64_user_and_network_data_are_decoded() {
    let data = nocloud(
        base_vmi(),
        json!({"userDataBase64": "I2Nsb3VkLWNvbmZpZwo=", "networkDataBase64": "dmVyc2lvbjogMgo="}),
        &no_secrets(),
    )
    .unwrap();
    assert_eq!(data.user_data, b"#cloud-config\n");
    assert_eq!(data.network_config.as_deref(), Some(&b"version: 2\n"[..]));
}

#[test]
fn base64_with_line_breaks_decodes_like_go() {
    let data = nocloud(
        base_vmi(),
        json!({"userDataBase64": "I2Nsb3Vk\nLWNvbmZp\r\nZwo="}),
        &no_secrets(),
    )
    .unwrap();
    assert_eq!(data.user_data, b"#cloud-config\n");
}

#[test]
fn bad_base64_is_a_clear_error() {
    for bad in [
        "not base64!",
        "I2Nsb3VkLWNvbmZpZwo",
        "I2Nsb3VkLWNvbmZpZwo===",
    ] {
        let err = nocloud(base_vmi(), json!({"userDataBase64": bad}), &no_secrets()).unwrap_err();
        assert!(
            matches!(
                err,
                CloudInitError::InvalidBase64 {
                    field: "userDataBase64",
                    ..
                }
            ),
            "{bad:?}: {err}"
        );
        assert!(err.to_string().contains("cloudinitdisk"), "{err}");
    }
    let err = nocloud(
        base_vmi(),
        json!({"userData": "ok", "networkDataBase64": "%%%"}),
        &no_secrets(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            CloudInitError::InvalidBase64 {
                field: "networkDataBase64",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn inline_data_wins_over_base64() {
    let data = nocloud(
        base_vmi(),
        json!({"userData": "inline", "userDataBase64": "this is not even base64"}),
        &no_secrets(),
    )
    .unwrap();
    assert_eq!(data.user_data, b"inline");
}

#[test]
fn network_data_alone_is_enough() {
    let data = nocloud(
        base_vmi(),
        json!({"networkData": "version: 2\n"}),
        &no_secrets(),
    )
    .unwrap();
    assert_eq!(data.user_data, b"");
    assert_eq!(data.network_config.as_deref(), Some(&b"version: 2\n"[..]));
}

#[test]
fn no_user_or_network_data_is_an_error() {
    for src in [json!({}), json!({"userData": "", "networkDataBase64": ""})] {
        let err = nocloud(base_vmi(), src, &no_secrets()).unwrap_err();
        assert!(matches!(err, CloudInitError::MissingData { .. }), "{err}");
        assert!(err.to_string().contains("is required"), "{err}");
    }
}

#[test]
fn user_data_from_secret_files() {
    let secrets = tempfile::tempdir().unwrap();
    let dir = secrets.path().join("cloudinitdisk");
    fs::create_dir_all(&dir).unwrap();

    // `userData` is the fallback name.
    fs::write(dir.join("userData"), b"from userData key").unwrap();
    let src = json!({"secretRef": {"name": "my-secret"}, "userData": "inline loses"});
    let data = nocloud(base_vmi(), src.clone(), secrets.path()).unwrap();
    assert_eq!(data.user_data, b"from userData key");

    // `userdata` is tried first.
    fs::write(dir.join("userdata"), b"from userdata key").unwrap();
    let data = nocloud(base_vmi(), src, secrets.path()).unwrap();
    assert_eq!(data.user_data, b"from userdata key");
}

#[test]
fn empty_secret_falls_back_to_inline_data() {
    let secrets = tempfile::tempdir().unwrap();
    let dir = secrets.path().join("cloudinitdisk");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("userdata"), b"").unwrap();
    let data = nocloud(
        base_vmi(),
        json!({"secretRef": {"name": "s"}, "userDataBase64": "aW5saW5l"}),
        secrets.path(),
    )
    .unwrap();
    assert_eq!(data.user_data, b"inline");
}

#[test]
fn network_data_from_secret_files() {
    let secrets = tempfile::tempdir().unwrap();
    let dir = secrets.path().join("cloudinitdisk");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("networkData"), b"version: 2\n").unwrap();
    let data = nocloud(
        base_vmi(),
        json!({"networkDataSecretRef": {"name": "net"}, "userData": "u"}),
        secrets.path(),
    )
    .unwrap();
    assert_eq!(data.network_config.as_deref(), Some(&b"version: 2\n"[..]));
}

#[test]
fn shared_secret_with_only_user_data_is_fine() {
    // One secret referenced for both; it holds only `userdata` (KubeVirt accepts this).
    let secrets = tempfile::tempdir().unwrap();
    let dir = secrets.path().join("cloudinitdisk");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("userdata"), b"#cloud-config\n").unwrap();
    let data = nocloud(
        base_vmi(),
        json!({"secretRef": {"name": "s"}, "networkDataSecretRef": {"name": "s"}}),
        secrets.path(),
    )
    .unwrap();
    assert_eq!(data.user_data, b"#cloud-config\n");
    assert_eq!(data.network_config, None);
}

#[test]
fn missing_secret_files_are_a_clear_error() {
    let secrets = tempfile::tempdir().unwrap();
    let err = nocloud(
        base_vmi(),
        json!({"secretRef": {"name": "s"}, "networkDataSecretRef": {"name": "s"}}),
        secrets.path(),
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, CloudInitError::NoSecretData { .. }),
        "{message}"
    );
    for name in ["userdata", "userData", "networkdata", "networkData"] {
        assert!(
            message.contains(&format!("cloudinitdisk/{name}")),
            "{message}"
        );
    }

    // Only the user-data secret referenced, and missing: nothing else to use.
    let err = nocloud(
        base_vmi(),
        json!({"secretRef": {"name": "s"}}),
        secrets.path(),
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, CloudInitError::MissingData { .. }),
        "{message}"
    );
    assert!(message.contains("cloudinitdisk/userdata"), "{message}");
}

#[test]
fn oversized_secret_file_is_refused() {
    let secrets = tempfile::tempdir().unwrap();
    let dir = secrets.path().join("cloudinitdisk");
    fs::create_dir_all(&dir).unwrap();
    let file = fs::File::create(dir.join("userdata")).unwrap();
    file.set_len(MAX_INPUT_BYTES as u64 + 1).unwrap();
    let err = nocloud(
        base_vmi(),
        json!({"secretRef": {"name": "s"}}),
        secrets.path(),
    )
    .unwrap_err();
    assert!(matches!(err, CloudInitError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("userdata"), "{err}");

    // Exactly at the cap is accepted.
    file.set_len(MAX_INPUT_BYTES as u64).unwrap();
    let data = nocloud(
        base_vmi(),
        json!({"secretRef": {"name": "s"}}),
        secrets.path(),
    )
    .unwrap();
    assert_eq!(data.user_data.len(), MAX_INPUT_BYTES);
}

#[test]
fn oversized_base64_is_refused() {
    let huge = "QUFB".repeat(MAX_INPUT_BYTES / 3 + 1);
    let err = nocloud(base_vmi(), json!({"userDataBase64": huge}), &no_secrets()).unwrap_err();
    assert!(matches!(err, CloudInitError::TooLarge { .. }), "{err}");
}

#[test]
fn volume_names_cannot_escape_the_secrets_dir() {
    for name in ["..", "a/b", ""] {
        let err = nocloud_data(
            &vmi(base_vmi()),
            name,
            &source(json!({"secretRef": {"name": "s"}})),
            &no_secrets(),
        )
        .unwrap_err();
        assert!(
            matches!(err, CloudInitError::InvalidName { .. }),
            "{name:?}: {err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Meta data

fn meta_of(vmi_json: serde_json::Value) -> String {
    meta_with_secrets(vmi_json, &no_secrets())
}

fn meta_with_secrets(vmi_json: serde_json::Value, secrets: &Path) -> String {
    let data = nocloud(vmi_json, json!({"userData": "x"}), secrets).unwrap();
    String::from_utf8(data.meta_data).unwrap()
}

#[test]
fn hostname_comes_from_spec_hostname() {
    let mut v = base_vmi();
    v["spec"]["hostname"] = json!("custom-host");
    assert_eq!(
        meta_of(v),
        format!(r#"{{"instance-id":"{UUID}","local-hostname":"custom-host"}}"#)
    );
}

#[test]
fn hostname_is_the_first_label_of_the_name_cut_to_63() {
    let mut v = base_vmi();
    v["metadata"]["name"] = json!("web.example.org");
    assert!(meta_of(v).ends_with(r#""local-hostname":"web"}"#));

    let mut v = base_vmi();
    let long = "a".repeat(70);
    v["metadata"]["name"] = json!(format!("{long}.tail"));
    assert!(meta_of(v).ends_with(&format!(r#""local-hostname":"{}"}}"#, "a".repeat(63))));
}

#[test]
fn instance_id_is_random_without_firmware() {
    let mut v = base_vmi();
    v["spec"]["domain"]
        .as_object_mut()
        .unwrap()
        .remove("firmware");
    let first: serde_json::Value = serde_json::from_str(&meta_of(v.clone())).unwrap();
    let second: serde_json::Value = serde_json::from_str(&meta_of(v)).unwrap();
    let id = first["instance-id"].as_str().unwrap();
    let parsed = uuid::Uuid::parse_str(id).expect("instance-id is a UUID");
    assert_eq!(parsed.get_version_num(), 4);
    assert_eq!(
        id,
        parsed.hyphenated().to_string(),
        "lower-case hyphenated like Go's uuid"
    );
    assert_ne!(first["instance-id"], second["instance-id"]);
}

#[test]
fn instance_type_annotations_lead_and_cluster_wins() {
    let mut v = base_vmi();
    v["metadata"]["annotations"] = json!({"kubevirt.io/instancetype-name": "u1.small"});
    assert_eq!(
        meta_of(v.clone()),
        format!(
            r#"{{"instance-type":"u1.small","instance-id":"{UUID}","local-hostname":"testvmi"}}"#
        )
    );
    v["metadata"]["annotations"]["kubevirt.io/cluster-instancetype-name"] = json!("cx1.large");
    assert!(meta_of(v).starts_with(r#"{"instance-type":"cx1.large","#));
}

#[test]
fn public_keys_from_access_credentials_like_go_json() {
    let secrets = tempfile::tempdir().unwrap();
    let keys = secrets.path().join("my-keys-access-cred");
    fs::create_dir_all(keys.join("..2026_11_30_data")).unwrap();
    // Eleven keys: Go sorts map keys as strings, so "10" comes before "2".
    for i in 0..11 {
        fs::write(
            keys.join(format!("key{i:02}")),
            format!("ssh-ed25519 AAAA{i} u{i}"),
        )
        .unwrap();
    }
    fs::write(keys.join("empty"), b"").unwrap();
    fs::write(keys.join("zz-html"), "ssh-rsa B <admin&co> \u{2028}").unwrap();
    fs::write(keys.join("..data"), b"bookkeeping, skipped").unwrap();

    let mut v = base_vmi();
    v["spec"]["accessCredentials"] = json!([
        {"sshPublicKey": {"source": {"secret": {"secretName": "my-keys"}},
                          "propagationMethod": {"noCloud": {}}}},
        {"sshPublicKey": {"source": {"secret": {"secretName": "agent-only"}},
                          "propagationMethod": {"qemuGuestAgent": {"users": ["fedora"]}}}}
    ]);
    let meta = meta_with_secrets(v, secrets.path());
    let mut expected =
        format!(r#"{{"instance-id":"{UUID}","local-hostname":"testvmi","public-keys":{{"#);
    let mut entries: Vec<(String, String)> = (0..11)
        .map(|i| (i.to_string(), format!("ssh-ed25519 AAAA{i} u{i}")))
        .collect();
    entries.push((
        "11".into(),
        r"ssh-rsa B \u003cadmin\u0026co\u003e \u2028".into(),
    ));
    entries.sort();
    let body: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!(r#""{k}":"{v}""#))
        .collect();
    expected.push_str(&body.join(","));
    expected.push_str("}}");
    assert_eq!(meta, expected);
}

#[test]
fn missing_access_credential_secret_is_an_error() {
    let secrets = tempfile::tempdir().unwrap();
    let mut v = base_vmi();
    v["spec"]["accessCredentials"] = json!([
        {"sshPublicKey": {"source": {"secret": {"secretName": "absent"}},
                          "propagationMethod": {"noCloud": {}}}}
    ]);
    let err = nocloud(v, json!({"userData": "x"}), secrets.path()).unwrap_err();
    assert!(matches!(err, CloudInitError::Io { .. }), "{err}");
    assert!(err.to_string().contains("absent-access-cred"), "{err}");

    let mut v = base_vmi();
    v["spec"]["accessCredentials"] = json!({"not": "a list"});
    let err = nocloud(v, json!({"userData": "x"}), secrets.path()).unwrap_err();
    assert!(
        matches!(err, CloudInitError::InvalidAccessCredentials(_)),
        "{err}"
    );
}

#[test]
fn config_drive_meta_data_matches_kubevirt() {
    let mut v = base_vmi();
    v["metadata"]["annotations"] = json!({"kubevirt.io/instancetype-name": "u1.small"});
    let data = config_drive_data(
        &vmi(v),
        "cloudinitdisk",
        &source(json!({"userData": "#cloud-config\n", "networkData": "{}"})),
        &no_secrets(),
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(data.meta_data).unwrap(),
        format!(
            r#"{{"instance_type":"u1.small","instance_id":"testvmi.default","hostname":"testvmi","uuid":"{UUID}"}}"#
        )
    );
    assert_eq!(data.network_config.as_deref(), Some(&b"{}"[..]));
}

// ---------------------------------------------------------------------------------------------
// The whole path, from a VMI fixture

#[test]
fn prepare_builds_the_nocloud_disk_of_a_vmi_fixture() {
    let vmi: VirtualMachineInstance =
        serde_json::from_slice(&fixture("vmi-nocloud.json")).expect("fixture parses");
    let secrets = tempfile::tempdir().unwrap();
    let user_dir = secrets.path().join("cloudinitdisk");
    fs::create_dir_all(&user_dir).unwrap();
    fs::write(user_dir.join("userdata"), fixture("user-data.yaml")).unwrap();
    let keys = secrets.path().join("fixture-keys-access-cred");
    fs::create_dir_all(&keys).unwrap();
    fs::write(keys.join("authorized_key"), b"ssh-ed25519 AAAAC3 fixture").unwrap();
    let out = tempfile::tempdir().unwrap();

    let disk = prepare_cloud_init_disk(&vmi, secrets.path(), out.path())
        .unwrap()
        .expect("the fixture has a cloud-init volume");
    assert_eq!(disk.volume_name, "cloudinitdisk");
    assert_eq!(disk.source, DataSource::NoCloud);
    assert_eq!(
        disk.iso_path,
        iso_path(
            out.path(),
            DataSource::NoCloud,
            &PathName::component("namespace", "tenant-a").unwrap(),
            &PathName::component("name", "fixture-vmi.with.dots").unwrap(),
        )
    );
    assert!(
        disk.iso_path
            .ends_with("tenant-a/fixture-vmi.with.dots/noCloud.iso")
    );

    let got = extract_with_xorriso(&disk.iso_path, &out.path().join("x"));
    let meta = br#"{"instance-type":"u1.small","instance-id":"0b4a8b5e-3c2d-5f61-9a7e-2c1d0e9f8a7b","local-hostname":"fixture-vmi","public-keys":{"0":"ssh-ed25519 AAAAC3 fixture"}}"#;
    assert_eq!(
        got,
        expected_files(&[
            ("meta-data", meta),
            (
                "network-config",
                b"version: 2\nethernets:\n  nic0:\n    dhcp4: true\n"
            ),
            ("user-data", &fixture("user-data.yaml")),
        ])
    );
}

#[test]
fn prepare_without_cloud_init_volume_does_nothing() {
    let mut v = base_vmi();
    v["spec"]["volumes"] = json!([{"name": "root", "containerDisk": {"image": "x"}}]);
    let out = tempfile::tempdir().unwrap();
    assert_eq!(
        prepare_cloud_init_disk(&vmi(v), &no_secrets(), out.path()).unwrap(),
        None
    );
    assert_eq!(fs::read_dir(out.path()).unwrap().count(), 0);
}

#[test]
fn prepare_builds_a_config_drive() {
    let mut v = base_vmi();
    v["spec"]["volumes"] =
        json!([{"name": "cd", "cloudInitConfigDrive": {"userData": "#cloud-config\n"}}]);
    let out = tempfile::tempdir().unwrap();
    let disk = prepare_cloud_init_disk(&vmi(v), &no_secrets(), out.path())
        .unwrap()
        .unwrap();
    assert_eq!(disk.source, DataSource::ConfigDrive);
    assert!(disk.iso_path.ends_with("default/testvmi/configdrive.iso"));
    let info = run_text(isoinfo(), &["-d", "-i", path_str(&disk.iso_path)]);
    assert!(info.contains("Volume id: config-2\n"), "{info}");
    let got = run(
        isoinfo(),
        &[
            "-i",
            path_str(&disk.iso_path),
            "-R",
            "-x",
            "/openstack/latest/user_data",
        ],
    );
    assert_eq!(got, b"#cloud-config\n");
}

#[test]
fn prepare_refuses_path_like_vmi_names() {
    let mut v = base_vmi();
    v["metadata"]["namespace"] = json!("..");
    let out = tempfile::tempdir().unwrap();
    let err = prepare_cloud_init_disk(&vmi(v), &no_secrets(), out.path()).unwrap_err();
    assert!(matches!(err, CloudInitError::InvalidName { .. }), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Random inputs

/// Small deterministic generator: the same cases on every run.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_base64_fields_never_panic() {
    const ALPHABET: &[u8] =
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=\n\r -_!\xc3\xa9";
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    let (mut ok, mut rejected) = (0, 0);
    for _ in 0..2000 {
        let len = u64_to_usize(rng.next() % 40);
        let bytes: Vec<u8> = (0..len)
            .map(|_| ALPHABET[u64_to_usize(rng.next() % ALPHABET.len() as u64)])
            .collect();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        match nocloud(
            base_vmi(),
            json!({"userDataBase64": text, "networkData": "n"}),
            &no_secrets(),
        ) {
            Ok(_) => ok += 1,
            Err(CloudInitError::InvalidBase64 { .. }) => rejected += 1,
            Err(other) => panic!("unexpected error for {text:?}: {other}"),
        }
    }
    assert!(ok > 0 && rejected > 0, "ok {ok}, rejected {rejected}");
}

#[test]
fn random_contents_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = XorShift(0xdead_beef_cafe_f00d);
    for round in 0..4 {
        let mut blob = |max: u64| -> Vec<u8> {
            let len = rng.next() % max;
            (0..len).map(|_| rng.next().to_le_bytes()[0]).collect()
        };
        let data = CloudInitData {
            user_data: blob(70_000),
            meta_data: blob(3000),
            network_config: if round % 2 == 0 {
                Some(blob(5000))
            } else {
                None
            },
        };
        let iso = dir.path().join(format!("r{round}.iso"));
        write_nocloud_iso(&data, &iso).unwrap();
        let got = extract_with_bsdtar(&iso, &dir.path().join(format!("r{round}")));
        let mut expected = expected_files(&[
            ("meta-data", &data.meta_data),
            ("user-data", &data.user_data),
        ]);
        if let Some(network) = &data.network_config {
            expected.insert("network-config".into(), network.clone());
        }
        assert_eq!(got, expected, "round {round}");
    }
}

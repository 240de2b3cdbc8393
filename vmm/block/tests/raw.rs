//! The raw backend: positional I/O, zeroes, discard, read-only, ranges.

use block::{DiskError, Format, open_disk};

#[test]
fn raw_file_reads_writes_zeroes_and_refuses_what_it_must() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.raw");
    std::fs::write(&p, vec![0xaau8; 1 << 20]).unwrap();
    let mut d = open_disk(&p, Format::Raw, false).unwrap();
    assert_eq!(d.size(), 1 << 20);
    d.write_at(&[1, 2, 3], 10).unwrap();
    d.write_zeroes(4096, 8192, false).unwrap();
    d.write_zeroes(65536, 65536, true).unwrap();
    d.discard(200_000, 4096).unwrap();
    d.flush().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    d.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf[9..14], &[0xaa, 1, 2, 3, 0xaa]);
    assert!(buf[4096..12288].iter().all(|&b| b == 0));
    assert!(buf[65536..131072].iter().all(|&b| b == 0));
    assert!(buf[12288..65536].iter().all(|&b| b == 0xaa));
    assert!(matches!(
        d.read_at(&mut buf[..2], (1 << 20) - 1),
        Err(DiskError::OutOfRange { .. })
    ));
    assert!(matches!(
        d.write_at(&[0], u64::MAX),
        Err(DiskError::OutOfRange { .. })
    ));
    drop(d);
    let mut ro = open_disk(&p, Format::Raw, true).unwrap();
    assert!(ro.read_only());
    assert!(matches!(ro.write_at(&[0], 0), Err(DiskError::ReadOnly)));
    assert!(matches!(ro.discard(0, 512), Err(DiskError::ReadOnly)));
    assert!(matches!(
        ro.write_zeroes(0, 512, true),
        Err(DiskError::ReadOnly)
    ));
    // Closed first: an image open for reading cannot be opened for writing.
    drop(ro);
    // O_DIRECT: aligned requests use it, unaligned ones still work.
    let mut direct = block::open_disk_with(
        &p,
        Format::Raw,
        block::OpenOptions {
            read_only: false,
            direct: true,
            ..block::OpenOptions::default()
        },
    )
    .unwrap();
    direct.write_at(&vec![7u8; 8192], 8192).unwrap();
    direct.write_at(&[9u8; 3], 5).unwrap();
    let mut b = vec![0u8; 8192];
    direct.read_at(&mut b, 8192).unwrap();
    assert!(b.iter().all(|&x| x == 7));
    direct.read_at(&mut b[..4], 4).unwrap();
    assert_eq!(&b[..4], &[0xaa, 9, 9, 9]);
}

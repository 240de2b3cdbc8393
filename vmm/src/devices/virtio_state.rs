//! The virtio transports' state on a migration's stream (`crate::wire`): written by
//! the source while its VM and devices are paused, read as untrusted input by the
//! target and handed to its transports, which check it as a driver's writes
//! (`virtio_devices::PciTransport::restore`, `MmioTransport::restore`).

use virtio_devices::{MsiMessage, PciState, QueueRegisters, TransportState};

use crate::bus::lock;
use crate::devices::virtio::VirtioTransport;
use crate::kvm::layout::PCI_ECAM_BASE;
use crate::kvm::vcpu::Buses;
use crate::wire::{Decoder, Encoder, FormatError};

/// Queues and MSI-X vectors of one device at most (virtio-net's are 2 and 3 today).
const MAX_QUEUES: usize = 64;
const MAX_VECTORS: usize = MAX_QUEUES + 1;
/// The configuration space a virtio-pci function defines.
const PCI_CONFIG_BYTES: usize = 256;
/// The PCI command register.
const COMMAND: u64 = 0x04;

/// Whether every transport's device can be moved (checked before a migration starts).
pub(crate) fn migratable(transports: &[VirtioTransport]) -> Result<(), String> {
    transports.iter().try_for_each(|t| match t {
        VirtioTransport::Mmio(t) => lock(t).migratable(),
        VirtioTransport::Pci(t) => lock(t).migratable(),
    })
}

/// Writes every transport's state, in order (the devices are paused).
pub(crate) fn save(transports: &[VirtioTransport], e: &mut Encoder) -> Result<(), String> {
    for transport in transports {
        match transport {
            VirtioTransport::Mmio(t) => encode_transport(&lock(t).save()?, e),
            VirtioTransport::Pci(t) => encode_pci(&lock(t).save()?, e),
        }
    }
    Ok(())
}

/// Gives every transport the state the source saved, then lets each PCI function's
/// queue notifications (ioeventfds) follow its BAR, as a guest's write of its command
/// register would.
pub(crate) fn restore(
    transports: &[VirtioTransport],
    d: &mut Decoder,
    buses: &Buses,
) -> Result<(), FormatError> {
    let invalid = |what: &str, e: String| FormatError::Invalid(format!("{what}: {e}"));
    for (index, transport) in transports.iter().enumerate() {
        match transport {
            VirtioTransport::Mmio(t) => {
                let state = decode_transport(d)?;
                lock(t)
                    .restore(&state)
                    .map_err(|e| invalid("a virtio-mmio device", e))?;
            }
            VirtioTransport::Pci(t) => {
                let state = decode_pci(d)?;
                lock(t)
                    .restore(&state)
                    .map_err(|e| invalid("a virtio-pci device", e))?;
                // Slot 0 is the host bridge; the devices follow in order.
                let slot = u64::try_from(index + 1).unwrap_or(u64::MAX);
                let command = [state.config[0x04], state.config[0x05]];
                buses
                    .mmio
                    .write(PCI_ECAM_BASE + (slot << 15) + COMMAND, &command);
            }
        }
    }
    for transport in transports {
        match transport {
            VirtioTransport::Mmio(t) => lock(t).resume_after_restore(),
            VirtioTransport::Pci(t) => lock(t).resume_after_restore(),
        }
    }
    Ok(())
}

fn encode_transport(s: &TransportState, e: &mut Encoder) {
    e.u32(s.status);
    e.u32(s.device_features_sel);
    e.u32(s.driver_features_sel);
    e.u64(s.acked_features);
    e.u8(u8::from(s.unknown_features_acked) | (u8::from(s.activated) << 1));
    e.u32(s.queue_sel);
    e.u32(s.interrupt_status);
    e.u16(u16::try_from(s.queues.len()).unwrap_or(u16::MAX));
    for q in &s.queues {
        e.u32(q.size);
        e.u8(u8::from(q.ready));
        e.u64(q.desc);
        e.u64(q.avail);
        e.u64(q.used);
    }
    e.u16(u16::try_from(s.positions.len()).unwrap_or(u16::MAX));
    for &(avail, used) in &s.positions {
        e.u16(avail);
        e.u16(used);
    }
}

fn flag(value: u8, what: &str) -> Result<bool, FormatError> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(FormatError::Invalid(format!("{what} {other}"))),
    }
}

fn decode_transport(d: &mut Decoder) -> Result<TransportState, FormatError> {
    let status = d.u32()?;
    let device_features_sel = d.u32()?;
    let driver_features_sel = d.u32()?;
    let acked_features = d.u64()?;
    let flags = d.u8()?;
    if flags > 3 {
        return Err(FormatError::Invalid(format!(
            "virtio transport flags {flags:#x}"
        )));
    }
    let queue_sel = d.u32()?;
    let interrupt_status = d.u32()?;
    let queues = (0..d.count(MAX_QUEUES, "a device's queues")?)
        .map(|_| {
            Ok(QueueRegisters {
                size: d.u32()?,
                ready: flag(d.u8()?, "queue ready")?,
                desc: d.u64()?,
                avail: d.u64()?,
                used: d.u64()?,
            })
        })
        .collect::<Result<_, FormatError>>()?;
    let positions = (0..d.count(MAX_QUEUES, "a device's queue positions")?)
        .map(|_| Ok((d.u16()?, d.u16()?)))
        .collect::<Result<_, FormatError>>()?;
    Ok(TransportState {
        status,
        device_features_sel,
        driver_features_sel,
        acked_features,
        unknown_features_acked: flags & 1 != 0,
        queue_sel,
        queues,
        activated: flags & 2 != 0,
        interrupt_status,
        positions,
    })
}

fn encode_pci(s: &PciState, e: &mut Encoder) {
    e.short_bytes(&s.config);
    e.u8(u8::from(s.msix_enabled) | (u8::from(s.msix_function_masked) << 1));
    e.u16(u16::try_from(s.msix_entries.len()).unwrap_or(u16::MAX));
    for ((message, masked), pending) in s.msix_entries.iter().zip(&s.msix_pending) {
        e.u64(message.address);
        e.u32(message.data);
        e.u8(u8::from(*masked) | (u8::from(*pending) << 1));
    }
    e.u16(s.config_vector);
    e.u16(u16::try_from(s.queue_vectors.len()).unwrap_or(u16::MAX));
    for &v in &s.queue_vectors {
        e.u16(v);
    }
    e.u16(u16::try_from(s.queue_sizes.len()).unwrap_or(u16::MAX));
    for &size in &s.queue_sizes {
        e.u16(size);
    }
    e.u16(s.queue_select);
    e.u32(s.device_feature_select);
    e.u32(s.driver_feature_select);
    e.u64(s.driver_features);
    encode_transport(&s.transport, e);
}

fn decode_pci(d: &mut Decoder) -> Result<PciState, FormatError> {
    let config = d
        .short_bytes(PCI_CONFIG_BYTES, "a PCI configuration space")?
        .to_vec();
    let flags = d.u8()?;
    if flags > 3 {
        return Err(FormatError::Invalid(format!("MSI-X flags {flags:#x}")));
    }
    let mut msix_entries = Vec::new();
    let mut msix_pending = Vec::new();
    for _ in 0..d.count(MAX_VECTORS, "MSI-X vectors")? {
        let message = MsiMessage {
            address: d.u64()?,
            data: d.u32()?,
        };
        let bits = d.u8()?;
        if bits > 3 {
            return Err(FormatError::Invalid(format!("MSI-X entry flags {bits:#x}")));
        }
        msix_entries.push((message, bits & 1 != 0));
        msix_pending.push(bits & 2 != 0);
    }
    let config_vector = d.u16()?;
    let queue_vectors = (0..d.count(MAX_QUEUES, "queue vectors")?)
        .map(|_| d.u16())
        .collect::<Result<_, _>>()?;
    let queue_sizes = (0..d.count(MAX_QUEUES, "queue sizes")?)
        .map(|_| d.u16())
        .collect::<Result<_, _>>()?;
    Ok(PciState {
        config,
        msix_enabled: flags & 1 != 0,
        msix_function_masked: flags & 2 != 0,
        msix_entries,
        msix_pending,
        config_vector,
        queue_vectors,
        queue_sizes,
        queue_select: d.u16()?,
        device_feature_select: d.u32()?,
        driver_feature_select: d.u32()?,
        driver_features: d.u64()?,
        transport: decode_transport(d)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> PciState {
        PciState {
            config: (0..=255).collect(),
            msix_enabled: true,
            msix_function_masked: false,
            msix_entries: vec![
                (
                    MsiMessage {
                        address: 0xfee0_0000,
                        data: 0x41,
                    },
                    false,
                ),
                (MsiMessage::default(), true),
            ],
            msix_pending: vec![false, true],
            config_vector: 1,
            queue_vectors: vec![0],
            queue_sizes: vec![8],
            queue_select: 3,
            device_feature_select: 1,
            driver_feature_select: 0,
            driver_features: 1 << 32,
            transport: TransportState {
                status: 0xf,
                device_features_sel: 1,
                driver_features_sel: 0,
                acked_features: 1 << 32,
                unknown_features_acked: false,
                queue_sel: 0,
                queues: vec![QueueRegisters {
                    size: 8,
                    ready: true,
                    desc: 0x1000,
                    avail: 0x1100,
                    used: 0x1200,
                }],
                activated: true,
                interrupt_status: 1,
                positions: vec![(11, 11)],
            },
        }
    }

    #[test]
    fn a_function_state_reads_back_as_written_and_is_used_up() {
        let mut e = Encoder::default();
        encode_pci(&state(), &mut e);
        let mut d = Decoder::new(&e.0, "a virtio state");
        assert_eq!(decode_pci(&mut d).unwrap(), state());
        d.finish().unwrap();
    }

    #[test]
    fn cut_oversized_and_odd_states_are_refused() {
        let mut e = Encoder::default();
        encode_pci(&state(), &mut e);
        let bytes = e.0;
        for cut in [0, 1, 100, 258, bytes.len() - 1] {
            let err = decode_pci(&mut Decoder::new(&bytes[..cut], "a virtio state"));
            assert!(err.is_err(), "cut at {cut}");
        }
        // The MSI-X vector count, right after the configuration space and the flags.
        let at = 2 + 256 + 1;
        let mut big = bytes.clone();
        big[at..at + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        let err = decode_pci(&mut Decoder::new(&big, "a virtio state")).unwrap_err();
        assert!(err.to_string().contains("larger than the limit"), "{err}");
        let mut odd = bytes.clone();
        odd[2 + 256] = 0x80;
        let err = decode_pci(&mut Decoder::new(&odd, "a virtio state")).unwrap_err();
        assert!(err.to_string().contains("MSI-X flags"), "{err}");
    }
}

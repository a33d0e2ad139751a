//! Installing Metropolis the way the reference does
//! (docs/spec/metropolis-install.md sections 2 to 4): the A/B layout, the
//! ESP with the loader, the node's kernel and its parameters, `system` in
//! slot A, the partition table, the EFI boot entry.
//!
//! # Order
//!
//! Everything that can refuse the install is checked before the device is
//! touched: the agent has the A/B loader, the machine booted with EFI, the
//! image has both payloads, the disk takes the layout ([`Layout::plan`]),
//! `kernel.efi` fits the ESP (at most [`MAX_KERNEL_BYTES`]) and `system`
//! fits slot A. Then:
//!
//! 1. the whole device is discarded (errors ignored: not every device
//!    can), and its first and last mebibyte zeroed and synced, so that
//!    from here until the end the disk boots neither the old system nor a
//!    part of the new one (the reference relies on the discard alone);
//! 2. the ESP is formatted and its files written, `kernel.efi` streamed
//!    from the registry into it as the reference does (each chunk
//!    verified before it is written; never held whole);
//! 3. `system` streams into slot A, each chunk verified before it is
//!    written, and read back;
//! 4. the GPT: backup first, sync, then the protective MBR and the
//!    primary, sync ([`gpt::write`]): only now is there a disk to boot;
//!    the kernel is asked to read it ([`disk::reread_partitions`]);
//! 5. the boot entry, through efivarfs.

use std::io::Read;
use std::path::PathBuf;

use metropolis_proto::osbase::net::proto::Net;
use prost::Message;

use super::device::Device;
use super::image::FetchedImage;
use super::table;
use super::writer::{Placement, StreamError, write_payload};
use super::{InstallError, Progress, Target};
use crate::disk::{self, Layout, esp, gpt};
use crate::{efivars, loader};

/// The node's EFI program payload.
pub(super) const KERNEL_PAYLOAD: &str = "kernel.efi";
/// The system partition's contents payload.
pub(super) const SYSTEM_PAYLOAD: &str = "system";
/// Where the ESP holds the node's kernel for slot A.
pub(super) const KERNEL_PATH: &str = "EFI/metropolis/boot-a.efi";
/// Where the ESP holds the node's parameters.
pub(super) const PARAMETERS_PATH: &str = "metropolis/parameters.pb";
/// The largest `kernel.efi` accepted: the 384 MiB ESP less 8 MiB for its
/// FATs, directories, the loader and the parameters (refused before the
/// disk is touched, rather than when the ESP runs full).
pub const MAX_KERNEL_BYTES: u64 = 376 * 1024 * 1024;

/// What a Metropolis install needs of the machine besides the disk.
#[derive(Clone, Debug)]
pub struct MetropolisOptions {
    /// `/sys/firmware/efi`: present only on a machine booted with EFI.
    pub firmware_dir: PathBuf,
    /// `/sys/firmware/efi/efivars`: where the boot entry is written.
    pub efivars_dir: PathBuf,
    /// The network configuration the agent runs with, given to the node
    /// when the request's `node_parameters` has none.
    pub network_config: Option<Net>,
}

impl Default for MetropolisOptions {
    fn default() -> Self {
        MetropolisOptions {
            firmware_dir: PathBuf::from("/sys/firmware/efi"),
            efivars_dir: PathBuf::from("/sys/firmware/efi/efivars"),
            network_config: None,
        }
    }
}

fn unusable(target: &Target, problem: String) -> InstallError {
    InstallError::DeviceUnusable {
        path: target.root_device.clone(),
        problem,
    }
}

/// Installs the Metropolis image `image` onto `target` (see the
/// [module](self)).
pub(super) fn install_metropolis(
    image: &mut FetchedImage,
    target: &Target,
    options: &MetropolisOptions,
    allow_files: bool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(), InstallError> {
    let loader = loader::ab_loader().map_err(|e| InstallError::Unbootable {
        problem: e.to_string(),
    })?;
    if !efivars::efi_booted(&options.firmware_dir) {
        return Err(InstallError::Unbootable {
            problem: format!(
                "Metropolis can only be installed on EFI-booted machines, and this one was not \
                 ({} does not exist)",
                options.firmware_dir.display()
            ),
        });
    }
    let (kernel, _) = image.payload(KERNEL_PAYLOAD)?;
    let (system, _) = image.payload(SYSTEM_PAYLOAD)?;
    if kernel.size > MAX_KERNEL_BYTES {
        return Err(InstallError::InvalidImage {
            image: image.name(),
            problem: format!(
                "its {KERNEL_PAYLOAD} is {} bytes; at most {MAX_KERNEL_BYTES} fit the ESP",
                kernel.size
            ),
        });
    }
    let device = Device::open(&target.root_device, allow_files)?;
    let size = device.size()?;
    let layout = Layout::plan(size, device.logical_block_size()?)
        .map_err(|e| unusable(target, e.to_string()))?;
    let slot_a = *layout.system_a();
    if system.size > slot_a.length {
        return Err(unusable(
            target,
            format!(
                "the image's {SYSTEM_PAYLOAD} is {} bytes, larger than the {} bytes of {}",
                system.size, slot_a.length, slot_a.name
            ),
        ));
    }
    let parameters = node_parameters(target, options);

    // The device is touched from here on.
    if let Err(e) = disk::discard(device.file(), 0..size) {
        tracing::info!("root device not discarded ({e}); writing over it");
    }
    device.invalidate()?;
    progress(&Progress::Step {
        done: "old partition table cleared",
    });
    image.read_payload(KERNEL_PAYLOAD, |payload| {
        let mut kernel = Tracked::new(payload);
        let (mut loader, mut parameters) = (loader, parameters.as_slice());
        let mut files: [(&str, &mut dyn Read); 3] = [
            (loader::ESP_PATH, &mut loader),
            (KERNEL_PATH, &mut kernel),
            (PARAMETERS_PATH, &mut parameters),
        ];
        let written = esp::format(device.file(), &layout, &mut files);
        match (written, kernel.failure.take()) {
            (Ok(()), _) => Ok(()),
            // The payload failed (its transfer, a chunk): its error.
            (Err(_), Some(read)) => Err(StreamError::Read(read)),
            (Err(e), None) => Err(unusable(target, e.to_string()).into()),
        }
    })?;
    progress(&Progress::Step {
        done: "ESP formatted: loader, kernel and node parameters written",
    });
    let place = Placement {
        payload: SYSTEM_PAYLOAD,
        base: slot_a.offset,
        size: system.size,
        hold_head: false,
    };
    image.read_payload(SYSTEM_PAYLOAD, |payload| {
        write_payload(payload, &place, &device, progress).map(drop)
    })?;
    device.sync()?;
    gpt::write(device.file(), &layout).map_err(|e| unusable(target, e.to_string()))?;
    progress(&Progress::Step {
        done: "partition table written",
    });
    table::reread(&device, progress);
    let entry = efivars::add_boot_entry(&options.efivars_dir, &layout).map_err(|e| {
        InstallError::Unbootable {
            problem: format!("the disk is written but the boot entry is not: {e}"),
        }
    })?;
    tracing::info!("boot entry Boot{entry:04X} added and made the only one in BootOrder");
    progress(&Progress::Step {
        done: "EFI boot entry written",
    });
    Ok(())
}

/// A payload reader that keeps its first read error for the caller,
/// handing the filesystem writing it a stand-in: the payload's error
/// (which chunk, the transfer) is then reported as the payload's, not as
/// a failed ESP write.
struct Tracked<'r, R> {
    inner: &'r mut R,
    failure: Option<std::io::Error>,
}

impl<'r, R: Read> Tracked<'r, R> {
    fn new(inner: &'r mut R) -> Self {
        Tracked {
            inner,
            failure: None,
        }
    }
}

impl<R: Read> Read for Tracked<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.failure.is_some() {
            return Err(std::io::Error::other("the payload failed"));
        }
        self.inner.read(buf).map_err(|e| {
            self.failure = Some(e);
            std::io::Error::other("the payload failed")
        })
    }
}

/// `parameters.pb`: the request's `node_parameters` (empty when unset),
/// as the request encoded them when it did, with the agent's own network
/// configuration when they have none (appended as field 4: a parser
/// merges it in, and the bytes sent stay as they were).
fn node_parameters(target: &Target, options: &MetropolisOptions) -> Vec<u8> {
    let decoded = target.node_parameters.clone().unwrap_or_default();
    let network = options
        .network_config
        .as_ref()
        .filter(|_| decoded.network_config.is_none());
    match &target.node_parameters_encoded {
        Some(sent) => {
            let mut bytes = sent.clone();
            if let Some(network) = network {
                prost::encoding::message::encode(NETWORK_CONFIG_FIELD, network, &mut bytes);
            }
            bytes
        }
        None => {
            let mut parameters = decoded;
            parameters.network_config = parameters.network_config.or(network.cloned());
            parameters.encode_to_vec()
        }
    }
}

/// `NodeParameters.network_config`'s field number.
const NETWORK_CONFIG_FIELD: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use metropolis_proto::prelude::debug::NodeParameters;

    #[test]
    fn parameters_are_the_request_s_with_the_agent_s_network_when_unset() {
        let agent_net = Net {
            interface: Vec::new(),
            ..Default::default()
        };
        let options = MetropolisOptions {
            network_config: Some(agent_net.clone()),
            ..MetropolisOptions::default()
        };
        let mut target = Target::default();
        let decoded = |bytes: Vec<u8>| NodeParameters::decode(bytes.as_slice()).ok();
        let filled = decoded(node_parameters(&target, &options)).unwrap_or_default();
        assert_eq!(filled.network_config, Some(agent_net));

        let own = Net {
            nameserver: vec![Default::default()],
            ..Default::default()
        };
        target.node_parameters = Some(NodeParameters {
            network_config: Some(own.clone()),
            ..Default::default()
        });
        let kept = decoded(node_parameters(&target, &options)).unwrap_or_default();
        assert_eq!(kept.network_config, Some(own));
        assert!(node_parameters(&Target::default(), &MetropolisOptions::default()).is_empty());
    }

    #[test]
    fn sent_parameters_are_written_as_sent_with_the_network_appended() {
        // An unknown field (99, "new") and no network_config.
        let sent = vec![0x9a, 0x06, 0x03, b'n', b'e', b'w'];
        let agent_net = Net {
            nameserver: vec![Default::default()],
            ..Default::default()
        };
        let options = MetropolisOptions {
            network_config: Some(agent_net.clone()),
            ..MetropolisOptions::default()
        };
        let target = Target {
            node_parameters: NodeParameters::decode(sent.as_slice()).ok(),
            node_parameters_encoded: Some(sent.clone()),
            ..Target::default()
        };
        let written = node_parameters(&target, &options);
        assert!(
            written.starts_with(&sent),
            "the sent bytes first, unchanged"
        );
        let decoded = NodeParameters::decode(written.as_slice()).unwrap_or_default();
        assert_eq!(decoded.network_config, Some(agent_net));
        // With their own network_config they are written exactly.
        let own = [0x22, 0x00, 0x9a, 0x06, 0x01, b'x'];
        let target = Target {
            node_parameters: NodeParameters::decode(&own[..]).ok(),
            node_parameters_encoded: Some(own.to_vec()),
            ..Target::default()
        };
        assert_eq!(node_parameters(&target, &options), own);
    }
}

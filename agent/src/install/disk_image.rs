//! Installing a whole-disk image (`application/vnd.metropolis-rs.os.disk-image.v1`,
//! this project's, for operating systems other than Metropolis): its one
//! payload, `disk`, written over the root device from its first byte,
//! the head last (`device.rs`, "Head last"). Then, on a block device
//! larger than the image, the image's backup GPT is moved to the
//! device's end, and the kernel asked to read the table (`table.rs`).

use super::aligned::AlignedBuf;
use super::device::Device;
use super::image::FetchedImage;
use super::table;
use super::writer::{Placement, write_payload};
use super::{InstallError, Progress, Target};

/// The whole-disk image's one payload.
pub(super) const DISK_PAYLOAD: &str = "disk";

/// Writes `image`'s `disk` payload onto `target`'s root device. The
/// device is untouched until the payload's first bytes arrive.
pub(super) fn install_disk(
    image: &mut FetchedImage,
    target: &Target,
    allow_files: bool,
    progress: &mut dyn FnMut(&Progress),
) -> Result<(), InstallError> {
    let names: Vec<&str> = image
        .config
        .payloads
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    if names != [DISK_PAYLOAD] {
        return Err(InstallError::InvalidImage {
            image: image.name(),
            problem: format!(
                "a whole-disk image has exactly one payload, {DISK_PAYLOAD}; it has {}",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
        });
    }
    let (spec, _) = image.payload(DISK_PAYLOAD)?;
    let device = Device::open(&target.root_device, allow_files)?;
    device.check_capacity(spec.size)?;
    let place = Placement {
        payload: DISK_PAYLOAD,
        base: 0,
        size: spec.size,
        hold_head: true,
    };
    let head = image.read_payload(DISK_PAYLOAD, |payload| {
        // From here until the image verified, the device does not boot.
        device.invalidate()?;
        write_payload(payload, &place, &device, progress)
    })?;
    device.commit(&head, spec.size, &mut AlignedBuf::new(0))?;
    table::move_image_backup(&device, progress)?;
    table::reread(&device, progress);
    Ok(())
}

//! The A/B loader, installed as `\EFI\BOOT\BOOTx64.EFI` on the ESP.
//!
//! Reads `\EFI\metropolis\loader_state.pb` ([`efi_fw::state`]) and starts
//! `\EFI\metropolis\boot-a.efi` or `boot-b.efi` from its own device, under
//! that path (the node's kernel derives its slot from its file name). A
//! `next_slot` is booted once: the file is first rewritten without it,
//! `active_slot` kept; when that rewrite fails the active slot is booted
//! instead, since a one-time boot that cannot be recorded as done would be
//! repeated at every boot. When the chosen slot cannot be loaded or
//! started, the other one is tried. Each decision is a line on the
//! console.

#![no_std]

use efi_fw::state::{ENCODED_MAX, Found, LoaderData, MAX_STATE_LEN, Plan, STATE_PATH};
use efi_fw::{Efi, Error, Handle, Line, Mode, Status, SystemTable, Volume};

/// Entry point, called by gnu-efi's crt0 with the firmware's arguments.
///
/// # Safety
///
/// `image` and `system_table` are what the firmware passed to this image,
/// in boot services.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn efi_main(image: Handle, system_table: *mut SystemTable) -> Status {
    // SAFETY: the function's contract.
    let Some(efi) = (unsafe { Efi::new(image, system_table) }) else {
        return Status::INVALID_PARAMETER;
    };
    let mut line = Line::new();
    let plan = choose(&efi, &mut line);
    efi.print(
        line.str("ab-loader: booting slot ")
            .str(plan.slot.name())
            .str(" (")
            .str(plan.reason)
            .str("): ")
            .str(plan.slot.path()),
    );
    for slot in [plan.slot, plan.slot.other()] {
        if slot != plan.slot {
            efi.print(
                line.str("ab-loader: trying slot ")
                    .str(slot.name())
                    .str(": ")
                    .str(slot.path()),
            );
        }
        match efi.start_file(slot.path()) {
            Ok(status) => {
                efi.print(
                    line.str("ab-loader: slot ")
                        .str(slot.name())
                        .str(" returned: ")
                        .status(status),
                );
                return status;
            }
            Err(e) => {
                line.str("ab-loader: slot ")
                    .str(slot.name())
                    .str(" failed: ");
                efi.print(e.describe(&mut line));
            }
        }
    }
    efi.print(line.str("ab-loader: no slot could be started"));
    Status::LOAD_ERROR
}

/// Reads the state file and decides; records a one-time boot first.
fn choose(efi: &Efi, line: &mut Line) -> Plan {
    let volume = match efi.boot_volume() {
        Ok(volume) => volume,
        Err(e) => {
            line.str("ab-loader: cannot open the boot volume, taking slot A: ");
            efi.print(e.describe(line));
            return Plan::choose(Found::Missing);
        }
    };
    let mut buf = [0u8; MAX_STATE_LEN];
    let (found, old_len) = match volume.open(STATE_PATH, Mode::Read) {
        Err(e) if e.status == Status::NOT_FOUND => (Found::Missing, 0),
        Err(e) => {
            line.str("ab-loader: cannot open ")
                .str(STATE_PATH)
                .str(": ");
            efi.print(e.describe(line));
            (Found::Missing, 0)
        }
        Ok(mut file) => match file.read_all(&mut buf) {
            Ok(Some(n)) => (Found::from_bytes(Some(&buf[..n])), n),
            Ok(None) => (Found::from_bytes(None), 0),
            Err(e) => {
                line.str("ab-loader: cannot read ")
                    .str(STATE_PATH)
                    .str(": ");
                efi.print(e.describe(line));
                (Found::Missing, 0)
            }
        },
    };
    let plan = Plan::choose(found);
    let Some(cleared) = plan.rewrite else {
        return plan;
    };
    match rewrite(&volume, cleared, old_len) {
        Ok(()) => {
            efi.print(line.str("ab-loader: next_slot cleared in ").str(STATE_PATH));
            plan
        }
        Err(e) => {
            line.str("ab-loader: cannot clear next_slot, booting the active slot instead: ");
            efi.print(e.describe(line));
            Plan::active(cleared)
        }
    }
}

/// Replaces the state file's content with `data`.
fn rewrite(volume: &Volume<'_>, data: LoaderData, old_len: usize) -> Result<(), Error> {
    let mut buf = [0u8; ENCODED_MAX];
    let bytes = data.encode(&mut buf);
    let mut file = volume.open(STATE_PATH, Mode::ReadWrite)?;
    file.seek(0)?;
    file.write_all(bytes)?;
    if bytes.len() != old_len {
        file.set_len(bytes.len() as u64)?;
    }
    file.flush()?;
    file.close()
}

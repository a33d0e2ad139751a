//! The A/B loader the agent installs as `\EFI\BOOT\BOOTx64.EFI` on the
//! ESP of a Metropolis node: a UEFI program in Rust (`efi/ab-loader`, see
//! efi/README.md) that boots `\EFI\metropolis\boot-a.efi` or `boot-b.efi`
//! as `\EFI\metropolis\loader_state.pb` says.
//!
//! It is built and embedded only with the agent's `loader` feature
//! (`agent/build.rs` runs `efi/build.sh`, which needs Debian's gnu-efi and
//! binutils). An agent built without it has no loader to install, and
//! refuses Metropolis installations with [`LoaderMissing`]'s message.

use std::fmt;

/// Where the loader goes on the ESP, from its root.
pub const ESP_PATH: &str = "EFI/BOOT/BOOTx64.EFI";

/// This agent was built without the A/B loader (without the `loader`
/// feature), so it cannot install Metropolis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderMissing;

impl fmt::Display for LoaderMissing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "this bmaas-agent was built without the A/B loader (the EFI program installed as \
             \\EFI\\BOOT\\BOOTx64.EFI), so it refuses Metropolis installations; build an agent \
             with it: `cargo build --release -p bmaas-agent --features loader` (needs Debian's \
             gnu-efi and binutils: apt-get install gnu-efi binutils)",
        )
    }
}

impl std::error::Error for LoaderMissing {}

#[cfg(feature = "loader")]
static AB_LOADER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/efi/BOOTx64.EFI"));

/// The A/B loader's PE image, to be written to [`ESP_PATH`]; an error
/// saying how to build an agent with it when this one has none.
pub fn ab_loader() -> Result<&'static [u8], LoaderMissing> {
    #[cfg(feature = "loader")]
    {
        Ok(AB_LOADER)
    }
    #[cfg(not(feature = "loader"))]
    {
        Err(LoaderMissing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "loader")]
    #[test]
    fn the_loader_is_an_efi_application() {
        let image = ab_loader().expect("built with the loader feature");
        assert_eq!(&image[..2], b"MZ");
        let pe = u32::from_le_bytes(image[0x3c..0x40].try_into().expect("4 bytes")) as usize;
        assert_eq!(&image[pe..pe + 4], b"PE\0\0");
        // IMAGE_FILE_MACHINE_AMD64, and the EFI application subsystem in
        // the PE32+ optional header.
        assert_eq!(&image[pe + 4..pe + 6], &[0x64, 0x86]);
        assert_eq!(&image[pe + 24..pe + 26], &[0x0b, 0x02]);
        assert_eq!(&image[pe + 24 + 68..pe + 24 + 70], &[10, 0]);
    }

    #[cfg(not(feature = "loader"))]
    #[test]
    fn without_the_loader_the_error_says_how_to_get_it() {
        let e = ab_loader().expect_err("built without the loader feature");
        let text = e.to_string();
        assert!(text.contains("cargo build --release -p bmaas-agent --features loader"));
        assert!(text.contains("gnu-efi"));
        assert!(text.contains("refuses Metropolis installations"));
    }
}

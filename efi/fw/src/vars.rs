//! UEFI variables through the runtime services: reading one
//! ([`Efi::get_variable`]) and setting one ([`Efi::set_variable`]), for
//! the test kernel's check of the boot entry the agent writes.

use core::ffi::c_void;

use r_efi::efi::Guid;

use crate::{Efi, Error, PATH_MAX, Status, check, utf16_path};

/// `EFI_GLOBAL_VARIABLE` (8be4df61-93ca-11d2-aa0d-00e098032b8c): the
/// vendor of `Boot####`, `BootOrder` and `BootCurrent`.
pub const GLOBAL_VARIABLE: Guid = Guid::from_fields(
    0x8be4_df61,
    0x93ca,
    0x11d2,
    0xaa,
    0x0d,
    &[0x00, 0xe0, 0x98, 0x03, 0x2b, 0x8c],
);

impl Efi {
    /// Reads variable `name` of `vendor` into `buf`: its attributes and
    /// length. A missing variable is [`Status::NOT_FOUND`], one longer
    /// than `buf` [`Status::BUFFER_TOO_SMALL`].
    pub fn get_variable(
        &self,
        name: &str,
        vendor: &Guid,
        buf: &mut [u8],
    ) -> Result<(u32, usize), Error> {
        let mut wide = [0u16; PATH_MAX + 1];
        utf16_path(name, &mut wide).ok_or(Error::new("variable name", Status::BAD_BUFFER_SIZE))?;
        let mut vendor = *vendor;
        let mut attributes = 0u32;
        let mut len = buf.len();
        // SAFETY: the runtime services table of a valid system table; a
        // NUL-terminated name, the GUID, and out pointers valid for the
        // call, `len` being `buf`'s length.
        let status = unsafe {
            let rt = &*self.st().runtime_services;
            (rt.get_variable)(
                wide.as_mut_ptr(),
                &mut vendor,
                &mut attributes,
                &mut len,
                buf.as_mut_ptr().cast::<c_void>(),
            )
        };
        check("GetVariable", status)?;
        Ok((attributes, len.min(buf.len())))
    }

    /// Sets variable `name` of `vendor` to `data` with `attributes`.
    pub fn set_variable(
        &self,
        name: &str,
        vendor: &Guid,
        attributes: u32,
        data: &[u8],
    ) -> Result<(), Error> {
        let mut wide = [0u16; PATH_MAX + 1];
        utf16_path(name, &mut wide).ok_or(Error::new("variable name", Status::BAD_BUFFER_SIZE))?;
        let mut vendor = *vendor;
        // SAFETY: as in get_variable; the firmware only reads `data`.
        let status = unsafe {
            let rt = &*self.st().runtime_services;
            (rt.set_variable)(
                wide.as_mut_ptr(),
                &mut vendor,
                attributes,
                data.len(),
                data.as_ptr().cast_mut().cast::<c_void>(),
            )
        };
        check("SetVariable", status)
    }
}

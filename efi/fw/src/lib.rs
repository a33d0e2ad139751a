//! Minimal firmware access for the A/B loader and the test kernel, over
//! [`r_efi`]'s definitions: console lines ([`Line`], [`Efi::print`]),
//! files on the device the program was loaded from ([`Efi::boot_volume`]),
//! starting another program from that device under a file path
//! ([`Efi::start_file`]), the program's own file path
//! ([`Efi::own_file_path`]), UEFI variables ([`vars`]) and powering off
//! ([`Efi::shutdown`]); plus the
//! `loader_state.pb` codec and slot choice ([`state`]), plain Rust tested
//! on the host.
//!
//! Built for the host target (x86_64-unknown-linux-gnu) as part of a
//! staticlib that efi/build.sh links with gnu-efi into a PE image: the
//! program's entry point is `extern "C" fn efi_main(image, system_table)`,
//! called by gnu-efi's crt0 after it has applied the image's relocations;
//! every firmware call is an `extern "efiapi"` function pointer. Nothing
//! here allocates except the device path of [`Efi::start_file`] (from the
//! firmware's pool), and nothing keeps state in statics but the two
//! pointers the panic handler needs (in `.data`: gnu-efi's linker script
//! keeps `.bss` only by that exact name).

#![cfg_attr(not(test), no_std)]

#[cfg(all(not(test), feature = "rt"))]
mod rt;
pub mod state;
pub mod vars;

use core::ffi::c_void;
use core::marker::PhantomData;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, Ordering};

use r_efi::efi::{self, Guid};
pub use r_efi::efi::{Handle, Status, SystemTable};
use r_efi::protocols::{device_path, file, loaded_image, simple_file_system};

/// The longest path [`Efi::start_file`] and [`Volume::open`] take, in
/// characters.
pub const PATH_MAX: usize = 255;

/// The longest device path [`Efi::start_file`] and [`Efi::own_file_path`]
/// walk, in bytes.
const DEVICE_PATH_MAX: usize = 4096;

/// A failed firmware call: which step, and its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    /// What was being done (`"LoadImage"`, `"open \\EFI\\..."`).
    pub step: &'static str,
    /// What the firmware answered.
    pub status: Status,
}

impl Error {
    fn new(step: &'static str, status: Status) -> Error {
        Error { step, status }
    }

    /// Appends `step: status` to `line`.
    pub fn describe<'a>(&self, line: &'a mut Line) -> &'a mut Line {
        line.str(self.step).str(": ").status(self.status)
    }
}

/// `Ok(())` for a status that is not an error (warnings are successes).
fn check(step: &'static str, status: Status) -> Result<(), Error> {
    if status.is_error() {
        Err(Error::new(step, status))
    } else {
        Ok(())
    }
}

// The image handle and system table, for the panic handler. Placed in
// `.data` by name: gnu-efi's linker script gathers `.data*` but `.bss`
// only by its exact name, and a zero-initialised static would go to
// `.bss.<symbol>`.
#[unsafe(link_section = ".data.efi_fw_image")]
static IMAGE: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());
#[unsafe(link_section = ".data.efi_fw_system_table")]
static SYSTEM_TABLE: AtomicPtr<SystemTable> = AtomicPtr::new(ptr::null_mut());

/// The running program: its image handle and the system table.
pub struct Efi {
    image: Handle,
    st: NonNull<SystemTable>,
}

impl Efi {
    /// Takes the arguments of `efi_main`; `None` when the system table is
    /// null.
    ///
    /// # Safety
    ///
    /// `image` and `st` must be the ones the firmware passed to this
    /// program, which must still be in boot services.
    pub unsafe fn new(image: Handle, st: *mut SystemTable) -> Option<Efi> {
        let st = NonNull::new(st)?;
        IMAGE.store(image, Ordering::Relaxed);
        SYSTEM_TABLE.store(st.as_ptr(), Ordering::Relaxed);
        Some(Efi { image, st })
    }

    /// The program as [`Efi::new`] recorded it (for the panic handler).
    pub fn current() -> Option<Efi> {
        let st = NonNull::new(SYSTEM_TABLE.load(Ordering::Relaxed))?;
        Some(Efi {
            image: IMAGE.load(Ordering::Relaxed),
            st,
        })
    }

    fn st(&self) -> &SystemTable {
        // SAFETY: the firmware's system table, valid during boot services
        // (`Efi::new`'s contract).
        unsafe { self.st.as_ref() }
    }

    fn boot(&self) -> &efi::BootServices {
        // SAFETY: the boot services table of a valid system table.
        unsafe { &*self.st().boot_services }
    }

    /// Prints `line` and a line break on the console (ConOut), clearing
    /// it. Nothing happens without a console.
    pub fn print(&self, line: &mut Line) {
        let out = self.st().con_out;
        if out.is_null() {
            line.len = 0;
            return;
        }
        line.buf[line.len] = u16::from(b'\r');
        line.buf[line.len + 1] = u16::from(b'\n');
        line.buf[line.len + 2] = 0;
        // SAFETY: ConOut of the system table; the buffer is NUL-terminated
        // UTF-16 that lives across the call.
        unsafe { ((*out).output_string)(out, line.buf.as_mut_ptr()) };
        line.len = 0;
    }

    /// Leaves the program with `status` (boot services' `Exit`); returns
    /// only if the firmware refuses.
    pub fn exit(&self, status: Status) {
        // SAFETY: our own image handle; no exit data.
        unsafe { (self.boot().exit)(self.image, status, 0, ptr::null_mut()) };
    }

    /// Powers the machine off (`ResetSystem(EfiResetShutdown)`).
    pub fn shutdown(&self) -> ! {
        // SAFETY: the runtime services table of a valid system table;
        // ResetSystem does not return.
        unsafe {
            let rt = &*self.st().runtime_services;
            (rt.reset_system)(efi::RESET_SHUTDOWN, Status::SUCCESS, 0, ptr::null_mut());
        }
        // Firmware that returns anyway: wait to be switched off.
        loop {
            core::hint::spin_loop();
        }
    }

    /// The protocol `guid` of `handle`.
    fn protocol<T>(
        &self,
        handle: Handle,
        guid: &Guid,
        step: &'static str,
    ) -> Result<*mut T, Error> {
        let mut guid = *guid;
        let mut out: *mut c_void = ptr::null_mut();
        // SAFETY: HandleProtocol with a valid GUID and out pointer.
        let status = unsafe { (self.boot().handle_protocol)(handle, &mut guid, &mut out) };
        check(step, status)?;
        if out.is_null() {
            return Err(Error::new(step, Status::NOT_FOUND));
        }
        Ok(out.cast())
    }

    fn loaded_image(&self) -> Result<&loaded_image::Protocol, Error> {
        let li = self.protocol::<loaded_image::Protocol>(
            self.image,
            &loaded_image::PROTOCOL_GUID,
            "LoadedImage",
        )?;
        // SAFETY: the firmware's LoadedImage protocol of our own image,
        // valid while the image runs.
        Ok(unsafe { &*li })
    }

    /// The root directory of the file system of the device this program
    /// was loaded from (LoadedImage's DeviceHandle, SimpleFileSystem).
    pub fn boot_volume(&self) -> Result<Volume<'_>, Error> {
        let device = self.loaded_image()?.device_handle;
        let fs = self.protocol::<simple_file_system::Protocol>(
            device,
            &simple_file_system::PROTOCOL_GUID,
            "SimpleFileSystem",
        )?;
        let mut root: *mut file::Protocol = ptr::null_mut();
        // SAFETY: the device's SimpleFileSystem protocol; out pointer valid.
        let status = unsafe { ((*fs).open_volume)(fs, &mut root) };
        check("OpenVolume", status)?;
        let raw = NonNull::new(root).ok_or(Error::new("OpenVolume", Status::NOT_FOUND))?;
        Ok(Volume {
            root: File {
                raw,
                _efi: PhantomData,
            },
        })
    }

    /// Loads and starts `path` (e.g. `\EFI\metropolis\boot-a.efi`) from
    /// the device this program was loaded from, under that path: its
    /// LoadedImage's FilePath names it. Returns the status the program
    /// exits with when that is a success; a failing LoadImage, or a
    /// StartImage returning an error, is an [`Error`].
    pub fn start_file(&self, path: &str) -> Result<Status, Error> {
        let device = self.loaded_image()?.device_handle;
        let dp = self.protocol::<device_path::Protocol>(
            device,
            &device_path::PROTOCOL_GUID,
            "device's DevicePath",
        )?;
        // SAFETY: the firmware's device path of the device, a sequence of
        // nodes ending in an end node.
        let device_len = unsafe { device_path_len(dp.cast()) }
            .ok_or(Error::new("device's DevicePath", Status::VOLUME_CORRUPTED))?;
        let mut name = [0u16; PATH_MAX + 1];
        let chars =
            utf16_path(path, &mut name).ok_or(Error::new("path", Status::BAD_BUFFER_SIZE))?;
        // The file-path node: header and the NUL-terminated name.
        let node_len = 4 + 2 * (chars + 1);
        let total = device_len + node_len + 4;
        let buf = Pool::allocate(self, total)?;
        // SAFETY: buf holds `total` bytes; dp holds `device_len` bytes
        // before its end node; the writes below stay within `total`.
        unsafe {
            let out = buf.ptr;
            ptr::copy_nonoverlapping(dp.cast::<u8>(), out, device_len);
            let node = out.add(device_len);
            node.write(device_path::TYPE_MEDIA);
            node.add(1).write(device_path::Media::SUBTYPE_FILE_PATH);
            let len = (node_len as u16).to_le_bytes();
            node.add(2).write(len[0]);
            node.add(3).write(len[1]);
            for (i, unit) in name[..=chars].iter().enumerate() {
                let b = unit.to_le_bytes();
                node.add(4 + 2 * i).write(b[0]);
                node.add(5 + 2 * i).write(b[1]);
            }
            let end = node.add(node_len);
            end.write(device_path::TYPE_END);
            end.add(1).write(device_path::End::SUBTYPE_ENTIRE);
            end.add(2).write(4);
            end.add(3).write(0);
        }
        let mut child: Handle = ptr::null_mut();
        // SAFETY: LoadImage from a complete device path (no source
        // buffer), our image as the parent; out handle valid.
        let status = unsafe {
            (self.boot().load_image)(
                efi::Boolean::FALSE,
                self.image,
                buf.ptr.cast(),
                ptr::null_mut(),
                0,
                &mut child,
            )
        };
        drop(buf);
        if status.is_error() {
            if !child.is_null() {
                // A refused image (e.g. SECURITY_VIOLATION) may still
                // have been loaded.
                // SAFETY: the handle LoadImage returned.
                unsafe { (self.boot().unload_image)(child) };
            }
            return Err(Error::new("LoadImage", status));
        }
        let mut exit_size = 0usize;
        // SAFETY: the image just loaded; exit data not wanted.
        let status = unsafe { (self.boot().start_image)(child, &mut exit_size, ptr::null_mut()) };
        check("StartImage", status)?;
        Ok(status)
    }

    /// This program's file path (the file-path nodes of its LoadedImage's
    /// FilePath, joined) as ASCII in `buf` (other characters as `?`).
    pub fn own_file_path<'b>(&self, buf: &'b mut [u8]) -> Result<&'b str, Error> {
        let fp = self.loaded_image()?.file_path;
        let step = "LoadedImage FilePath";
        if fp.is_null() {
            return Err(Error::new(step, Status::NOT_FOUND));
        }
        let mut node = fp.cast::<u8>().cast_const();
        let mut len = 0usize;
        let mut walked = 0usize;
        loop {
            // SAFETY: a node header of the firmware's device path (the
            // walk stops at the end node and is bounded by walked).
            let (kind, sub, node_len) = unsafe { node_header(node) };
            if node_len < 4 || walked + node_len > DEVICE_PATH_MAX {
                return Err(Error::new(step, Status::VOLUME_CORRUPTED));
            }
            if kind == device_path::TYPE_END {
                break;
            }
            if kind == device_path::TYPE_MEDIA && sub == device_path::Media::SUBTYPE_FILE_PATH {
                let units = (node_len - 4) / 2;
                let mut first = true;
                for i in 0..units {
                    // SAFETY: within the node's length.
                    let unit = unsafe {
                        u16::from_le_bytes([node.add(4 + 2 * i).read(), node.add(5 + 2 * i).read()])
                    };
                    if unit == 0 {
                        break;
                    }
                    // Join components given as separate nodes.
                    if first && len > 0 && buf[len - 1] != b'\\' && unit != u16::from(b'\\') {
                        if len == buf.len() {
                            return Err(Error::new(step, Status::BUFFER_TOO_SMALL));
                        }
                        buf[len] = b'\\';
                        len += 1;
                    }
                    first = false;
                    if len == buf.len() {
                        return Err(Error::new(step, Status::BUFFER_TOO_SMALL));
                    }
                    buf[len] = if (0x20..0x7f).contains(&unit) {
                        unit as u8
                    } else {
                        b'?'
                    };
                    len += 1;
                }
            }
            walked += node_len;
            // SAFETY: the next node, within the device path.
            node = unsafe { node.add(node_len) };
        }
        // SAFETY: only printable ASCII bytes were written.
        Ok(unsafe { core::str::from_utf8_unchecked(&buf[..len]) })
    }
}

/// A device path node's type, subtype and length.
///
/// # Safety
///
/// `node` points at a readable four-byte node header.
unsafe fn node_header(node: *const u8) -> (u8, u8, usize) {
    // SAFETY: the caller's contract.
    unsafe {
        (
            node.read(),
            node.add(1).read(),
            usize::from(u16::from_le_bytes([node.add(2).read(), node.add(3).read()])),
        )
    }
}

/// The length of a device path without its end node; `None` when a node
/// is shorter than its header or the path exceeds [`DEVICE_PATH_MAX`].
///
/// # Safety
///
/// `dp` points at a device path: nodes up to an end node.
unsafe fn device_path_len(dp: *const u8) -> Option<usize> {
    let mut len = 0;
    loop {
        // SAFETY: within the device path (the caller's contract).
        let (kind, sub, node_len) = unsafe { node_header(dp.add(len)) };
        if kind == device_path::TYPE_END && sub == device_path::End::SUBTYPE_ENTIRE {
            return Some(len);
        }
        if node_len < 4 || len + node_len > DEVICE_PATH_MAX {
            return None;
        }
        len += node_len;
    }
}

/// `path` as NUL-terminated UTF-16 in `out`; the number of characters, or
/// `None` when it is too long or not ASCII.
fn utf16_path(path: &str, out: &mut [u16; PATH_MAX + 1]) -> Option<usize> {
    let bytes = path.as_bytes();
    if bytes.len() > PATH_MAX {
        return None;
    }
    for (i, &b) in bytes.iter().enumerate() {
        if !b.is_ascii() || b == 0 {
            return None;
        }
        out[i] = u16::from(b);
    }
    out[bytes.len()] = 0;
    Some(bytes.len())
}

/// Memory from the firmware's pool, given back when dropped.
struct Pool<'a> {
    efi: &'a Efi,
    ptr: *mut u8,
}

impl<'a> Pool<'a> {
    fn allocate(efi: &'a Efi, size: usize) -> Result<Pool<'a>, Error> {
        let mut out: *mut c_void = ptr::null_mut();
        // SAFETY: AllocatePool with a valid out pointer.
        let status = unsafe { (efi.boot().allocate_pool)(efi::LOADER_DATA, size, &mut out) };
        check("AllocatePool", status)?;
        if out.is_null() {
            return Err(Error::new("AllocatePool", Status::OUT_OF_RESOURCES));
        }
        Ok(Pool {
            efi,
            ptr: out.cast(),
        })
    }
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        // SAFETY: memory AllocatePool returned, freed once.
        unsafe { (self.efi.boot().free_pool)(self.ptr.cast()) };
    }
}

/// How [`Volume::open`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// An existing file, for reading.
    Read,
    /// An existing file, for reading and writing.
    ReadWrite,
}

/// The root directory of a file system.
pub struct Volume<'a> {
    root: File<'a>,
}

impl<'a> Volume<'a> {
    /// Opens the existing file at `path` (backslashes, from the root).
    pub fn open(&self, path: &str, mode: Mode) -> Result<File<'a>, Error> {
        let mut name = [0u16; PATH_MAX + 1];
        utf16_path(path, &mut name).ok_or(Error::new("open", Status::BAD_BUFFER_SIZE))?;
        let mode = match mode {
            Mode::Read => file::MODE_READ,
            Mode::ReadWrite => file::MODE_READ | file::MODE_WRITE,
        };
        let mut out: *mut file::Protocol = ptr::null_mut();
        let root = self.root.raw.as_ptr();
        // SAFETY: an open directory handle; NUL-terminated name; out
        // pointer valid.
        let status = unsafe { ((*root).open)(root, &mut out, name.as_mut_ptr(), mode, 0) };
        check("open", status)?;
        let raw = NonNull::new(out).ok_or(Error::new("open", Status::NOT_FOUND))?;
        Ok(File {
            raw,
            _efi: PhantomData,
        })
    }
}

/// An open file (or directory), closed when dropped.
pub struct File<'a> {
    raw: NonNull<file::Protocol>,
    _efi: PhantomData<&'a Efi>,
}

impl File<'_> {
    fn call(&self) -> (&file::Protocol, *mut file::Protocol) {
        // SAFETY: a handle the firmware opened and that is not closed yet.
        (unsafe { self.raw.as_ref() }, self.raw.as_ptr())
    }

    /// Reads into `buf` from the current position; the number of bytes
    /// read, 0 at the end of the file.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        let (f, this) = self.call();
        let mut size = buf.len();
        // SAFETY: buf is writable for size bytes.
        let status = unsafe { (f.read)(this, &mut size, buf.as_mut_ptr().cast()) };
        check("Read", status)?;
        Ok(size.min(buf.len()))
    }

    /// Reads the rest of the file into `buf`: its length, or `None` when
    /// it does not fit.
    pub fn read_all(&mut self, buf: &mut [u8]) -> Result<Option<usize>, Error> {
        let mut len = 0;
        while len < buf.len() {
            let n = self.read(&mut buf[len..])?;
            if n == 0 {
                return Ok(Some(len));
            }
            len += n;
        }
        let mut probe = [0u8; 1];
        Ok(if self.read(&mut probe)? == 0 {
            Some(len)
        } else {
            None
        })
    }

    /// Writes all of `bytes` at the current position.
    pub fn write_all(&mut self, mut bytes: &[u8]) -> Result<(), Error> {
        while !bytes.is_empty() {
            let (f, this) = self.call();
            let mut size = bytes.len();
            // SAFETY: bytes is readable for size bytes; Write only reads it.
            let status = unsafe { (f.write)(this, &mut size, bytes.as_ptr().cast_mut().cast()) };
            check("Write", status)?;
            if size == 0 || size > bytes.len() {
                return Err(Error::new("Write", Status::DEVICE_ERROR));
            }
            bytes = &bytes[size..];
        }
        Ok(())
    }

    /// Moves the position to `pos`.
    pub fn seek(&mut self, pos: u64) -> Result<(), Error> {
        let (f, this) = self.call();
        // SAFETY: an open file handle.
        check("SetPosition", unsafe { (f.set_position)(this, pos) })
    }

    /// Sets the file's length (GetInfo, then SetInfo with the new size).
    pub fn set_len(&mut self, len: u64) -> Result<(), Error> {
        // EFI_FILE_INFO with room for a long name, 8-byte aligned.
        let mut info = [0u64; 128];
        let mut size = core::mem::size_of_val(&info);
        let mut guid = file::INFO_ID;
        let (f, this) = self.call();
        // SAFETY: info is writable for size bytes.
        let status = unsafe { (f.get_info)(this, &mut guid, &mut size, info.as_mut_ptr().cast()) };
        check("GetInfo", status)?;
        if size < core::mem::size_of::<file::Info>() || size > core::mem::size_of_val(&info) {
            return Err(Error::new("GetInfo", Status::BAD_BUFFER_SIZE));
        }
        let info_ptr = info.as_mut_ptr().cast::<file::Info>();
        // SAFETY: GetInfo filled an EFI_FILE_INFO of `size` bytes into the
        // aligned buffer; SetInfo reads it back with the new size.
        let status = unsafe {
            (*info_ptr).file_size = len;
            (f.set_info)(this, &mut guid, size, info_ptr.cast())
        };
        check("SetInfo", status)
    }

    /// Writes what is buffered to the device.
    pub fn flush(&mut self) -> Result<(), Error> {
        let (f, this) = self.call();
        // SAFETY: an open file handle.
        check("Flush", unsafe { (f.flush)(this) })
    }

    /// Closes the file, returning the firmware's answer (Close always
    /// closes; a FAT driver reports a failed write-back here).
    pub fn close(self) -> Result<(), Error> {
        let this = self.raw.as_ptr();
        core::mem::forget(self);
        // SAFETY: the handle is closed once: `self` was forgotten.
        check("Close", unsafe { ((*this).close)(this) })
    }
}

impl Drop for File<'_> {
    fn drop(&mut self) {
        let (f, this) = self.call();
        // SAFETY: the handle is closed once, here.
        unsafe { (f.close)(this) };
    }
}

/// The longest [`Line`], in characters.
pub const LINE_MAX: usize = 240;

/// A console line being put together (ASCII; longer lines are cut).
pub struct Line {
    buf: [u16; LINE_MAX + 3],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line::new()
    }
}

impl Line {
    /// An empty line.
    pub fn new() -> Line {
        Line {
            buf: [0; LINE_MAX + 3],
            len: 0,
        }
    }

    fn push(&mut self, unit: u16) {
        if self.len < LINE_MAX {
            self.buf[self.len] = unit;
            self.len += 1;
        }
    }

    /// Appends `s` (characters outside the basic plane as `?`).
    pub fn str(&mut self, s: &str) -> &mut Line {
        for c in s.chars() {
            let unit = u16::try_from(u32::from(c)).unwrap_or(u16::from(b'?'));
            self.push(unit);
        }
        self
    }

    /// Appends `value` in decimal.
    pub fn dec(&mut self, mut value: u64) -> &mut Line {
        let mut digits = [0u8; 20];
        let mut n = 0;
        loop {
            digits[n] = b'0' + (value % 10) as u8;
            n += 1;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        while n > 0 {
            n -= 1;
            self.push(u16::from(digits[n]));
        }
        self
    }

    /// Appends `bytes` in lowercase hex, two digits each.
    pub fn hex(&mut self, bytes: &[u8]) -> &mut Line {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for b in bytes {
            self.push(u16::from(DIGITS[usize::from(b >> 4)]));
            self.push(u16::from(DIGITS[usize::from(b & 15)]));
        }
        self
    }

    /// Appends a status: its name for the usual ones, else its value.
    pub fn status(&mut self, status: Status) -> &mut Line {
        let name = match status {
            Status::SUCCESS => "Success",
            Status::LOAD_ERROR => "Load Error",
            Status::INVALID_PARAMETER => "Invalid Parameter",
            Status::UNSUPPORTED => "Unsupported",
            Status::BAD_BUFFER_SIZE => "Bad Buffer Size",
            Status::BUFFER_TOO_SMALL => "Buffer Too Small",
            Status::DEVICE_ERROR => "Device Error",
            Status::WRITE_PROTECTED => "Write Protected",
            Status::OUT_OF_RESOURCES => "Out of Resources",
            Status::VOLUME_CORRUPTED => "Volume Corrupt",
            Status::VOLUME_FULL => "Volume Full",
            Status::NO_MEDIA => "No Media",
            Status::NOT_FOUND => "Not Found",
            Status::ACCESS_DENIED => "Access Denied",
            Status::ABORTED => "Aborted",
            Status::SECURITY_VIOLATION => "Security Violation",
            _ => {
                return self
                    .str("status 0x")
                    .hex(&(status.as_usize() as u64).to_be_bytes());
            }
        };
        self.str(name)
    }
}

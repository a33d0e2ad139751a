//! What a freestanding program needs besides the firmware: the memory
//! functions the compiler calls (`memcpy`, `memmove`, `memset`, `memcmp`,
//! `bcmp`), which the host target expects from a C library that is not
//! there, and the panic handler.
//!
//! The memory functions are written with `rep movsb` / `rep stosb` and a
//! volatile loop, so that the optimiser cannot turn them back into calls
//! to themselves. Neither they nor anything else here touches memory below
//! the stack pointer (the red zone: see README.md).

use core::arch::asm;

/// `memcpy`, for the calls the compiler emits.
///
/// # Safety
///
/// `dest` and `src` valid for `n` bytes and not overlapping.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract; `rep movsb` copies rcx bytes from
    // [rsi] to [rdi] upwards (the direction flag is clear on entry, as the
    // ABI requires) and touches nothing else.
    unsafe {
        asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
    dest
}

/// `memmove`, for the calls the compiler emits.
///
/// # Safety
///
/// `dest` and `src` valid for `n` bytes; they may overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize).wrapping_sub(src as usize) >= n {
        // dest is below src, or past its end: copying upwards never reads
        // a byte already written.
        // SAFETY: as memcpy's, the caller's contract.
        unsafe { memcpy(dest, src, n) };
    } else if n > 0 {
        // SAFETY: the caller's contract; with the direction flag set `rep
        // movsb` copies downwards from the last byte, which is safe when
        // dest overlaps the end of src; the flag is cleared again at once.
        unsafe {
            asm!(
                "std",
                "rep movsb",
                "cld",
                inout("rcx") n => _,
                inout("rdi") dest.add(n - 1) => _,
                inout("rsi") src.add(n - 1) => _,
                options(nostack)
            );
        }
    }
    dest
}

/// `memset`, for the calls the compiler emits.
///
/// # Safety
///
/// `dest` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dest: *mut u8, value: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract; `rep stosb` stores al at [rdi] rcx
    // times, upwards.
    unsafe {
        asm!(
            "rep stosb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            in("al") value as u8,
            options(nostack, preserves_flags)
        );
    }
    dest
}

/// `memcmp`, for the calls the compiler emits.
///
/// # Safety
///
/// `a` and `b` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: i < n, within what the caller vouches for; volatile so
        // that the loop is not recognised as a memcmp and replaced by a
        // call to this very function.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// `bcmp`, for the calls the compiler emits (equality only).
///
/// # Safety
///
/// `a` and `b` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the same contract.
    unsafe { memcmp(a, b, n) }
}

/// The unwinding personality routine the host target's precompiled `core`
/// refers to (its unwind tables name it). Nothing unwinds here: the
/// programs are built with panic=abort and have no unwinder, so this is
/// never called.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    if let Some(efi) = crate::Efi::current() {
        let mut line = crate::Line::new();
        line.str("panic");
        if let Some(at) = info.location() {
            line.str(" at ")
                .str(at.file())
                .str(":")
                .dec(u64::from(at.line()));
        }
        efi.print(&mut line);
        efi.exit(r_efi::efi::Status::ABORTED);
    }
    loop {
        // SAFETY: halts the processor until the next interrupt; nothing
        // else to do without a system table.
        unsafe { asm!("hlt", options(nomem, nostack)) };
    }
}

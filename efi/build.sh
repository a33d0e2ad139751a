#!/usr/bin/env bash
# Builds the UEFI programs of efi/ as PE images:
#
#   efi/build.sh OUT_DIR   ->  OUT_DIR/BOOTx64.EFI       (the A/B loader)
#                              OUT_DIR/test-kernel.efi   (for tests)
#
# The crates are staticlibs for the host target (x86_64-unknown-linux-gnu,
# position-independent, no red zone, panic=abort), linked with Debian's
# gnu-efi (its crt0 self-relocates the image and calls efi_main) into a
# shared object, which objcopy turns into an EFI application. See
# efi/README.md. Cargo builds into OUT_DIR/target, or EFI_TARGET_DIR when
# set, never the caller's target directory.
#
# Needs: cargo and rustc; Debian's gnu-efi (crt0, linker script, libgnuefi:
# GNUEFI_LIB, default /usr/lib) and binutils (ld, objcopy, objdump, readelf).
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
lib=${GNUEFI_LIB:-/usr/lib}
target=x86_64-unknown-linux-gnu

if [[ $(uname -m) != x86_64 ]]; then
    echo "efi/build.sh: builds x86_64 UEFI programs on an x86_64 host only (this is $(uname -m))" >&2
    exit 1
fi
missing=()
for f in crt0-efi-x86_64.o elf_x86_64_efi.lds libgnuefi.a; do
    if [[ ! -f $lib/$f ]]; then
        missing+=("gnu-efi ($lib/$f)")
        break
    fi
done
for tool in ld objcopy objdump readelf; do
    if ! command -v "$tool" >/dev/null; then
        missing+=("binutils ($tool)")
        break
    fi
done
cargo=${CARGO:-cargo}
if ! command -v "$cargo" >/dev/null; then
    missing+=("the Rust toolchain (cargo)")
fi
if [[ ${#missing[@]} -gt 0 ]]; then
    {
        echo "efi/build.sh: cannot build the UEFI programs, missing: ${missing[*]}"
        echo "  on Debian: apt-get install gnu-efi binutils"
    } >&2
    exit 1
fi

# Run from a cargo build script (the agent's `loader` feature), the outer
# build's settings are in the environment: its flags, target, target
# directory and clippy wrapper must not leak into this build.
unset RUSTFLAGS CARGO_BUILD_RUSTFLAGS CARGO_BUILD_TARGET CARGO_TARGET_DIR \
    CARGO_BUILD_TARGET_DIR RUSTC_WORKSPACE_WRAPPER
export CARGO_TARGET_DIR=${EFI_TARGET_DIR:-$out/target}
# -C no-redzone: firmware interrupts run on the program's stack, so
# nothing may live below the stack pointer (checked on the result below).
# The profile sets panic=abort. Separator: 0x1f.
export CARGO_ENCODED_RUSTFLAGS=$'-Crelocation-model=pic\x1f-Cno-redzone=yes\x1f-Cforce-unwind-tables=no'

"$cargo" build --release --locked --manifest-path "$here/Cargo.toml" \
    --target "$target" -p ab-loader -p test-kernel >&2

built=$CARGO_TARGET_DIR/$target/release
link() {
    local archive=$1 name=$2
    # Temporary names, renamed at the end: a concurrent run into the same
    # OUT_DIR never sees a half-written image.
    local so=$out/.${name%.*}.$$.so efi=$out/$name
    ld -nostdlib -znocombreloc -shared -Bsymbolic --no-undefined \
        -T "$lib/elf_x86_64_efi.lds" "$lib/crt0-efi-x86_64.o" "$archive" \
        -L"$lib" -lgnuefi -o "$so"

    # gnu-efi's self-relocation applies R_X86_64_RELATIVE only.
    local relocs
    relocs=$(readelf -rW "$so" | awk '/^[0-9a-f]+ +[0-9a-f]+ +R_X86_64_/ {print $3}' |
        sort -u | grep -vx -e R_X86_64_RELATIVE -e R_X86_64_NONE || true)
    if [[ -n $relocs ]]; then
        echo "efi/build.sh: $name: relocations gnu-efi cannot apply: $relocs" >&2
        exit 1
    fi
    # ... and each one patches a section the PE image keeps.
    local ranges=() sec kind addr off size rest
    while read -r sec kind addr off size rest; do
        case $sec in
        .text | .data | .sdata | .rodata | .dynamic | .rela)
            ranges+=("$((16#$addr)) $((16#$addr + 16#$size))")
            ;;
        esac
    done < <(readelf -SW "$so" | sed -n 's/^ *\[ *[0-9]*\] //p')
    local stray="" at lo hi ok
    while read -r at; do
        ok=""
        for r in "${ranges[@]}"; do
            read -r lo hi <<<"$r"
            if ((16#$at >= lo && 16#$at + 8 <= hi)); then
                ok=1
                break
            fi
        done
        [[ -n $ok ]] || stray+=" $at"
    done < <(readelf -rW "$so" | awk '/R_X86_64_RELATIVE/ {print $1}')
    if [[ -n $stray ]]; then
        echo "efi/build.sh: $name: relocations outside the kept sections, at: $stray" >&2
        exit 1
    fi
    # Every allocated section must be one objcopy keeps below (or one not
    # needed at run time): a `.bss.*` or `.tbss` would be lost.
    local sections
    sections=$(objdump -hw "$so" | awk '$2 ~ /^\./ && /ALLOC/ {print $2}' |
        grep -vx -e .text -e .data -e .sdata -e .rodata -e .dynamic -e .dynsym \
            -e '\.rela\?\(\..*\)\?' -e .reloc \
            -e .hash -e .gnu.hash -e .eh_frame -e .dynstr -e .note.gnu.build-id \
            -e .ignored.reloc || true)
    if [[ -n $sections ]]; then
        echo "efi/build.sh: $name: sections the PE image would lose: $sections" >&2
        exit 1
    fi
    # No red zone: no access below the stack pointer (lea only computes).
    local below
    below=$(objdump -d --no-show-raw-insn "$so" |
        grep -E -- '-0x[0-9a-f]+\(%rsp\)' | grep -vE '^\s*[0-9a-f]+:\s+lea ' || true)
    if [[ -n $below ]]; then
        echo "efi/build.sh: $name: code uses the red zone (below %rsp):" >&2
        echo "$below" | head -20 >&2
        exit 1
    fi

    objcopy -j .text -j .sdata -j .data -j .rodata -j .dynamic -j .dynsym \
        -j .rel -j .rela -j '.rel.*' -j '.rela.*' -j .reloc \
        --target efi-app-x86_64 "$so" "$efi.$$.tmp"
    if ! objdump -h "$efi.$$.tmp" | grep -qE '^ +[0-9]+ \.reloc '; then
        echo "efi/build.sh: $name: the PE image has no .reloc section" >&2
        exit 1
    fi
    mv -f "$efi.$$.tmp" "$efi"
    [[ -n ${EFI_KEEP_SO:-} ]] || rm -f "$so"
}

link "$built/libab_loader.a" BOOTx64.EFI
link "$built/libtest_kernel.a" test-kernel.efi
echo "efi/build.sh: built $out/BOOTx64.EFI and $out/test-kernel.efi" >&2

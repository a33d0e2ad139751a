//! The host side of the provisioning agent (docs/spec/semantics.md, "The agent
//! (client side)"): what it needs from the machine it runs on.
//!
//! - [`hardware`] gathers the hardware report from `/proc`, `/sys` and
//!   DMI, with a warning for each part it could not read.
//! - [`install`] installs an OS image from an OCI registry onto the root
//!   device, behind the [`install::Installer`] trait.
//!
//! Everything here is plain blocking `std` code: reading sysfs and
//! writing a disk image are blocking file I/O on every runtime anyway
//! (neither tokio nor smol has asynchronous file I/O; both push it to a
//! thread), and an installation is one long sequential transfer, so it
//! gains nothing from an event loop. The runtimes call these functions on
//! a dedicated thread (`spawn_blocking`, `smol::unblock`, or
//! `std::thread::spawn` plus a channel), which keeps this crate free of
//! any runtime.

pub mod hardware;
pub mod install;

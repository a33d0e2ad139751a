//! A cluster of real processes that faults can be injected into, shared by
//! the fault campaign (`metropolis-chaos`) and the failover benchmark
//! (`metropolis-load failover`): three etcd members and three elected
//! curators, each on a loopback address and with a socket group of its
//! own ([`cluster`]); cuts between them as nftables rules ([`nft`]);
//! curators' data directories on small tmpfs mounts ([`disk`]) and their
//! wall clocks through libfaketime ([`clock`]); nodes and machines
//! enrolled as the owner ([`enroll`]); and the registry of what
//! was changed on the machine, undone however the program ends
//! ([`cleanup`]). Needs root, nftables, etcd and libfaketime.

pub mod cleanup;
pub mod clock;
pub mod cluster;
pub mod disk;
pub mod enroll;
pub mod nft;

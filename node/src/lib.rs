//! A Metropolis node assembled from its parts.
//!
//! - [`daemon`]: the daemon's configuration ([`Config`](daemon::Config),
//!   its flags; [`settings`]: from flags, the environment and a file), its PKI, and [`NodeServices`](daemon::NodeServices): the
//!   services of `metropolis-core` wired to their host ports.
//! - [`serving`]: the node's listeners started on a runtime and the
//!   daemon's run loop; [`notify`], its readiness and watchdog for
//!   systemd.
//! - [`exit`]: the programs' exit statuses and their fatal error,
//!   reported once in the log format.
//! - [`cluster`], [`join`], [`etcd_access`]: curators elected over etcd,
//!   joining a cluster, reaching etcd.
//! - The host ports of the debug service and the daemon's own logs:
//!   [`images`] (containerd or an OCI layout), [`tracefs`], [`logs`];
//!   the Prometheus registry ([`metrics`]);
//!   and the process [`clock`].
//!
//! Nothing here names an async runtime; blocking work runs on dedicated
//! threads.

pub mod clock;
pub mod cluster;
pub mod daemon;
pub mod etcd_access;
pub mod exit;
pub mod images;
pub mod join;
pub mod logs;
pub mod metrics;
pub mod notify;
pub mod serving;
pub mod settings;
pub mod tracefs;

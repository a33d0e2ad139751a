//! Sans-IO state machines of the Metropolis control plane, and the ports
//! their drivers reach the world through. The gRPC service layer built on
//! them is `metropolis-service`; this crate names no gRPC, HTTP,
//! reflection or metrics crate.
//!
//! Every machine here is a plain struct driven by its owner: inputs through
//! `handle_*` methods (with the current [`time::Instant`] when time
//! matters), outputs through `poll_*` methods. No machine reads a clock, a
//! socket, a file, the environment or a global random number generator, so
//! the same inputs always give the same outputs. Runtimes (tokio, smol) and
//! the simulator drive them through the [`ports`].

#![forbid(unsafe_code)]

pub mod agent_cert;
#[cfg(feature = "canary")]
pub mod canary;
pub mod cause;

/// Whether the simulator planted the canary `$name` on this thread:
/// always `false` without the `canary` feature, so production code asks
/// the same way whether or not it is compiled.
macro_rules! canary_planted {
    ($name:ident) => {{
        #[cfg(feature = "canary")]
        let planted = crate::canary::planted(crate::canary::Canary::$name);
        #[cfg(not(feature = "canary"))]
        let planted = false;
        planted
    }};
}
pub(crate) use canary_planted;
pub mod curator;
pub mod hex;
pub mod identity;
pub mod leadership;
pub mod logtree;
pub mod ports;
pub mod provisioning;
pub mod quote;
pub mod store;
pub mod time;
pub mod trace;
pub mod watch;

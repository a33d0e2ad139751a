//! Leader election over etcd: core's
//! [`election`](metropolis_service::elected::election) (the recipe
//! of etcd's `concurrency` package and the fence, written once over the
//! store port), over [`EtcdStore`](super::EtcdStore).

pub use metropolis_service::elected::election::{
    Election, FencedResponse, Leader, Observation, election_prefix, fence, fence_check,
};

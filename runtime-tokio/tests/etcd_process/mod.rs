//! The etcd test helper, shared with the end-to-end tests.

#[path = "../../../tests/src/etcd.rs"]
mod etcd;

pub use etcd::Etcd;

//! Running as one curator instance of several over etcd: the daemon's
//! flags for it, and what a runtime hands to
//! [`NodeServices::prepare_elected`](crate::daemon::NodeServices::prepare_elected).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metropolis_core::identity::NodeId;
use metropolis_core::leadership::{DEFAULT_LEASE_TTL, LeadershipConfig};
use metropolis_core::ports::KvStore;
use metropolis_service::GroupCommitOptions;
use metropolis_service::elected::SharedLeadership;
use metropolis_service::metrics::Metrics;

use futures::future::BoxFuture;

use crate::daemon::{Config, DaemonError, NodePki};
use crate::etcd_access::{EtcdAccess, EtcdAccessFlags, EtcdUserArg};
use metropolis_transport::upstream::Dial;

/// The etcd key prefix under which curator instances campaign.
pub const DEFAULT_ELECTION_PREFIX: &str = "/metropolis/curator/leader/";

/// `metropolisd` flags of an elected instance.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClusterFlags {
    /// etcd endpoints (comma-separated or repeated), e.g.
    /// http://10.0.0.1:2379 (https:// with --etcd-cacert; see also
    /// --etcd-user): keep the cluster's state in etcd and run as one
    /// of several curator instances, one of which is elected leader and
    /// serves while the others forward every call to it. Without it the
    /// embedded store under --data-dir is used and this instance serves
    /// alone. Needs a daemon built with the `etcd` feature.
    #[arg(long, value_name = "URL[,URL...]", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// The curator address (HOST:PORT of --listen) other instances reach
    /// this one at; it is published in the election value while this
    /// instance leads. Default with --etcd: the --listen address, unless it
    /// is a wildcard (0.0.0.0 or ::), which needs this flag.
    #[arg(long, value_name = "HOST:PORT", requires = "etcd")]
    pub advertise: Option<String>,
    /// TTL of each instance's etcd lease (the reference node runs its
    /// curator with 5 s): a leader that stops renewing it (crashed,
    /// paused, cut off) is replaced about this long after, and its writes
    /// are refused from then on; a leader that stops gracefully revokes it
    /// and is replaced at once. Renewed every third of the TTL. Shorter
    /// means faster failover but more renewals, and a leader lost to a
    /// shorter stall (a pause, a slow disk, a cut from etcd).
    #[arg(long, default_value_t = DEFAULT_LEASE_TTL.as_secs(), value_name = "SECONDS")]
    pub lease_ttl: u64,
    /// How long a call waits for a leader to be elected (its own deadline
    /// may end the wait sooner) before failing Unavailable ("no curator
    /// leader").
    #[arg(long, default_value = "10", value_name = "SECONDS")]
    pub leader_wait: u64,
    /// Longest wait for an answer from etcd to any request (connecting
    /// included); a call whose store request gets none fails Unavailable,
    /// naming the etcd endpoints.
    #[arg(long, default_value = "5", value_name = "SECONDS")]
    pub etcd_request_timeout: u64,
    /// The etcd key prefix under which curator instances campaign (the
    /// same for every instance of one cluster).
    #[arg(long, default_value = DEFAULT_ELECTION_PREFIX, value_name = "PREFIX")]
    pub election_prefix: String,
    /// The CA certificate(s) (PEM) that signed etcd's server certificates,
    /// as etcdctl's --cacert: talk TLS to etcd, trusting only these (not
    /// the system's roots). Every --etcd URL must then be https://.
    #[arg(long, value_name = "FILE", requires = "etcd")]
    pub etcd_cacert: Option<PathBuf>,
    /// This instance's client certificate (PEM; the certificate, then any
    /// intermediates) for an etcd run with --client-cert-auth, as
    /// etcdctl's --cert; needs --etcd-key and --etcd-cacert. With etcd's
    /// authentication on and no --etcd-user, etcd takes the certificate's
    /// common name as the user name.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_key", "etcd_cacert"])]
    pub etcd_cert: Option<PathBuf>,
    /// The private key of --etcd-cert (PEM: PKCS#8, PKCS#1 RSA or SEC1
    /// EC), as etcdctl's --key.
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// The etcd user to authenticate as (etcd's `auth enable`), as
    /// etcdctl's --user: USER:PASSWORD, or USER with the password in
    /// --etcd-password-file (a password on the command line is visible to
    /// every local user in ps). etcd's token is renewed whenever etcd
    /// says it expired. The user's roles need readwrite on the prefixes
    /// /nodes/, /machines/, /cluster/ and --election-prefix.
    #[arg(long, value_name = "USER[:PASSWORD]", requires = "etcd")]
    pub etcd_user: Option<EtcdUserArg>,
    /// A file holding the password of --etcd-user (the whole file less one
    /// trailing newline; mode 0600), e.g. a systemd credential or a
    /// mounted secret: it stays out of the command line and of the
    /// environment, which the daemon's child processes inherit.
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
    /// Join an existing cluster with the join bundle in DIR (written by
    /// `metroctl node add --curator --out DIR` on a host of an existing
    /// instance): its cluster CA is installed into an empty --data-dir at
    /// the first start. Every instance of a cluster must hold the same CA;
    /// one with another refuses to start. Delete the bundle once joined:
    /// it holds the CA key.
    #[arg(long, value_name = "DIR", requires = "etcd")]
    pub join: Option<PathBuf>,
    /// Transactions the leader keeps outstanding at etcd at most. Updates
    /// of different records that arrive while that many are outstanding
    /// leave together as one fenced transaction once one is answered
    /// (docs/design.md, "Group commit"); 1 sends one at a time.
    #[arg(long, default_value_t = GroupCommitOptions::default().in_flight as u16, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..))]
    pub etcd_txns_in_flight: u16,
    /// Writes (and compares) of one grouped transaction at most: no more
    /// than etcd's --max-txn-ops (128 unless etcd was started with
    /// another), or etcd refuses the group.
    #[arg(long, default_value_t = GroupCommitOptions::default().max_ops as u16,
          value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub etcd_max_txn_ops: u16,
}

impl ClusterFlags {
    /// How the leader groups its transactions to etcd.
    pub fn group_commit(&self) -> GroupCommitOptions {
        GroupCommitOptions {
            in_flight: usize::from(self.etcd_txns_in_flight),
            max_ops: usize::from(self.etcd_max_txn_ops),
            ..GroupCommitOptions::default()
        }
    }

    /// Whether `--etcd` was given.
    pub fn enabled(&self) -> bool {
        !self.etcd.is_empty()
    }

    /// Reads and checks what the `--etcd-*` flags name (certificates, key,
    /// password) and the endpoints' schemes; the error names the flag and
    /// the file or endpoint.
    pub fn etcd_access(&self) -> Result<EtcdAccess, DaemonError> {
        let flags = EtcdAccessFlags {
            endpoints: &self.etcd,
            cacert: self.etcd_cacert.as_deref(),
            cert: self.etcd_cert.as_deref(),
            key: self.etcd_key.as_deref(),
            user: self.etcd_user.as_ref().map(EtcdUserArg::as_str),
            password_file: self.etcd_password_file.as_deref(),
        };
        Ok(flags.load()?)
    }

    /// The leadership configuration of node `node_id` listening on
    /// `listen`; the error names the flag to fix.
    pub fn leadership_config(
        &self,
        node_id: &NodeId,
        listen: SocketAddr,
    ) -> Result<LeadershipConfig, DaemonError> {
        let advertise = match &self.advertise {
            None if listen.port() == 0 => {
                return Err(format!(
                    "--advertise HOST:PORT is needed with --etcd when --listen has port 0 \
                     ({listen}): other curator instances forward calls to it"
                )
                .into());
            }
            Some(a) => {
                let valid = a
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !valid {
                    return Err(format!("--advertise {a:?}: expected HOST:PORT").into());
                }
                a.clone()
            }
            None if listen.ip().is_unspecified() => {
                return Err(format!(
                    "--advertise HOST:PORT is needed with --etcd when --listen is a wildcard \
                     address ({listen}): other curator instances forward calls to it"
                )
                .into());
            }
            None => listen.to_string(),
        };
        let config = LeadershipConfig {
            lease_ttl: Duration::from_secs(self.lease_ttl),
            max_wait: Duration::from_secs(self.leader_wait),
            ..LeadershipConfig::new(node_id.to_string(), advertise)
        };
        config
            .validate()
            .map_err(|e| format!("--lease-ttl/--leader-wait: {e}"))?;
        Ok(config)
    }
}

/// The store and leadership of an elected instance, built by the runtime
/// (etcd client, election driver) for
/// [`NodeServices::prepare_elected`](crate::daemon::NodeServices::prepare_elected).
#[derive(Clone)]
pub struct Elected {
    /// The shared store (etcd), unfenced: the services write through a
    /// [`FencedStore`](metropolis_service::elected::FencedStore)
    /// over it.
    pub store: Arc<dyn KvStore>,
    /// The leadership machine the runtime's election driver feeds.
    pub leadership: SharedLeadership,
}

/// A running election, as the runtime that started it hands it over.
pub struct ElectionHandle {
    /// The store and leadership the services use.
    pub elected: Elected,
    /// Stops campaigning (a leader resigns, so a successor need not wait
    /// for the lease to expire); resolves once done, on any executor.
    pub stop: BoxFuture<'static, ()>,
}

/// Starts the election of an elected instance (the etcd port: connect,
/// campaign, observe), given the daemon's configuration, this node's
/// PKI, how to reach the leader and the daemon's metrics (with
/// `--metrics-listen`: the election records its lease requests there).
/// Called once, on the daemon's runtime.
pub type StartElection = Box<
    dyn FnOnce(
            &Config,
            &NodePki,
            Dial,
            Option<Metrics>,
        ) -> BoxFuture<'static, Result<ElectionHandle, DaemonError>>
        + Send,
>;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn flags(advertise: Option<&str>) -> ClusterFlags {
        ClusterFlags {
            etcd: vec!["http://127.0.0.1:2379".into()],
            advertise: advertise.map(str::to_owned),
            lease_ttl: 10,
            leader_wait: 10,
            etcd_request_timeout: 5,
            election_prefix: DEFAULT_ELECTION_PREFIX.into(),
            ..ClusterFlags::default()
        }
    }

    #[test]
    fn the_advertised_address_defaults_to_a_specific_listen_address() {
        let id = NodeId::from_public_key(&[1; 32]);
        let c = flags(None)
            .leadership_config(&id, "10.0.0.1:7835".parse().unwrap())
            .unwrap();
        assert_eq!(c.curator_address, "10.0.0.1:7835");
        let e = flags(None)
            .leadership_config(&id, "0.0.0.0:7835".parse().unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("--advertise"), "{e}");
        let c = flags(Some("node1.example:7835"))
            .leadership_config(&id, "0.0.0.0:7835".parse().unwrap())
            .unwrap();
        assert_eq!(c.curator_address, "node1.example:7835");
        for bad in ["node1", ":7835", "node1:http"] {
            let e = flags(Some(bad))
                .leadership_config(&id, "0.0.0.0:7835".parse().unwrap())
                .unwrap_err();
            assert!(e.to_string().contains("--advertise"), "{bad}: {e}");
        }
        let mut zero = flags(Some("a:1"));
        zero.lease_ttl = 0;
        let e = zero
            .leadership_config(&id, "0.0.0.0:7835".parse().unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("lease"), "{e}");
    }
}

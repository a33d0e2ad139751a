//! AgentCallback.Heartbeat and the operator's MachineManagement over real
//! sockets: authentication by self-signed agent keys, hardware reports,
//! installation requests by generation returned byte-for-byte, reports;
//! a removed machine's agent is unknown, on the leader and through a
//! follower.

#![allow(clippy::unwrap_used)]

use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, GetMachineRequest, ListMachinesRequest, RemoveMachineRequest,
    SubmitInstallationRequestRequest, machine_management_client::MachineManagementClient,
};
use metropolis_proto::prelude::agent::agent_callback_client::AgentCallbackClient;
use metropolis_proto::prelude::{agent, hwreport};
use metropolis_tests::provisioning::metropolis_request;
use metropolis_tests::{AgentKey, Daemon, RuntimeKind, against_both_runtimes_and_etcd};
use metropolis_transport::grpc::Channel;
use tonic::Code;

const MACHINE: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";
const OTHER_MACHINE: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

async fn owner(d: &Daemon) -> MachineManagementClient<Channel> {
    MachineManagementClient::with_origin(d.owner().await, Channel::origin())
}

/// The owner's client, after registering machine [`MACHINE`] for `key`'s
/// agent.
async fn with_machine(d: &Daemon, key: &AgentKey) -> MachineManagementClient<Channel> {
    let mut op = owner(d).await;
    op.add_machine(AddMachineRequest {
        machine_id: MACHINE.into(),
        agent_public_key: key.public.to_vec().into(),
    })
    .await
    .unwrap();
    op
}

async fn agent(d: &Daemon, key: &AgentKey) -> AgentCallbackClient<Channel> {
    AgentCallbackClient::with_origin(
        d.agent_channel(Some(&key.creds), &key.creds.ca_pem).await,
        Channel::origin(),
    )
}

fn heartbeat(machine_id: &str) -> agent::HeartbeatRequest {
    agent::HeartbeatRequest {
        machine_id: machine_id.into(),
        ..Default::default()
    }
}

fn install_request(root: &str) -> Vec<u8> {
    let digest = format!("sha256:{}", "a".repeat(64));
    let mut bytes = metropolis_request("127.0.0.1:5000", "os", "", &digest, root);
    // A field this build does not know (number 99, varint 7): it must survive.
    bytes.extend_from_slice(&[0x98, 0x06, 0x07]);
    bytes
}

fn report(generation: i64, ok: bool) -> agent::OsInstallationReport {
    use agent::os_installation_report::{Error, Result as R, Success};
    agent::OsInstallationReport {
        generation,
        result: Some(if ok {
            R::Success(Success {})
        } else {
            R::Error(Error {
                error: "disk on fire".into(),
            })
        }),
    }
}

/// A heartbeat whose response keeps the request's bytes as they came.
async fn raw_heartbeat(
    d: &Daemon,
    key: &AgentKey,
    request: agent::HeartbeatRequest,
) -> metropolis_proto::wire::EncodedHeartbeatResponse {
    let channel = d.agent_channel(Some(&key.creds), &key.creds.ca_pem).await;
    let mut grpc = tonic::client::Grpc::with_origin(channel, Channel::origin());
    grpc.ready().await.unwrap();
    let path =
        http::uri::PathAndQuery::from_static("/cloud.bmaas.server.api.AgentCallback/Heartbeat");
    let codec = tonic_prost::ProstCodec::<
        agent::HeartbeatRequest,
        metropolis_proto::wire::EncodedHeartbeatResponse,
    >::default();
    grpc.unary(tonic::Request::new(request), path, codec)
        .await
        .unwrap()
        .into_inner()
}

async fn full_flow(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let key = AgentKey::new(&d);
    let mut op = with_machine(&d, &key).await;
    let e = op
        .add_machine(AddMachineRequest {
            machine_id: MACHINE.into(),
            agent_public_key: key.public.to_vec().into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);

    let mut a = agent(&d, &key).await;
    // First heartbeat: no request yet; liveness recorded.
    let r = a.heartbeat(heartbeat(MACHINE)).await.unwrap().into_inner();
    assert!(r.installation_request.is_none());
    let m = op
        .get_machine(GetMachineRequest {
            machine_id: MACHINE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(m.last_heartbeat_unix_ms > 0 && !m.lost);

    // A hardware report is stored as received.
    let hw = agent::AgentHardwareReport {
        report: Some(hwreport::Node {
            manufacturer: "ACME".into(),
            memory_installed_bytes: 1 << 34,
            ..Default::default()
        }),
        warning: vec!["no DMI serial".into()],
    };
    let mut req = heartbeat(MACHINE);
    req.hardware_report = Some(hw.clone());
    a.heartbeat(req).await.unwrap();
    let m = op
        .get_machine(GetMachineRequest {
            machine_id: MACHINE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.hardware_report, Some(hw));

    // Generation 1, returned byte-for-byte until a report for it arrives.
    let submitted = install_request("/dev/vda");
    let g1 = op
        .submit_installation_request(SubmitInstallationRequestRequest {
            machine_id: MACHINE.into(),
            request: submitted.clone().into(),
        })
        .await
        .unwrap()
        .into_inner()
        .generation;
    assert_eq!(g1, 1);
    let stored = op
        .get_machine(GetMachineRequest {
            machine_id: MACHINE.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .current_request;
    assert!(
        stored.starts_with(&submitted),
        "the submitted bytes are kept as they are"
    );
    let raw = raw_heartbeat(&d, &key, heartbeat(MACHINE)).await;
    assert_eq!(
        raw.installation_request.as_ref(),
        Some(&stored),
        "returned byte-for-byte, unknown field included"
    );
    let got = a
        .heartbeat(heartbeat(MACHINE))
        .await
        .unwrap()
        .into_inner()
        .installation_request
        .unwrap();
    assert_eq!(got.generation, 1);
    // A report of success for generation 1: no request any more.
    let mut req = heartbeat(MACHINE);
    req.installation_report = Some(report(1, true));
    a.heartbeat(req).await.unwrap();
    assert!(
        a.heartbeat(heartbeat(MACHINE))
            .await
            .unwrap()
            .into_inner()
            .installation_request
            .is_none()
    );
    // A late error report for generation 1 does not change the success.
    let mut req = heartbeat(MACHINE);
    req.installation_report = Some(report(1, false));
    a.heartbeat(req).await.unwrap();
    let m = op
        .get_machine(GetMachineRequest {
            machine_id: MACHINE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(m.reports.iter().any(|r| r.generation == 1 && r.success));

    // Generation 2 replaces it; a report for generation 1 does not satisfy it.
    let g2 = op
        .submit_installation_request(SubmitInstallationRequestRequest {
            machine_id: MACHINE.into(),
            request: install_request("/dev/vdb").into(),
        })
        .await
        .unwrap()
        .into_inner()
        .generation;
    assert_eq!(g2, 2);
    let mut req = heartbeat(MACHINE);
    req.installation_report = Some(report(1, true));
    let got = a
        .heartbeat(req)
        .await
        .unwrap()
        .into_inner()
        .installation_request
        .unwrap();
    assert_eq!(got.generation, 2);
    let mut req = heartbeat(MACHINE);
    req.installation_report = Some(report(2, false));
    assert!(
        a.heartbeat(req)
            .await
            .unwrap()
            .into_inner()
            .installation_request
            .is_none()
    );
    let list = op
        .list_machines(ListMachinesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.machines.len(), 1);
    assert_eq!(list.machines[0].current_generation, 2);
}

async fn refusals(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let key = AgentKey::new(&d);
    let other = AgentKey::new(&d);
    let mut op = owner(&d).await;
    for (id, k) in [(MACHINE, &key), (OTHER_MACHINE, &other)] {
        op.add_machine(AddMachineRequest {
            machine_id: id.into(),
            agent_public_key: k.public.to_vec().into(),
        })
        .await
        .unwrap();
    }
    let mut a = agent(&d, &key).await;
    // Non-UUID machine ID.
    let e = a.heartbeat(heartbeat("machine-1")).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("machine_id"));
    // Another machine's ID with this key; an unknown machine.
    for id in [OTHER_MACHINE, "11111111-2222-3333-4444-555555555555"] {
        let e = a.heartbeat(heartbeat(id)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(
            e.message().contains("machine id or public key unknown"),
            "{}",
            e.message()
        );
    }
    // An unregistered key.
    let stranger = AgentKey::new(&d);
    let e = agent(&d, &stranger)
        .await
        .heartbeat(heartbeat(MACHINE))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    // No client certificate.
    let ca = key.creds.ca_pem.clone();
    let mut anon =
        AgentCallbackClient::with_origin(d.agent_channel(None, &ca).await, Channel::origin());
    let e = anon.heartbeat(heartbeat(MACHINE)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    // A certificate of the cluster CA (not self-signed) is not an agent's.
    let owner_creds =
        metropolis_pki::Credentials::read_from_dir(&d.data_dir.join("owner"), "owner").unwrap();
    let mut as_owner = AgentCallbackClient::with_origin(
        d.agent_channel(Some(&owner_creds), &ca).await,
        Channel::origin(),
    );
    let e = as_owner.heartbeat(heartbeat(MACHINE)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    // The machine API is the owner's: agents and nodes cannot use it.
    let mut node_mgmt = MachineManagementClient::with_origin(d.unix().await, Channel::origin());
    let e = node_mgmt
        .list_machines(ListMachinesRequest {})
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    // Bad operator input names the field.
    let e = op
        .add_machine(AddMachineRequest {
            machine_id: MACHINE.into(),
            agent_public_key: vec![1, 2, 3].into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("agent_public_key"));
    let e = op
        .submit_installation_request(SubmitInstallationRequestRequest {
            machine_id: MACHINE.into(),
            request: vec![0xff, 0xff].into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
}

/// Runs `metroctl machine rm id` as the owner of `d`: its stdout, or its
/// stderr when it failed.
fn machine_rm(d: &Daemon, id: &str) -> Result<String, String> {
    let out = d.metroctl(&["machine", "rm", id]);
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    }
}

/// The Heartbeat of `key` for `machine` through `d`'s AgentCallback port.
async fn beat(d: &Daemon, key: &AgentKey, machine: &str) -> Result<(), tonic::Status> {
    agent(d, key)
        .await
        .heartbeat(heartbeat(machine))
        .await
        .map(|_| ())
}

fn assert_unknown(result: Result<(), tonic::Status>, what: &str) {
    let e = result.expect_err(what);
    assert_eq!(e.code(), Code::Unauthenticated, "{what}: {e:?}");
    assert!(
        e.message().contains("machine id or public key unknown"),
        "{what}: {}",
        e.message()
    );
}

async fn removed_machines_are_unknown(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let key = AgentKey::new(&d);
    let mut op = with_machine(&d, &key).await;
    beat(&d, &key, MACHINE).await.unwrap();

    let out = machine_rm(&d, MACHINE).unwrap();
    assert!(out.contains(&format!("machine {MACHINE} removed")), "{out}");
    // Its agent is now an unknown machine's; the record is gone.
    assert_unknown(beat(&d, &key, MACHINE).await, "heartbeat after rm");
    let e = op
        .get_machine(GetMachineRequest {
            machine_id: MACHINE.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let list = op.list_machines(ListMachinesRequest {}).await.unwrap();
    assert!(list.into_inner().machines.is_empty());

    // An unknown machine: NotFound; not a UUID: InvalidArgument; a node
    // may not remove machines.
    let e = machine_rm(&d, MACHINE).unwrap_err();
    assert!(e.contains("NotFound") && e.contains(MACHINE), "{e}");
    let e = machine_rm(&d, "machine-1").unwrap_err();
    assert!(
        e.contains("InvalidArgument") && e.contains("machine_id"),
        "{e}"
    );
    let mut as_node = MachineManagementClient::with_origin(d.unix().await, Channel::origin());
    let e = as_node
        .remove_machine(RemoveMachineRequest {
            machine_id: MACHINE.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // Registered again, the machine starts afresh.
    op.add_machine(AddMachineRequest {
        machine_id: MACHINE.into(),
        agent_public_key: key.public.to_vec().into(),
    })
    .await
    .unwrap();
    beat(&d, &key, MACHINE).await.unwrap();
}

against_both_runtimes_and_etcd!(full_flow, refusals, removed_machines_are_unknown);

/// The cases that need etcd (the `system` feature).
#[cfg(feature = "system")]
mod over_etcd {
    use super::*;

    /// Two instances elected over etcd (tokio and smol): a machine removed
    /// through the follower and one removed on the leader are unknown to
    /// heartbeats on both, forwarded or not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn removed_machines_are_unknown_through_a_follower() {
        let etcd = metropolis_tests::etcd::Etcd::start();
        let dir = tempfile::tempdir().unwrap();
        let c = metropolis_tests::cluster::Curators::pair(dir.path(), &etcd.urls());
        let leader = &c.daemons[c.leader(&etcd, std::time::Duration::from_secs(10)).await];
        let follower = c.daemons.iter().find(|d| d.addr != leader.addr).unwrap();
        let (key, other) = (AgentKey::new(leader), AgentKey::new(leader));
        let mut op = owner(follower).await;
        for (id, k) in [(MACHINE, &key), (OTHER_MACHINE, &other)] {
            op.add_machine(AddMachineRequest {
                machine_id: id.into(),
                agent_public_key: k.public.to_vec().into(),
            })
            .await
            .unwrap();
        }
        for d in [leader, follower] {
            beat(d, &key, MACHINE).await.unwrap();
            beat(d, &other, OTHER_MACHINE).await.unwrap();
        }

        machine_rm(follower, MACHINE).unwrap();
        machine_rm(leader, OTHER_MACHINE).unwrap();
        for d in [leader, follower] {
            assert_unknown(beat(d, &key, MACHINE).await, "removed through the follower");
            assert_unknown(
                beat(d, &other, OTHER_MACHINE).await,
                "removed on the leader",
            );
        }
        let e = machine_rm(follower, OTHER_MACHINE).unwrap_err();
        assert!(e.contains("NotFound"), "{e}");
        let e = machine_rm(leader, MACHINE).unwrap_err();
        assert!(e.contains("NotFound"), "{e}");
    }
}

//! Conformance of AgentCallback.Heartbeat with the reference: re-expresses
//! the test cases of Monogon's `cloud/bmaas/server/agent_callback_service_test.go`
//! (as of `b21bdf9e^`: `TestAgentCallbackService`, `TestOSInstallationFlow`)
//! black-box, over gRPC against a real `metropolisd` process on both
//! runtimes, plus the refusals the reference makes that its tests do not
//! spell out (a `machine_id` that is no UUID, a report with no result, a
//! certificate chain, reports of zero bytes skipped) and the UUID forms its
//! `uuid.Parse` accepts.
//!
//! Where the reference writes machines and requests into its database
//! directly, these tests go through the owner's MachineManagement API
//! (`AddMachine`, `SubmitInstallationRequest`, `GetMachine`,
//! `ListMachines`) or `metroctl`; where the reference's test chooses a
//! request's generation (123, then 234), here the server assigns it
//! (1, then 2) and the tests compare with the generation it returned.
//!
//! Identities: "agent" calls present the agent's self-signed certificate of
//! its Ed25519 key over the AgentCallback TLS port; "owner" calls present
//! the owner certificate of the daemon's data directory over mutual TLS.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use metropolis_proto::metropolis::node::core::curator::proto::private::{
    AddMachineRequest, GetMachineRequest, ListMachinesRequest, Machine,
    machine_management_client::MachineManagementClient,
};
use metropolis_proto::prelude::agent;
use metropolis_proto::prelude::agent::agent_callback_client::AgentCallbackClient;
use metropolis_tests::provisioning::metropolis_request;
use metropolis_tests::{AgentKey, Daemon, RuntimeKind, against_both_runtimes, provisioning};
use metropolis_transport::grpc::Channel;
use tonic::Code;

/// The machine of most tests, in the lowercase canonical form.
const MACHINE: &str = "3b241101-e2bb-4255-8caf-4136c566a962";

/// Every call is bounded: a hang fails the test instead of blocking it.
const CALL: Duration = Duration::from_secs(20);

async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(CALL, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {CALL:?}"))
}

/// The owner's MachineManagement client (owner certificate, mutual TLS).
async fn owner(d: &Daemon) -> MachineManagementClient<Channel> {
    MachineManagementClient::with_origin(d.owner().await, Channel::origin())
}

/// Registers `machine_id` for `key`'s agent, as the owner.
async fn register(op: &mut MachineManagementClient<Channel>, machine_id: &str, key: &AgentKey) {
    bounded(
        "AddMachine",
        op.add_machine(AddMachineRequest {
            machine_id: machine_id.into(),
            agent_public_key: key.public.to_vec().into(),
        }),
    )
    .await
    .unwrap();
}

/// The machine as the owner sees it.
async fn machine(op: &mut MachineManagementClient<Channel>, machine_id: &str) -> Machine {
    bounded(
        "GetMachine",
        op.get_machine(GetMachineRequest {
            machine_id: machine_id.into(),
        }),
    )
    .await
    .unwrap()
    .into_inner()
}

/// One heartbeat as the reference's tests send it (an empty hardware
/// report, and `report` if any), on a fresh connection presenting `key`'s
/// self-signed certificate, like the reference's `heartbeat` helper.
async fn heartbeat(
    d: &Daemon,
    key: &AgentKey,
    machine_id: &str,
    report: Option<agent::OsInstallationReport>,
) -> Result<agent::HeartbeatResponse, tonic::Status> {
    let hardware = agent::AgentHardwareReport::default();
    heartbeat_with(d, key, machine_id, hardware, report).await
}

/// [`heartbeat`] carrying `hardware`.
async fn heartbeat_with(
    d: &Daemon,
    key: &AgentKey,
    machine_id: &str,
    hardware: agent::AgentHardwareReport,
    report: Option<agent::OsInstallationReport>,
) -> Result<agent::HeartbeatResponse, tonic::Status> {
    let channel = d.agent_channel(Some(&key.creds), &key.creds.ca_pem).await;
    let mut client = AgentCallbackClient::with_origin(channel, Channel::origin());
    let request = agent::HeartbeatRequest {
        machine_id: machine_id.into(),
        hardware_report: Some(hardware),
        installation_report: report,
    };
    bounded("Heartbeat", client.heartbeat(request))
        .await
        .map(tonic::Response::into_inner)
}

/// An encoded Metropolis installation request for `root_device`.
fn install_request(root_device: &str) -> Vec<u8> {
    let digest = format!("sha256:{}", "b".repeat(64));
    metropolis_request("127.0.0.1:5000", "os", "", &digest, root_device)
}

fn success(generation: i64) -> agent::OsInstallationReport {
    agent::OsInstallationReport {
        generation,
        result: Some(agent::os_installation_report::Result::Success(
            Default::default(),
        )),
    }
}

/// A daemon with [`MACHINE`] registered for a fresh agent key; the owner's
/// client.
async fn setup(
    rt: RuntimeKind,
    dir: &std::path::Path,
) -> (Daemon, AgentKey, MachineManagementClient<Channel>) {
    let d = Daemon::start(&dir.join("d"), rt);
    let key = AgentKey::new(&d);
    let mut op = owner(&d).await;
    register(&mut op, MACHINE, &key).await;
    (d, key, op)
}

/// The generation the agent is offered, if any; asserts the heartbeat
/// succeeds.
async fn offered(
    d: &Daemon,
    key: &AgentKey,
    report: Option<agent::OsInstallationReport>,
) -> Option<i64> {
    heartbeat(d, key, MACHINE, report)
        .await
        .unwrap()
        .installation_request
        .map(|r| r.generation)
}

/// TestAgentCallbackService: a heartbeat for a made-up machine ID is
/// refused. Agent: self-signed certificate of a key no machine is
/// registered with, for a random machine ID nobody registered.
async fn test_agent_callback_service_unknown_machine_refused(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let key = AgentKey::new(&d);
    let e = heartbeat(&d, &key, "9a1c3e5f-7b2d-4f60-8e1a-2b3c4d5e6f70", None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(
        e.message().contains("machine id or public key unknown"),
        "{}",
        e.message()
    );
}

/// TestAgentCallbackService: with the machine registered for the agent's
/// key, its heartbeat succeeds (and its liveness is recorded). Owner:
/// AddMachine, GetMachine; agent: self-signed certificate of the
/// registered key.
async fn test_agent_callback_service_registered_machine_accepted(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, key, mut op) = setup(rt, dir.path()).await;
    assert_eq!(machine(&mut op, MACHINE).await.last_heartbeat_unix_ms, 0);
    let r = heartbeat(&d, &key, MACHINE, None).await.unwrap();
    assert!(r.installation_request.is_none());
    let m = machine(&mut op, MACHINE).await;
    assert!(m.last_heartbeat_unix_ms > 0 && !m.lost, "{m:?}");
    // Registered to this key only: another key for the same machine is
    // still refused.
    let stranger = AgentKey::new(&d);
    let e = heartbeat(&d, &stranger, MACHINE, None).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

/// TestAgentCallbackService with the machine ID in every form Go's
/// `uuid.Parse` accepts: a machine registered in upper case through
/// `metroctl machine add` is found by heartbeats in every form, and is
/// stored once, in the lowercase canonical form. Owner: metroctl over
/// mutual TLS, ListMachines; agent: self-signed certificate of the
/// registered key.
async fn test_agent_callback_service_registered_machine_accepted_in_every_uuid_form(
    rt: RuntimeKind,
) {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("d"), rt);
    let key = AgentKey::new(&d);
    let pubkey: String = key.public.iter().map(|b| format!("{b:02x}")).collect();
    let upper = MACHINE.to_uppercase();
    let out = d.metroctl(&["machine", "add", &upper, "--agent-pubkey", &pubkey]);
    assert!(
        out.status.success(),
        "metroctl machine add {upper}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hex = MACHINE.replace('-', "");
    let forms = [
        MACHINE.to_string(),
        upper.clone(),
        hex.clone(),
        hex.to_uppercase(),
        format!("{{{MACHINE}}}"),
        format!("{{{upper}}}"),
        format!("urn:uuid:{MACHINE}"),
        format!("urn:uuid:{upper}"),
        format!("URN:UUID:{MACHINE}"),
        "3B241101-e2bb-4255-8CAF-4136c566A962".to_string(),
    ];
    for form in &forms {
        heartbeat(&d, &key, form, None)
            .await
            .unwrap_or_else(|e| panic!("heartbeat as {form:?}: {e:?}"));
    }
    let list = bounded(
        "ListMachines",
        owner(&d).await.list_machines(ListMachinesRequest {}),
    )
    .await
    .unwrap()
    .into_inner();
    let ids: Vec<&str> = list
        .machines
        .iter()
        .map(|m| m.machine_id.as_str())
        .collect();
    assert_eq!(ids, [MACHINE], "stored once, lowercase canonical");
    assert!(list.machines[0].last_heartbeat_unix_ms > 0);
}

/// Refusal the reference makes (its `uuid.Parse` fails): a `machine_id`
/// that is no UUID is InvalidArgument naming the field. Owner: AddMachine;
/// agent: self-signed certificate of the registered key.
async fn test_agent_callback_service_invalid_machine_id_refused(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, key, mut op) = setup(rt, dir.path()).await;
    for bad in [
        "",
        "machine-1",
        "3b241101-e2bb-4255-8caf-4136c566a96",
        "3b241101-e2bb-4255-8caf-4136c566a96g",
        "3b241101e2bb42558caf4136c566a96",
        "3b241101_e2bb_4255_8caf_4136c566a962",
        "3b241101-e2bb-4255-8caf-4136c566a962-",
        "urn:uuid:3b241101e2bb42558caf4136c566a962",
        " 3b241101-e2bb-4255-8caf-4136c566a962",
    ] {
        let e = heartbeat(&d, &key, bad, None).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e:?}");
        assert!(
            e.message().contains("machine_id"),
            "{bad:?}: {}",
            e.message()
        );
    }
    assert_eq!(
        machine(&mut op, MACHINE).await.last_heartbeat_unix_ms,
        0,
        "no refused heartbeat counts as one"
    );
}

/// TestOSInstallationFlow: a machine with no installation request is
/// offered none. Owner: AddMachine; agent: self-signed certificate of the
/// registered key.
async fn test_os_installation_flow_no_request_none_offered(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, key, _op) = setup(rt, dir.path()).await;
    for _ in 0..3 {
        assert_eq!(offered(&d, &key, None).await, None);
    }
}

/// TestOSInstallationFlow: a submitted request is offered, with its
/// generation, on every heartbeat that carries no report of it. Owner:
/// AddMachine, SubmitInstallationRequest; agent: self-signed certificate of
/// the registered key.
async fn test_os_installation_flow_request_offered_on_every_heartbeat(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, key, mut op) = setup(rt, dir.path()).await;
    assert_eq!(offered(&d, &key, None).await, None);
    let g = provisioning::submit(&mut op, MACHINE, install_request("/dev/vda")).await;
    for _ in 0..3 {
        assert_eq!(offered(&d, &key, None).await, Some(g));
    }
}

/// TestOSInstallationFlow: the heartbeat carrying the report of the
/// current request's generation gets no request, nor do the following
/// ones. Owner: AddMachine, SubmitInstallationRequest, GetMachine; agent:
/// self-signed certificate of the registered key.
async fn test_os_installation_flow_report_heartbeat_gets_no_request(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, key, mut op) = setup(rt, dir.path()).await;
    let g = provisioning::submit(&mut op, MACHINE, install_request("/dev/vda")).await;
    assert_eq!(offered(&d, &key, None).await, Some(g));
    assert_eq!(offered(&d, &key, Some(success(g))).await, None);
    assert_eq!(offered(&d, &key, None).await, None);
    let m = machine(&mut op, MACHINE).await;
    assert!(
        m.reports.iter().any(|r| r.generation == g && r.success),
        "{m:?}"
    );
}

/// TestOSInstallationFlow: after the report, a newer request (the next
/// generation) is offered again, on every heartbeat. Owner: AddMachine,
/// SubmitInstallationRequest; agent: self-signed certificate of the
/// registered key.
async fn test_os_installation_flow_newer_request_offered_again(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, key, mut op) = setup(rt, dir.path()).await;
    let g1 = provisioning::submit(&mut op, MACHINE, install_request("/dev/vda")).await;
    assert_eq!(offered(&d, &key, Some(success(g1))).await, None);
    let g2 = provisioning::submit(&mut op, MACHINE, install_request("/dev/vdb")).await;
    assert!(g2 > g1, "generations increase: {g1} then {g2}");
    for _ in 0..3 {
        assert_eq!(offered(&d, &key, None).await, Some(g2));
    }
}

/// Refusal beyond TestOSInstallationFlow: a heartbeat whose
/// `installation_report` carries neither success nor error is
/// InvalidArgument naming the field, and nothing of it is recorded (no
/// liveness, no hardware report, no report); the request is still offered.
/// Owner: AddMachine, SubmitInstallationRequest, GetMachine; agent:
/// self-signed certificate of the registered key.
async fn test_os_installation_flow_report_without_result_refused(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, key, mut op) = setup(rt, dir.path()).await;
    let g = provisioning::submit(&mut op, MACHINE, install_request("/dev/vda")).await;
    let empty = agent::OsInstallationReport {
        generation: g,
        result: None,
    };
    let e = heartbeat(&d, &key, MACHINE, Some(empty)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("installation_report"),
        "{}",
        e.message()
    );
    let m = machine(&mut op, MACHINE).await;
    assert_eq!(m.last_heartbeat_unix_ms, 0, "no liveness: {m:?}");
    assert!(m.hardware_report.is_none(), "no hardware report: {m:?}");
    assert!(m.reports.is_empty(), "no report: {m:?}");
    assert_eq!(offered(&d, &key, None).await, Some(g));
}

/// The reference's Heartbeat skips a report that encodes to zero bytes
/// (`cloud/bmaas/server/agent_callback_service.go` at `4cc3d4d2`, lines
/// 79-86 and 99-107 for the hardware report, 88-94 and 109 for the
/// installation report): the empty `AgentHardwareReport` its tests send
/// leaves the stored report as it is, and an empty `OSInstallationReport`
/// is no report, while the heartbeat itself is recorded. Owner:
/// AddMachine, SubmitInstallationRequest, GetMachine; agent: self-signed
/// certificate of the registered key.
async fn test_agent_callback_service_zero_byte_reports_skipped(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, key, mut op) = setup(rt, dir.path()).await;
    let beat = |hardware, report| heartbeat_with(&d, &key, MACHINE, hardware, report);
    let full = agent::AgentHardwareReport {
        report: None,
        warning: vec!["no DMI tables".into()],
    };
    beat(full.clone(), None).await.unwrap();
    assert_eq!(
        machine(&mut op, MACHINE).await.hardware_report,
        Some(full.clone())
    );

    // The reference's own heartbeat: an empty hardware report.
    let before = machine(&mut op, MACHINE).await.last_heartbeat_unix_ms;
    tokio::time::sleep(Duration::from_millis(5)).await;
    beat(agent::AgentHardwareReport::default(), None)
        .await
        .unwrap();
    let m = machine(&mut op, MACHINE).await;
    assert_eq!(
        m.hardware_report,
        Some(full.clone()),
        "replaced by nothing: {m:?}"
    );
    assert!(
        m.last_heartbeat_unix_ms > before,
        "heartbeat recorded: {m:?}"
    );

    // An installation report of zero bytes is none: the request stays
    // offered and nothing is stored.
    let g = provisioning::submit(&mut op, MACHINE, install_request("/dev/vda")).await;
    let empty = agent::OsInstallationReport::default();
    let r = beat(agent::AgentHardwareReport::default(), Some(empty))
        .await
        .unwrap();
    assert_eq!(r.installation_request.map(|r| r.generation), Some(g));
    let m = machine(&mut op, MACHINE).await;
    assert!(m.reports.is_empty(), "no report stored: {m:?}");
    assert_eq!(m.hardware_report, Some(full));
}

/// The reference's servers take exactly one client certificate
/// (`GetPeerCertificate`, `metropolis/node/core/rpc/server_authentication.go`
/// at `4cc3d4d2`, lines 236-242, called by the BMaaS Heartbeat at line
/// 36): the registered agent's own certificate followed by another one is
/// Unauthenticated "exactly one client certificate must be sent (got 2)",
/// and nothing of the heartbeat is recorded; alone, the same certificate
/// is served. Owner: AddMachine, GetMachine; agent: the registered key's
/// self-signed certificate with the cluster CA's certificate after it.
async fn test_agent_callback_service_certificate_chain_unauthenticated(rt: RuntimeKind) {
    let dir = tempfile::tempdir().unwrap();
    let (d, key, mut op) = setup(rt, dir.path()).await;
    let mut chained = key.creds.clone();
    chained.cert_pem = format!("{}{}", key.creds.cert_pem, key.creds.ca_pem);
    let channel = d.agent_channel(Some(&chained), &chained.ca_pem).await;
    let request = agent::HeartbeatRequest {
        machine_id: MACHINE.into(),
        ..Default::default()
    };
    let e = bounded(
        "Heartbeat",
        AgentCallbackClient::with_origin(channel, Channel::origin()).heartbeat(request),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert!(
        e.message()
            .contains("exactly one client certificate must be sent (got 2)"),
        "{}",
        e.message()
    );
    assert_eq!(machine(&mut op, MACHINE).await.last_heartbeat_unix_ms, 0);
    heartbeat(&d, &key, MACHINE, None).await.unwrap();
}

against_both_runtimes!(
    test_agent_callback_service_zero_byte_reports_skipped,
    test_agent_callback_service_certificate_chain_unauthenticated,
    test_agent_callback_service_unknown_machine_refused,
    test_agent_callback_service_registered_machine_accepted,
    test_agent_callback_service_registered_machine_accepted_in_every_uuid_form,
    test_agent_callback_service_invalid_machine_id_refused,
    test_os_installation_flow_no_request_none_offered,
    test_os_installation_flow_request_offered_on_every_heartbeat,
    test_os_installation_flow_report_heartbeat_gets_no_request,
    test_os_installation_flow_newer_request_offered_again,
    test_os_installation_flow_report_without_result_refused,
);

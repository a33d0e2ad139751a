//! What the provisioning suites do as the operator: submit installation
//! requests and wait for the agent's reports.

use std::time::{Duration, Instant};

use metropolis_proto::metropolis::node::core::curator::proto::private::{
    GetMachineRequest, Machine, SubmitInstallationRequestRequest, machine::Report,
    machine_management_client::MachineManagementClient,
};
use metropolis_transport::grpc::Channel;

/// An encoded `OSInstallationRequest` for Metropolis from the image
/// `repository` (`tag`, `digest`) of the plain-HTTP registry at `host`,
/// onto `root_device`, without node parameters.
pub fn metropolis_request(
    host: &str,
    repository: &str,
    tag: &str,
    digest: &str,
    root_device: &str,
) -> Vec<u8> {
    use metropolis_proto::prelude::{agent, debug as api};
    use prost::Message;
    agent::OsInstallationRequest {
        generation: 0,
        r#type: Some(agent::os_installation_request::Type::Metropolis(
            agent::MetropolisInstallationRequest {
                os_image: Some(api::OsImageRef {
                    scheme: "http".into(),
                    host: host.into(),
                    repository: repository.into(),
                    tag: tag.into(),
                    digest: digest.into(),
                }),
                node_parameters: None,
                root_device: root_device.into(),
            },
        )),
    }
    .encode_to_vec()
}

/// Submits the encoded `OSInstallationRequest` `bytes` for `machine_id`;
/// its generation.
pub async fn submit(
    op: &mut MachineManagementClient<Channel>,
    machine_id: &str,
    bytes: Vec<u8>,
) -> i64 {
    op.submit_installation_request(SubmitInstallationRequestRequest {
        machine_id: machine_id.into(),
        request: bytes.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .generation
}

/// The report of `generation` for `machine_id`, waiting up to 60 s.
pub async fn report(
    op: &mut MachineManagementClient<Channel>,
    machine_id: &str,
    generation: i64,
) -> Report {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m: Machine = op
            .get_machine(GetMachineRequest {
                machine_id: machine_id.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if let Some(r) = m.reports.iter().find(|r| r.generation == generation) {
            return r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no report of {generation}: {m:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

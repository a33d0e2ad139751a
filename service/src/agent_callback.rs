//! The AgentCallback service (`Heartbeat`) and the operator's
//! MachineManagement service, over a [`KvStore`].
//!
//! Machine records live under `/machines/<machine id>` as versioned
//! protobuf ([`MachineRecord`]). Every write is a compare-and-swap on the
//! record's revision, retried on conflict.

use std::future::Future;
use std::sync::Arc;

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response};
use metropolis_proto::metropolis::node::core::curator::proto::private::{
    self as private, machine_management_server,
};
use metropolis_proto::prelude::agent;
use metropolis_proto::wire::EncodedHeartbeatResponse;
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;

use super::router::GrpcService;
use super::unary;

use super::cas::UpdateQueues;
use super::metrics::{AgentMetrics, Metrics};
use crate::status::agent_callback as status;
use metropolis_core::identity::Identity;
use metropolis_core::ports::{KvStore, WallClock};
use metropolis_core::provisioning::{MachineId, MachineRecord, check_heartbeat};
use metropolis_core::store::{KeyRange, KeyValue, Op, OpResult, Txn};

/// Key prefix of machine records.
pub const MACHINES_PREFIX: &[u8] = b"/machines/";

/// The store key of a machine's record.
pub fn machine_key(machine_id: &MachineId) -> Bytes {
    let mut key = MACHINES_PREFIX.to_vec();
    key.extend_from_slice(machine_id.as_str().as_bytes());
    Bytes::from(key)
}

/// `id` in canonical form, or InvalidArgument naming `machine_id`.
fn check_machine_id(id: &str) -> Result<MachineId, Status> {
    MachineId::parse(id).map_err(|e| status::machine_id(&e))
}

/// Machines, agents and installation requests over a [`KvStore`].
#[derive(Clone)]
pub struct ProvisioningService {
    store: Arc<dyn KvStore>,
    /// Updates of one machine's record queue behind each other.
    queues: UpdateQueues,
    clock: Arc<dyn WallClock>,
    lost_after: Duration,
    metrics: Option<AgentMetrics>,
}

/// Applies `change` to the record of `machine_id` in `store` by
/// compare-and-swap (see [`cas::update`](super::cas::update)).
async fn update_machine<T>(
    store: &dyn KvStore,
    queues: &UpdateQueues,
    machine_id: &MachineId,
    mut change: impl FnMut(&mut MachineRecord) -> Result<T, Status>,
) -> Result<T, Status> {
    let what = || format!("machine {machine_id}");
    super::cas::update(store, queues, machine_key(machine_id), what, |kv| {
        let mut record = decode(kv)?;
        let out = change(&mut record)?;
        Ok((record.encode().into(), out))
    })
    .await
}

fn decode(kv: &KeyValue) -> Result<MachineRecord, Status> {
    MachineRecord::decode(&kv.value).map_err(|e| status::machine_record(&kv.key, &e))
}

impl ProvisioningService {
    /// A service over `store`; a machine not heard from for `lost_after`
    /// is shown as lost.
    pub fn new(store: Arc<dyn KvStore>, clock: Arc<dyn WallClock>, lost_after: Duration) -> Self {
        ProvisioningService {
            store,
            queues: UpdateQueues::default(),
            clock,
            lost_after,
            metrics: None,
        }
    }

    /// Counts heartbeats by result in `metrics`.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        self.metrics = Some(metrics.agents.clone());
        self
    }

    /// Every stored machine record.
    async fn read_machines(store: &dyn KvStore) -> Result<Vec<KeyValue>, Status> {
        let txn = Txn {
            success: vec![Op::Range(KeyRange::Prefix(Bytes::from_static(
                MACHINES_PREFIX,
            )))],
            ..Default::default()
        };
        let mut response = store.txn(txn).await.map_err(crate::status::store)?;
        match response.results.pop() {
            Some(OpResult::Range(kvs)) => Ok(kvs),
            _ => Err(Status::internal("store returned no range result")),
        }
    }

    /// How many machines are registered and how many of them are lost
    /// (see [`Metrics::record_machines`]), read from the store now.
    pub async fn census(&self) -> Result<(u64, u64), Status> {
        let kvs = Self::read_machines(self.store.as_ref()).await?;
        let now = self.clock.now_unix_ms();
        let mut lost = 0;
        for kv in &kvs {
            if decode(kv)?.is_lost(now, self.lost_after) {
                lost += 1;
            }
        }
        Ok((kvs.len() as u64, lost))
    }

    /// The AgentCallback service, ready for the [`Router`](super::Router).
    pub fn agent_callback_server(&self) -> AgentCallbackHttp {
        AgentCallbackHttp {
            service: self.clone(),
        }
    }

    /// The MachineManagement service, ready for the [`Router`](super::Router).
    pub fn machine_management_server(
        &self,
    ) -> machine_management_server::MachineManagementServer<Self> {
        machine_management_server::MachineManagementServer::new(self.clone())
    }

    /// Applies `change` to the record of `machine_id` by compare-and-swap.
    async fn update<T>(
        &self,
        machine_id: &MachineId,
        change: impl FnMut(&mut MachineRecord) -> Result<T, Status>,
    ) -> Result<T, Status> {
        update_machine(self.store.as_ref(), &self.queues, machine_id, change).await
    }

    /// `AgentCallback.Heartbeat` from `caller`.
    ///
    /// The caller is checked when called; the returned future owns only
    /// what the update needs (see `service/tests/call_size.rs` for why its size
    /// matters).
    pub fn heartbeat(
        &self,
        caller: &Identity,
        request: agent::HeartbeatRequest,
    ) -> impl Future<Output = Result<EncodedHeartbeatResponse, Status>> + Send + use<> {
        let checked = match caller {
            Identity::Agent(key) => check_heartbeat(&request)
                .map(|id| (*key, id))
                .map_err(|e| status::heartbeat(&e)),
            _ => Err(status::not_an_agent()),
        };
        let (store, queues) = (self.store.clone(), self.queues.clone());
        let now = self.clock.now_unix_ms();
        let metrics = self.metrics.clone();
        let beat = async move {
            let (key, id) = checked?;
            let outcome = update_machine(store.as_ref(), &queues, &id, |record| {
                if record.agent_public_key != key
                    && !crate::canary_planted!(AcceptUnregisteredAgentKey)
                {
                    return Err(status::unknown_agent());
                }
                Ok(record.handle_heartbeat(&request, now))
            })
            .await
            .map_err(|e| {
                if e.code() == tonic::Code::NotFound {
                    status::unknown_agent()
                } else {
                    e
                }
            })?;
            Ok(EncodedHeartbeatResponse {
                installation_request: outcome.response_request,
            })
        };
        // A map, not an `async` block awaiting `beat`: that would hold
        // `beat` twice over in its layout (see `service/tests/call_size.rs`).
        futures::FutureExt::map(beat, move |result: Result<_, Status>| {
            if let Some(metrics) = metrics {
                metrics.heartbeat(match &result {
                    Ok(_) => "ok",
                    Err(e) if e.code() == tonic::Code::Unauthenticated => "unknown_agent",
                    Err(e) if e.code() == tonic::Code::InvalidArgument => "invalid",
                    Err(_) => "error",
                });
            }
            result
        })
    }

    fn view(&self, record: &MachineRecord, now: i64) -> private::Machine {
        private::Machine {
            machine_id: record.machine_id.clone(),
            agent_public_key: Bytes::copy_from_slice(&record.agent_public_key),
            last_heartbeat_unix_ms: record.last_heartbeat_unix_ms.unwrap_or(0),
            lost: record.is_lost(now, self.lost_after),
            hardware_report: record
                .hardware_report
                .as_ref()
                .and_then(|b| agent::AgentHardwareReport::decode(b.as_ref()).ok()),
            current_generation: record.current_generation().unwrap_or(0),
            current_request: record
                .request
                .as_ref()
                .map(|r| r.encoded.clone())
                .unwrap_or_default(),
            request_submitted_unix_ms: record
                .request
                .as_ref()
                .and_then(|r| r.submitted_unix_ms)
                .unwrap_or(0),
            request_handed_out_unix_ms: record
                .request
                .as_ref()
                .and_then(|r| r.handed_out_unix_ms)
                .unwrap_or(0),
            reports: record
                .reports
                .values()
                .map(|r| private::machine::Report {
                    generation: r.generation,
                    success: matches!(
                        r.result,
                        metropolis_core::provisioning::ReportResult::Success
                    ),
                    error: match &r.result {
                        metropolis_core::provisioning::ReportResult::Error(e) => e.clone(),
                        _ => String::new(),
                    },
                    received_unix_ms: r.received_unix_ms,
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl machine_management_server::MachineManagement for ProvisioningService {
    async fn add_machine(
        &self,
        request: tonic::Request<private::AddMachineRequest>,
    ) -> Result<tonic::Response<private::AddMachineResponse>, Status> {
        let req = request.into_inner();
        let id = check_machine_id(&req.machine_id)?;
        let key: [u8; 32] = req.agent_public_key.as_ref().try_into().map_err(|_| {
            Status::invalid_argument(format!(
                "agent_public_key: must be a 32-byte Ed25519 public key, got {} bytes",
                req.agent_public_key.len()
            ))
        })?;
        let record = MachineRecord::new(id.to_string(), key);
        let txn = Txn::create(machine_key(&id), record.encode().into(), vec![]);
        if !self
            .store
            .txn(txn)
            .await
            .map_err(crate::status::store)?
            .succeeded
        {
            return Err(Status::already_exists(format!(
                "machine {id} already exists"
            )));
        }
        tracing::info!(machine = %id, "machine added");
        Ok(tonic::Response::new(private::AddMachineResponse {}))
    }

    async fn list_machines(
        &self,
        _request: tonic::Request<private::ListMachinesRequest>,
    ) -> Result<tonic::Response<private::ListMachinesResponse>, Status> {
        let kvs = Self::read_machines(self.store.as_ref()).await?;
        let now = self.clock.now_unix_ms();
        let machines = kvs
            .iter()
            .map(|kv| decode(kv).map(|r| self.view(&r, now)))
            .collect::<Result<_, _>>()?;
        Ok(tonic::Response::new(private::ListMachinesResponse {
            machines,
        }))
    }

    async fn get_machine(
        &self,
        request: tonic::Request<private::GetMachineRequest>,
    ) -> Result<tonic::Response<private::Machine>, Status> {
        let id = check_machine_id(&request.into_inner().machine_id)?;
        let txn = Txn {
            success: vec![Op::Range(KeyRange::Key(machine_key(&id)))],
            ..Default::default()
        };
        let mut response = self.store.txn(txn).await.map_err(crate::status::store)?;
        let kv = match response.results.pop() {
            Some(OpResult::Range(mut kvs)) => kvs.pop(),
            _ => return Err(Status::internal("store returned no range result")),
        };
        let kv = kv.ok_or_else(|| Status::not_found(format!("machine {id} not found")))?;
        Ok(tonic::Response::new(
            self.view(&decode(&kv)?, self.clock.now_unix_ms()),
        ))
    }

    async fn remove_machine(
        &self,
        request: tonic::Request<private::RemoveMachineRequest>,
    ) -> Result<tonic::Response<private::RemoveMachineResponse>, Status> {
        let id = check_machine_id(&request.into_inner().machine_id)?;
        // One delete: a heartbeat racing it either commits first (and is
        // deleted with the record) or finds no record (Unauthenticated).
        let txn = Txn {
            success: vec![Op::Delete(KeyRange::Key(machine_key(&id)))],
            ..Default::default()
        };
        let response = self.store.txn(txn).await.map_err(crate::status::store)?;
        match response.results.first() {
            Some(OpResult::Delete(deleted)) if !deleted.is_empty() => {
                tracing::info!(machine = %id, "machine removed");
                Ok(tonic::Response::new(private::RemoveMachineResponse {}))
            }
            _ => Err(Status::not_found(format!("machine {id} not found"))),
        }
    }

    async fn submit_installation_request(
        &self,
        request: tonic::Request<private::SubmitInstallationRequestRequest>,
    ) -> Result<tonic::Response<private::SubmitInstallationRequestResponse>, Status> {
        let req = request.into_inner();
        let id = check_machine_id(&req.machine_id)?;
        let now = self.clock.now_unix_ms();
        let generation = self
            .update(&id, |record| {
                record
                    .submit_request(&req.request, now)
                    .map(|r| r.generation)
                    .map_err(|e| status::installation_request(&e))
            })
            .await?;
        tracing::info!(machine = %id, generation, "installation request submitted");
        Ok(tonic::Response::new(
            private::SubmitInstallationRequestResponse { generation },
        ))
    }
}

/// The AgentCallback service as an HTTP/2 handler: `Heartbeat` through
/// tonic's unary machinery, with a response type that carries the stored
/// installation request byte-for-byte.
#[derive(Clone)]
pub struct AgentCallbackHttp {
    service: ProvisioningService,
}

impl NamedService for AgentCallbackHttp {
    const NAME: &'static str = "cloud.bmaas.server.api.AgentCallback";
}

impl GrpcService for AgentCallbackHttp {
    fn call(&self, request: Request<Body>) -> BoxFuture<'static, Response<Body>> {
        match super::router::method_name(&request) {
            "Heartbeat" => {
                let service = self.service.clone();
                Box::pin(unary::serve(
                    request,
                    move |caller, request: agent::HeartbeatRequest| {
                        service.heartbeat(&caller, request)
                    },
                ))
            }
            other => super::router::no_such_method(Self::NAME, other),
        }
    }

    /// A Heartbeat from a caller without an agent certificate is refused
    /// before its body is read or forwarded: it can make no instance hold
    /// anything.
    fn precheck(&self, request: &Request<Body>) -> Result<(), Status> {
        let is_agent = matches!(
            request.extensions().get::<Identity>(),
            Some(Identity::Agent(_))
        );
        if super::router::method_name(request) == "Heartbeat" && !is_agent {
            return Err(status::not_an_agent());
        }
        Ok(())
    }
}

//! Seed inputs for every target, written in each harness's input format:
//! valid archives built with the `tar` crate (Docker v1.1/v1.2, Docker 25,
//! OCI layouts, links, long names, and hostile ones), encoded requests of
//! every RPC in meaningful sequences, trace scenarios with failures and
//! cancels, log and agent scenarios.
//!
//! `cargo test -p metropolis-service --test fuzz_corpus -- --ignored
//! generate_seeds` writes them to `fuzz/seeds/<target>/<name>`. They are
//! kept apart from the minimised corpus (a merge would drop those that add
//! no coverage of their own, though each is a scenario worth replaying):
//! `fuzz/run.sh` hands them to libFuzzer as a second corpus directory,
//! and the replay test runs them too.

use metropolis_archive::Digest;
use metropolis_proto::metropolis::node::core::curator::proto::private as p;
use metropolis_proto::prelude::{agent, common, curator, debug};
use prost::Message;
use serde_json::json;

use super::input::Writer;

mod decoders;
use super::rpc::{AGENT_KEY, MACHINE_A, MACHINE_B, METHODS, Method, NODE_KEYS};

/// Seeds of one target: `(name, input)`.
pub type Seeds = Vec<(String, Vec<u8>)>;

/// Every target's seeds, by target name.
pub fn all() -> Vec<(&'static str, Seeds)> {
    vec![
        ("rpc", rpc()),
        ("watch_machine", watch()),
        ("trace_session", trace()),
        ("archive_validator", archive()),
        ("log_queries", logs()),
        ("agent_loop", agent_loop()),
        ("store_open", store_open()),
        ("leader_election_value", decoders::election()),
        ("stored_records", decoders::records()),
        ("trace_pipe_lines", decoders::lines()),
        ("loader_state", decoders::loader_state()),
    ]
}

// ---------------------------------------------------------------------------
// Archives.

/// One member of a seed archive.
enum E {
    File(String, Vec<u8>),
    Dir(String),
    Symlink(String, String),
    Hardlink(String, String),
    /// A file whose header name is written verbatim (no checks).
    RawFile(Vec<u8>, Vec<u8>),
    /// A file named through a PAX `path` record.
    PaxFile(String, Vec<u8>),
}

fn file(path: &str, data: impl Into<Vec<u8>>) -> E {
    E::File(path.to_owned(), data.into())
}

fn header(kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h
}

/// A complete tar archive (with the end marker).
fn build(entries: &[E]) -> Vec<u8> {
    use tar::EntryType as T;
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let done = match e {
            E::File(path, data) => {
                let mut h = header(T::Regular, data.len() as u64);
                b.append_data(&mut h, path, &data[..])
            }
            E::Dir(path) => {
                let mut h = header(T::Directory, 0);
                b.append_data(&mut h, path, std::io::empty())
            }
            E::Symlink(path, target) => {
                let mut h = header(T::Symlink, 0);
                b.append_link(&mut h, path, target)
            }
            E::Hardlink(path, target) => {
                let mut h = header(T::Link, 0);
                b.append_link(&mut h, path, target)
            }
            E::RawFile(path, data) => {
                let mut h = header(T::Regular, data.len() as u64);
                h.as_old_mut().name[..path.len()].copy_from_slice(path);
                h.set_cksum();
                b.append(&h, &data[..])
            }
            E::PaxFile(path, data) => b
                .append_pax_extensions([("path", path.as_bytes())])
                .and_then(|()| {
                    let mut h = header(T::Regular, data.len() as u64);
                    h.as_old_mut().name[..11].copy_from_slice(b"placeholder");
                    h.set_cksum();
                    b.append(&h, &data[..])
                }),
        };
        done.expect("building a seed archive in memory");
    }
    b.into_inner().expect("finishing a seed archive")
}

fn sha(data: &[u8]) -> Digest {
    Digest::of(data)
}

fn to_vec(v: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("serialising seed JSON")
}

fn layer(name: &str, content: &str) -> Vec<u8> {
    build(&[file(name, content.as_bytes().to_vec())])
}

fn config(diff_ids: &[Digest], healthcheck: bool) -> Vec<u8> {
    let mut c = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids.iter().map(|d| d.to_string()).collect::<Vec<_>>()},
    });
    if healthcheck {
        c["config"]["Healthcheck"] = json!({"Test": ["CMD", "true"]});
    }
    to_vec(&c)
}

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

fn descriptor(media_type: &str, data: &[u8]) -> serde_json::Value {
    json!({"mediaType": media_type, "digest": sha(data).to_string(), "size": data.len()})
}

fn oci_manifest(config: &[u8], layers: &[Vec<u8>]) -> Vec<u8> {
    to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": descriptor(OCI_CONFIG, config),
        "layers": layers.iter().map(|l| descriptor(OCI_LAYER, l)).collect::<Vec<_>>(),
    }))
}

fn blob(data: &[u8]) -> E {
    file(&format!("blobs/sha256/{}", sha(data).hex()), data.to_vec())
}

/// A `docker save` archive (v1.2 with a healthcheck, else v1.1) with
/// `layers` layers.
fn docker(layers: &[Vec<u8>], healthcheck: bool, tags: &[&str]) -> Vec<u8> {
    let diff_ids: Vec<Digest> = layers.iter().map(|l| sha(l)).collect();
    let config = config(&diff_ids, healthcheck);
    let ids: Vec<String> = (0..layers.len())
        .map(|i| sha(format!("id{i}").as_bytes()).hex())
        .collect();
    let manifest = json!([{
        "Config": format!("{}.json", sha(&config).hex()),
        "RepoTags": tags,
        "Layers": ids.iter().map(|id| format!("{id}/layer.tar")).collect::<Vec<_>>(),
    }]);
    let mut entries = Vec::new();
    for (id, layer) in ids.iter().zip(layers) {
        entries.push(E::Dir(format!("{id}/")));
        entries.push(file(&format!("{id}/VERSION"), "1.0"));
        entries.push(file(&format!("{id}/json"), format!("{{\"id\":\"{id}\"}}")));
        entries.push(file(&format!("{id}/layer.tar"), layer.clone()));
    }
    entries.push(file(&format!("{}.json", sha(&config).hex()), config));
    entries.push(file("manifest.json", to_vec(&manifest)));
    build(&entries)
}

/// An OCI image layout with one image, named by an annotation.
fn oci(layers: &[Vec<u8>], name: Option<&str>, extra: Vec<E>) -> Vec<u8> {
    let diff_ids: Vec<Digest> = layers.iter().map(|l| sha(l)).collect();
    let config = config(&diff_ids, false);
    let manifest = oci_manifest(&config, layers);
    let mut d = descriptor(OCI_MANIFEST, &manifest);
    if let Some(name) = name {
        d["annotations"] = json!({"org.opencontainers.image.ref.name": name});
    }
    let index = json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [d]});
    let mut entries = vec![
        file(
            "oci-layout",
            to_vec(&json!({"imageLayoutVersion": "1.0.0"})),
        ),
        E::Dir("blobs/".into()),
        E::Dir("blobs/sha256/".into()),
    ];
    entries.extend(layers.iter().map(|l| blob(l)));
    entries.push(blob(&config));
    entries.push(blob(&manifest));
    entries.extend(extra);
    entries.push(file("index.json", to_vec(&index)));
    build(&entries)
}

/// A Docker 25+ archive: an OCI layout plus `manifest.json` reaching a
/// layer through a legacy-path symlink.
fn docker25() -> Vec<u8> {
    let layers = vec![layer("hello.txt", "hello"), layer("world.txt", "world!")];
    let diff_ids: Vec<Digest> = layers.iter().map(|l| sha(l)).collect();
    let config = config(&diff_ids, true);
    let manifest = oci_manifest(&config, &layers);
    let index = to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{
            "mediaType": OCI_MANIFEST,
            "digest": sha(&manifest).to_string(),
            "size": manifest.len(),
            "annotations": {"io.containerd.image.name": "docker.io/library/busybox:latest"},
        }],
    }));
    let id = sha(b"id0").hex();
    let legacy = json!([{
        "Config": format!("blobs/sha256/{}", sha(&config).hex()),
        "RepoTags": ["busybox:latest"],
        "Layers": [format!("{id}/layer.tar"), format!("blobs/sha256/{}", sha(&layers[1]).hex())],
    }]);
    build(&[
        E::Dir("blobs/".into()),
        E::Dir("blobs/sha256/".into()),
        blob(&layers[0]),
        blob(&layers[1]),
        blob(&config),
        blob(&manifest),
        E::Dir(format!("{id}/")),
        E::Symlink(
            format!("{id}/layer.tar"),
            format!("../blobs/sha256/{}", sha(&layers[0]).hex()),
        ),
        file("index.json", index),
        file("manifest.json", to_vec(&legacy)),
        file(
            "oci-layout",
            to_vec(&json!({"imageLayoutVersion": "1.0.0"})),
        ),
    ])
}

/// Named archives: valid ones first, then hostile ones.
fn archives() -> Vec<(&'static str, Vec<u8>)> {
    let l1 = layer("hello.txt", "hello");
    let l2 = layer("world.txt", "world!");
    let gz = b"\x1f\x8b\x08\x00compressed-layer".to_vec();
    let mut truncated = docker(std::slice::from_ref(&l1), true, &["busybox:latest"]);
    truncated.truncate(truncated.len() - 1024 - 100);
    let mut bad_checksum = docker(std::slice::from_ref(&l1), false, &["a:b"]);
    bad_checksum[148] ^= 1;
    let mut trailing = oci(
        std::slice::from_ref(&l1),
        Some("example.com/app:v1"),
        vec![],
    );
    trailing.extend_from_slice(b"garbage after the end marker");
    let mut corrupt_blob = oci(std::slice::from_ref(&l2), None, vec![]);
    if let Some(pos) = corrupt_blob.windows(6).position(|w| w == b"world!") {
        corrupt_blob[pos] = b'W';
    }
    vec![
        (
            "docker-v1.2",
            docker(&[l1.clone(), l2.clone()], true, &["busybox:latest"]),
        ),
        (
            "docker-v1.1",
            docker(
                std::slice::from_ref(&l1),
                false,
                &["registry.example.com/tools/busybox:1.36"],
            ),
        ),
        (
            "docker-untagged",
            docker(std::slice::from_ref(&l2), false, &[]),
        ),
        (
            "docker-gzip-layer",
            docker(std::slice::from_ref(&gz), false, &["gz:latest"]),
        ),
        ("docker25", docker25()),
        (
            "oci",
            oci(
                &[l1.clone(), l2.clone()],
                Some("example.com/app:v1"),
                vec![],
            ),
        ),
        ("oci-unnamed", oci(std::slice::from_ref(&l1), None, vec![])),
        (
            "oci-bare-tag",
            oci(std::slice::from_ref(&l2), Some("latest"), vec![]),
        ),
        (
            "oci-links",
            oci(
                std::slice::from_ref(&l1),
                None,
                vec![
                    E::Dir("extra/".into()),
                    E::Symlink("extra/sym".into(), "../oci-layout".into()),
                    E::Hardlink("extra/hard".into(), "oci-layout".into()),
                    E::PaxFile(
                        format!("extra/{}", "long-name-".repeat(12)),
                        b"pax".to_vec(),
                    ),
                    file(&format!("extra/{}", "gnu-long-".repeat(14)), "gnu"),
                ],
            ),
        ),
        ("empty", build(&[])),
        (
            "traversal",
            build(&[E::RawFile(b"a/../../escape".to_vec(), b"x".to_vec())]),
        ),
        (
            "absolute",
            build(&[E::RawFile(b"/etc/passwd".to_vec(), b"x".to_vec())]),
        ),
        (
            "symlink-escape",
            build(&[
                E::Symlink("a".into(), "../../etc".into()),
                file("manifest.json", "[]"),
            ]),
        ),
        ("duplicate", build(&[file("a", "1"), file("a", "2")])),
        ("truncated", truncated),
        ("bad-checksum", bad_checksum),
        ("trailing-data", trailing),
        ("corrupt-blob", corrupt_blob),
        (
            "bad-json",
            build(&[file("manifest.json", "[{\"Config\": 1")]),
        ),
    ]
}

/// Archive seeds: each archive under a few chunkings and limits.
pub fn archive() -> Seeds {
    let heads: [(&str, [u8; 6]); 4] = [
        ("whole", [0, 0, 0, 0, 0, 0]),
        ("bytes", [1, 0, 1, 7, 0, 200]),
        ("blocks", [3, 2, 0, 1, 2, 3]),
        ("tight", [2, 1, 3, 9, 1, 4]),
    ];
    let mut out = Vec::new();
    for (i, (name, archive)) in archives().into_iter().enumerate() {
        let (hname, head) = heads[i % heads.len()];
        out.push((format!("{name}-{hname}"), [&head[..], &archive].concat()));
        if i < 6 {
            let (hname, head) = heads[(i + 1) % heads.len()];
            out.push((format!("{name}-{hname}"), [&head[..], &archive].concat()));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// RPCs.

fn method_index(m: Method) -> u8 {
    METHODS
        .iter()
        .position(|x| *x == m)
        .and_then(|i| u8::try_from(i).ok())
        .expect("a listed method")
}

/// Callers, by the harness's numbering.
mod who {
    pub const NONE: u8 = 0;
    pub const OWNER: u8 = 1;
    pub const NODE1: u8 = 2;
    pub const NODE2: u8 = 3;
    pub const NODE3: u8 = 4;
    pub const AGENT: u8 = 5;
    pub const OTHER_AGENT: u8 = 6;
}

/// Builds an `rpc` input.
struct Rpc(Writer);

impl Rpc {
    fn new(flags: u8) -> Rpc {
        let mut w = Writer::new();
        w.u8(flags);
        Rpc(w)
    }

    fn call_framed(&mut self, m: Method, who: u8, framing: u8, msg: &[u8]) -> &mut Rpc {
        self.0.u8(0).u8(method_index(m)).u8(who).u8(framing);
        if m == Method::LoadImage {
            self.0.u8(0);
        }
        self.0.lp(msg);
        self
    }

    fn call(&mut self, m: Method, who: u8, msg: &impl Message) -> &mut Rpc {
        self.call_framed(m, who, 0, &msg.encode_to_vec())
    }

    fn load_image(&mut self, parts: &[&[u8]]) -> &mut Rpc {
        let n = u8::try_from(parts.len().clamp(1, 4) - 1).unwrap_or(0);
        self.0
            .u8(0)
            .u8(method_index(Method::LoadImage))
            .u8(who::NONE)
            .u8(0)
            .u8(n);
        for part in parts.iter().take(4) {
            let msg = debug::ImagePart {
                data_part: bytes::Bytes::copy_from_slice(part),
            };
            self.0.lp(&msg.encode_to_vec());
        }
        self
    }

    fn fault(&mut self, b: u8) -> &mut Rpc {
        self.0.u8(5).u8(b);
        self
    }

    fn log(&mut self, dn_selector: u8, kind: u8, text: &str) -> &mut Rpc {
        self.0
            .u8(6)
            .u8(dn_selector)
            .u8(kind)
            .short_string(text)
            .u64(1_700_000_000);
        self
    }

    fn poll(&mut self) -> &mut Rpc {
        self.0.u8(7);
        self
    }

    fn finish(&mut self) -> Vec<u8> {
        self.0.finish()
    }
}

fn node_id(i: usize) -> String {
    metropolis_core::identity::NodeId::from_public_key(&NODE_KEYS[i]).to_string()
}

fn status(addr: &str) -> curator::UpdateNodeStatusRequest {
    curator::UpdateNodeStatusRequest {
        node_id: node_id(0),
        status: Some(common::NodeStatus {
            external_address: addr.into(),
            running_curator: Some(common::node_status::RunningCurator { port: 7835 }),
            ..Default::default()
        }),
    }
}

fn watch_nodes() -> curator::WatchRequest {
    curator::WatchRequest {
        kind: Some(curator::watch_request::Kind::NodesInCluster(
            curator::watch_request::NodesInCluster {},
        )),
    }
}

fn watch_node(id: String) -> curator::WatchRequest {
    curator::WatchRequest {
        kind: Some(curator::watch_request::Kind::NodeInCluster(
            curator::watch_request::NodeInCluster { node_id: id },
        )),
    }
}

fn install_request() -> Vec<u8> {
    agent::OsInstallationRequest {
        generation: 0,
        r#type: Some(agent::os_installation_request::Type::Metropolis(
            agent::MetropolisInstallationRequest {
                root_device: "/dev/vda".into(),
                ..Default::default()
            },
        )),
    }
    .encode_to_vec()
}

fn heartbeat(machine: &str, report: Option<(i64, bool)>) -> agent::HeartbeatRequest {
    use agent::os_installation_report::{Error, Result as R, Success};
    agent::HeartbeatRequest {
        machine_id: machine.into(),
        hardware_report: Some(agent::AgentHardwareReport::default()),
        installation_report: report.map(|(generation, ok)| agent::OsInstallationReport {
            generation,
            result: Some(if ok {
                R::Success(Success {})
            } else {
                R::Error(Error {
                    error: "disk missing".into(),
                })
            }),
        }),
    }
}

fn get_logs(
    dn: &str,
    filters: Vec<common::log_filter::Filter>,
    backlog: i32,
    count: i64,
    stream: i32,
) -> debug::GetLogsRequest {
    debug::GetLogsRequest {
        dn: dn.into(),
        filters: filters
            .into_iter()
            .map(|f| common::LogFilter { filter: Some(f) })
            .collect(),
        backlog_mode: backlog,
        backlog_count: count,
        stream_mode: stream,
    }
}

fn trace_request(tracer: &str, filters: &[&str], graphs: &[&str]) -> debug::TraceRequest {
    debug::TraceRequest {
        tracer: tracer.into(),
        function_filter: filters.iter().map(|s| s.to_string()).collect(),
        graph_function_filter: graphs.iter().map(|s| s.to_string()).collect(),
    }
}

/// `rpc` seeds.
pub fn rpc() -> Seeds {
    use Method::*;
    use common::log_filter::{Filter, LeveledWithMinimumSeverity, OnlyRaw, WithChildren};
    let mut out: Seeds = Vec::new();
    let mut add = |name: &str, input: Vec<u8>| out.push((name.to_string(), input));

    add(
        "status-and-watch",
        Rpc::new(0)
            .call(Watch, who::NODE1, &watch_nodes())
            .call(UpdateNodeStatus, who::NODE1, &status("10.0.0.1"))
            .poll()
            .call(UpdateNodeStatus, who::NODE1, &status("fd00::1"))
            .call(Watch, who::NODE2, &watch_node(node_id(0)))
            .finish(),
    );
    add(
        "status-denied",
        Rpc::new(0)
            .call(UpdateNodeStatus, who::NODE2, &status("10.0.0.1"))
            .call(UpdateNodeStatus, who::OWNER, &status("10.0.0.1"))
            .call(UpdateNodeStatus, who::NONE, &status("10.0.0.1"))
            .call(UpdateNodeStatus, who::AGENT, &status("10.0.0.1"))
            .call(UpdateNodeStatus, who::NODE1, &status("node1.example"))
            .finish(),
    );
    let mut unregistered = status("10.0.0.3");
    unregistered.node_id = node_id(2);
    add(
        "status-unregistered",
        Rpc::new(0)
            .call(UpdateNodeStatus, who::NODE3, &unregistered)
            .call(Watch, who::NODE3, &watch_node("metropolis-xyz".into()))
            .call(Watch, who::NODE3, &curator::WatchRequest { kind: None })
            .finish(),
    );
    add(
        "nodes-add-remove",
        Rpc::new(0)
            .call(Watch, who::OWNER, &watch_nodes())
            .call(Watch, who::OWNER, &watch_node(node_id(1)))
            .call(
                RemoveNode,
                who::OWNER,
                &p::RemoveNodeRequest {
                    node_id: node_id(1),
                },
            )
            .poll()
            .call(
                RemoveNode,
                who::OWNER,
                &p::RemoveNodeRequest {
                    node_id: node_id(1),
                },
            )
            .call(
                AddNode,
                who::OWNER,
                &p::AddNodeRequest {
                    public_key: NODE_KEYS[1].to_vec().into(),
                },
            )
            .call(
                AddNode,
                who::OWNER,
                &p::AddNodeRequest {
                    public_key: NODE_KEYS[2].to_vec().into(),
                },
            )
            .call(
                AddNode,
                who::OWNER,
                &p::AddNodeRequest {
                    public_key: vec![1, 2, 3].into(),
                },
            )
            .call(
                AddNode,
                who::NODE1,
                &p::AddNodeRequest {
                    public_key: NODE_KEYS[2].to_vec().into(),
                },
            )
            .poll()
            .finish(),
    );
    add(
        "provisioning",
        Rpc::new(0)
            .call(Heartbeat, who::AGENT, &heartbeat(MACHINE_A, None))
            .call(
                SubmitInstallationRequest,
                who::OWNER,
                &p::SubmitInstallationRequestRequest {
                    machine_id: MACHINE_A.into(),
                    request: install_request().into(),
                },
            )
            .call(Heartbeat, who::AGENT, &heartbeat(MACHINE_A, None))
            .call(
                Heartbeat,
                who::AGENT,
                &heartbeat(MACHINE_A, Some((1, true))),
            )
            .call(
                Heartbeat,
                who::AGENT,
                &heartbeat(MACHINE_A, Some((1, false))),
            )
            .call(
                GetMachine,
                who::OWNER,
                &p::GetMachineRequest {
                    machine_id: MACHINE_A.into(),
                },
            )
            .finish(),
    );
    add(
        "machines",
        Rpc::new(0)
            .call(
                AddMachine,
                who::OWNER,
                &p::AddMachineRequest {
                    machine_id: MACHINE_B.into(),
                    agent_public_key: [9u8; 32].to_vec().into(),
                },
            )
            .call(
                AddMachine,
                who::OWNER,
                &p::AddMachineRequest {
                    machine_id: MACHINE_A.into(),
                    agent_public_key: AGENT_KEY.to_vec().into(),
                },
            )
            .call(ListMachines, who::OWNER, &p::ListMachinesRequest {})
            .call(Heartbeat, who::OTHER_AGENT, &heartbeat(MACHINE_B, None))
            .call(Heartbeat, who::OTHER_AGENT, &heartbeat(MACHINE_A, None))
            .call(Heartbeat, who::NODE1, &heartbeat(MACHINE_A, None))
            .call(Heartbeat, who::AGENT, &heartbeat("not-a-uuid", None))
            .call(
                GetMachine,
                who::OWNER,
                &p::GetMachineRequest {
                    machine_id: "nope".into(),
                },
            )
            .call(
                SubmitInstallationRequest,
                who::OWNER,
                &p::SubmitInstallationRequestRequest {
                    machine_id: MACHINE_B.into(),
                    request: vec![0xff, 0x01].into(),
                },
            )
            .finish(),
    );
    add(
        "logs",
        Rpc::new(0)
            .call(
                GetLogs,
                who::NONE,
                &get_logs("root", vec![Filter::WithChildren(WithChildren {})], 2, 0, 1),
            )
            .call(
                GetLogs,
                who::NONE,
                &get_logs("root.curator", vec![], 3, 1, 2),
            )
            .log(1, 0, "a leveled line")
            .log(1, 1, "a raw line")
            .call(
                GetLogs,
                who::NONE,
                &get_logs(
                    "root",
                    vec![
                        Filter::WithChildren(WithChildren {}),
                        Filter::LeveledWithMinimumSeverity(LeveledWithMinimumSeverity {
                            minimum: 2,
                        }),
                    ],
                    1,
                    0,
                    2,
                ),
            )
            .call(
                GetLogs,
                who::NONE,
                &get_logs("root.nothing", vec![], 2, 0, 1),
            )
            .call(
                GetLogs,
                who::NONE,
                &get_logs("Root", vec![Filter::OnlyRaw(OnlyRaw {})], 0, 0, 1),
            )
            .finish(),
    );
    add(
        "kubeconfig",
        Rpc::new(0)
            .call(
                GetDebugKubeconfig,
                who::NONE,
                &debug::GetDebugKubeconfigRequest {
                    id: "alice".into(),
                    groups: vec!["dev".into(), "system:masters".into()],
                },
            )
            .call(
                GetDebugKubeconfig,
                who::NONE,
                &debug::GetDebugKubeconfigRequest {
                    id: "".into(),
                    groups: vec![],
                },
            )
            .call(
                GetDebugKubeconfig,
                who::NONE,
                &debug::GetDebugKubeconfigRequest {
                    id: "bob".into(),
                    groups: vec!["a\nb".into()],
                },
            )
            .finish(),
    );
    for (name, flags) in [("trace-global", 0), ("trace-instances", 1)] {
        add(
            name,
            Rpc::new(flags)
                .call(Trace, who::NONE, &trace_request("nop", &[], &[]))
                .call(
                    Trace,
                    who::NONE,
                    &trace_request("function_graph", &["vfs_*", "do_sys_open"], &["schedule"]),
                )
                .call(Trace, who::NONE, &trace_request("function", &[], &[]))
                .call(
                    Trace,
                    who::NONE,
                    &trace_request("blk", &["nomatch_fn"], &[]),
                )
                .call(Trace, who::NONE, &trace_request("bad/name", &[], &[]))
                .finish(),
        );
    }
    let docker = docker(&[layer("hello.txt", "hello")], true, &["busybox:latest"]);
    let (a, b) = docker.split_at(docker.len() / 3);
    let oci = oci(&[layer("a", "first")], Some("example.com/app:v1"), vec![]);
    let third = oci.len() / 3;
    add(
        "load-image",
        Rpc::new(0)
            .load_image(&[a, b])
            .load_image(&[&oci[..third], &oci[third..2 * third], &oci[2 * third..]])
            .load_image(&[&oci[..oci.len() - 600]])
            .load_image(&[b"not an archive"])
            .finish(),
    );
    add(
        "faults",
        Rpc::new(0)
            .call(Watch, who::NODE1, &watch_nodes())
            .fault(0)
            .call(UpdateNodeStatus, who::NODE1, &status("10.0.0.1"))
            .fault(1)
            .call(UpdateNodeStatus, who::NODE1, &status("10.0.0.2"))
            .fault(3)
            .call(UpdateNodeStatus, who::NODE1, &status("10.0.0.3"))
            .poll()
            .fault(2)
            .poll()
            .call(Watch, who::NODE1, &watch_nodes())
            .fault(129)
            .call(Heartbeat, who::AGENT, &heartbeat(MACHINE_A, None))
            .finish(),
    );
    add(
        "framings",
        Rpc::new(0)
            .call_framed(
                UpdateNodeStatus,
                who::NODE1,
                3 + 8 * 2,
                &status("10.0.0.1").encode_to_vec(),
            )
            .call_framed(
                UpdateNodeStatus,
                who::NODE1,
                4,
                &status("10.0.0.1").encode_to_vec(),
            )
            .call_framed(
                UpdateNodeStatus,
                who::NODE1,
                5,
                &status("10.0.0.1").encode_to_vec(),
            )
            .call_framed(
                UpdateNodeStatus,
                who::NODE1,
                6 + 8 * 20,
                &status("10.0.0.1").encode_to_vec(),
            )
            .call_framed(
                UpdateNodeStatus,
                who::NODE1,
                6,
                &status("10.0.0.1").encode_to_vec(),
            )
            .call_framed(
                UpdateNodeStatus,
                who::NODE1,
                7,
                &status("10.0.0.1").encode_to_vec(),
            )
            .call_framed(Heartbeat, who::AGENT, 0, &[0xff, 0xff])
            .call_framed(GetLogs, who::NONE, 4, b"raw")
            .call_framed(Watch, who::NODE1, 3, &watch_nodes().encode_to_vec())
            .finish(),
    );
    add(
        "unknown",
        Rpc::new(0)
            .call_framed(Missing, who::OWNER, 0, b"")
            .call_framed(NoService, who::OWNER, 0, b"")
            .call_framed(Missing, who::NONE, 0, b"")
            .finish(),
    );
    out
}

// ---------------------------------------------------------------------------
// The machines.

/// `watch_machine` seeds: puts, deletes, resyncs, reads.
pub fn watch() -> Seeds {
    let ops: [(&str, u8, &[u8]); 4] = [
        ("basic", 0, &[0, 1, 0, 2, 3, 3, 2, 1, 3, 3, 0, 1, 3, 3]),
        (
            "resync",
            10,
            &[0, 0, 0, 1, 0, 7, 3, 1, 30, 0b10, 3, 3, 2, 0, 3, 3],
        ),
        (
            "large",
            0,
            &[252, 0, 252, 1, 252, 2, 3, 1, 3, 1, 2, 1, 3, 3],
        ),
        (
            "singles",
            255,
            &[0, 0, 3, 3, 2, 0, 0, 0, 3, 3, 0, 7, 2, 7, 3, 3, 30, 0xff],
        ),
    ];
    ops.iter()
        .map(|(name, limit, ops)| (name.to_string(), [&[*limit][..], ops].concat()))
        .collect()
}

/// `trace_session` seeds.
pub fn trace() -> Seeds {
    let requests = [
        ("nop", trace_request("nop", &[], &[])),
        (
            "graph",
            trace_request("function_graph", &["vfs_*", "do_sys_open"], &["schedule"]),
        ),
        ("forbidden", trace_request("function", &[], &[])),
        (
            "nomatch",
            trace_request("blk", &["ok", "nomatch_fn"], &["nomatch_g"]),
        ),
        ("invalid", trace_request("bad name", &[], &[])),
    ];
    let schedules: [(&str, Vec<u8>); 5] = [
        ("clean", vec![]),
        ("fail-tracer", vec![0, 0, 0, 0xF3]),
        (
            "fail-teardown",
            vec![0, 0, 0, 0, 0, 0, 0, 0, 0xF6, 0xF4, 0xF6],
        ),
        ("cancel-start", vec![0, 0xE0]),
        ("gone", vec![0, 0, 0, 0, 0, 0, 0, 0xF0]),
    ];
    let script = {
        let mut w = Writer::new();
        w.u8(0)
            .short_string("  <idle>-0 [000] d.h1 1.000: sched_switch")
            .u8(1)
            .short_string("no newline\n")
            .u8(5)
            .u8(0)
            .short_string("");
        w.finish()
    };
    let mut out = Vec::new();
    for (i, (rname, request)) in requests.iter().enumerate() {
        for (j, (sname, schedule)) in schedules.iter().enumerate() {
            if (i + j) % 2 == 1 {
                continue;
            }
            let flags = [0u8, 1, 32, 33, 16 | 4, 1 | 2, 8 | 32][(i * 5 + j) % 7];
            let ending = [2u8, 3, 4][(i + j) % 3];
            let mut w = Writer::new();
            w.u8(flags)
                .lp(&request.encode_to_vec())
                .lp(schedule)
                .bytes(&script)
                .u8(ending);
            out.push((format!("{rname}-{sname}-{flags}"), w.finish()));
        }
    }
    out
}

/// `log_queries` seeds.
pub fn logs() -> Seeds {
    let mut out = Vec::new();
    for (name, max_bytes, per_dn, queued) in [("roomy", 60_000u16, 7u8, 7u8), ("tight", 400, 2, 1)]
    {
        let mut w = Writer::new();
        w.u16(max_bytes).u8(per_dn).u8(queued);
        // Follow root with children, then insert everywhere.
        w.u8(2).u8(0).u8(1).u8(1).u8(2).u8(0).u8(2);
        w.u8(3).u8(1).u8(1).u8(4).u8(2).u8(0).u8(2);
        for (i, dn) in [0u8, 1, 2, 3, 4, 5, 6, 7, 1, 2].iter().enumerate() {
            let kind = u8::try_from(i).unwrap_or(0) * 3;
            w.u8(0)
                .u8(*dn)
                .u8(kind)
                .short_string(&"x".repeat(i * 7))
                .u64(1_000 * i as u64);
        }
        // Backlogs: all with children; count 3 only leveled; raw only.
        w.u8(2).u8(0).u8(1).u8(1).u8(2).u8(0).u8(1);
        w.u8(2).u8(1).u8(1).u8(3).u8(3).u8(3).u8(1);
        w.u8(2).u8(2).u8(2).u8(2).u8(4).u8(2).u8(2).u8(0).u8(1);
        // Invalid: unknown DN, bad DN, empty filter, conflicting kinds.
        w.u8(2)
            .u8(250)
            .short_string("root.nothing")
            .u8(0)
            .u8(2)
            .u8(0)
            .u8(1);
        w.u8(2)
            .u8(250)
            .short_string("Bad..DN")
            .u8(0)
            .u8(2)
            .u8(0)
            .u8(1);
        w.u8(2).u8(0).u8(1).u8(0).u8(2).u8(0).u8(1);
        w.u8(2).u8(0).u8(2).u8(2).u8(3).u8(2).u8(0).u8(1);
        // Poll, cancel, poll.
        w.u8(4).u8(0).u8(5).u8(0).u8(4).u8(1);
        out.push((name.to_string(), w.finish()));
    }
    out
}

/// `agent_loop` seeds.
pub fn agent_loop() -> Seeds {
    let config = |w: &mut Writer, interval: u16, base: u16, cap: u8| {
        w.u16(interval)
            .u8(0)
            .u8(51)
            .u8(26)
            .u16(base)
            .u8(0)
            .u8(cap)
            .u8(32);
        w.u64(42).u8(0).u8(0);
    };
    let mut out = Vec::new();
    // An install, acknowledged.
    let mut w = Writer::new();
    config(&mut w, 30_000, 1_000, 60);
    w.u8(1)
        .u8(0)
        .u8(1)
        .u8(0)
        .u8(1)
        .u8(1)
        .u8(5)
        .u8(1)
        .u8(0)
        .u8(1)
        .u8(7)
        .u16(40_000)
        .u8(0)
        .u8(1);
    out.push(("install".to_string(), w.finish()));
    // Lost responses, a restart mid-install, a re-offer.
    let mut w = Writer::new();
    config(&mut w, 5_000, 100, 10);
    w.u8(0)
        .u8(1)
        .u8(0)
        .u8(1)
        .u8(4)
        .u8(1)
        .u8(7)
        .u16(200)
        .u8(0)
        .u8(1)
        .u8(6)
        .u8(1);
    w.u8(1)
        .u8(4)
        .u8(0)
        .u8(7)
        .u16(60_000)
        .u8(0)
        .u8(1)
        .u8(5)
        .u8(0)
        .u8(0)
        .u8(1);
    out.push(("restart".to_string(), w.finish()));
    // Forged offers and stray install results.
    let mut w = Writer::new();
    config(&mut w, 1_000, 10, 255);
    w.u8(3).u8(1).u8(5).u8(0).lp(b"forged");
    w.u8(5).u8(1).u8(250).u8(3).u8(0).lp(&install_request());
    w.u8(7).u16(u16::MAX).u8(47).u8(1);
    out.push(("forged".to_string(), w.finish()));
    // An invalid configuration.
    let mut w = Writer::new();
    w.u16(0).u8(0);
    out.push(("invalid".to_string(), w.finish()));
    out
}

// ---------------------------------------------------------------------------
// The embedded store's files.

/// The files a real store leaves after `writes` transactions (values of
/// `len` bytes), with a snapshot every `threshold` bytes of WAL.
fn store_files(writes: u64, len: usize, threshold: u64) -> Vec<(&'static str, Vec<u8>)> {
    use metropolis_core::store::{Op, Txn};
    use metropolis_store::disk::Disk;
    use metropolis_store::{EmbeddedStore, StoreOptions};
    use std::sync::Arc;

    let disk = crate::disk::SimDisk::new(0);
    let dir = std::path::Path::new(super::store_open::DIR);
    let options = StoreOptions::default()
        .with_snapshot_threshold(threshold)
        .with_commit_delay(std::time::Duration::ZERO)
        .with_disk(Arc::new(disk.clone()));
    let Ok(store) = EmbeddedStore::open(dir, options) else {
        return Vec::new();
    };
    for n in 0..writes {
        let txn = Txn {
            compares: Vec::new(),
            success: vec![Op::Put {
                key: format!("k/{n}").into_bytes().into(),
                value: vec![b'v'; len].into(),
                lease: 0,
            }],
            failure: Vec::new(),
        };
        if futures::executor::block_on(store.txn(txn)).is_err() {
            return Vec::new();
        }
    }
    drop(store);
    ["wal", "snapshot"]
        .into_iter()
        .filter_map(|name| {
            let data = disk.read(&dir.join(name)).ok()??;
            Some((name, data))
        })
        .collect()
}

/// A `store_open` input holding `files`, each as its bytes up to the last
/// non-zero one and the count of zeros after.
fn store_input(direct: bool, files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut flags = u8::from(direct);
    for (bit, name) in super::store_open::FILES {
        if files.iter().any(|(n, _)| *n == name) {
            flags |= bit;
        }
    }
    let mut w = Writer::new();
    w.u8(flags);
    for (_, name) in super::store_open::FILES {
        if let Some((_, data)) = files.iter().find(|(n, _)| *n == name) {
            let end = data.iter().rposition(|b| *b != 0).map_or(0, |p| p + 1);
            let zeros = u16::try_from(data.len() - end).unwrap_or(u16::MAX);
            w.lp(&data[..end]).u16(zeros);
        }
    }
    w.finish()
}

/// `store_open` seeds: an empty directory, a store's WAL, a WAL and a
/// snapshot, a torn last batch, a flipped byte in an acknowledged batch,
/// leftover temporary files.
pub fn store_open() -> Seeds {
    let mut out = vec![("empty".to_string(), store_input(true, &[]))];
    let wal_only = store_files(12, 40, 64 << 20);
    out.push(("wal".to_string(), store_input(true, &wal_only)));
    out.push(("wal-buffered".to_string(), store_input(false, &wal_only)));
    let both = store_files(30, 300, 2 << 10);
    out.push(("wal-and-snapshot".to_string(), store_input(true, &both)));
    if let Some((_, wal)) = wal_only.iter().find(|(n, _)| *n == "wal") {
        let end = wal.iter().rposition(|b| *b != 0).map_or(0, |p| p + 1);
        let mut torn = wal.clone();
        for b in &mut torn[end.saturating_sub(5)..end] {
            *b ^= 0x5a;
        }
        out.push((
            "torn-last-batch".to_string(),
            store_input(true, &[("wal", torn)]),
        ));
        let mut damaged = wal.clone();
        if let Some(b) = damaged.get_mut(60) {
            *b ^= 1;
        }
        out.push((
            "damaged-batch".to_string(),
            store_input(true, &[("wal", damaged)]),
        ));
        let leftovers = [
            ("wal", wal.clone()),
            ("wal.tmp", wal[..end / 2].to_vec()),
            ("snapshot.tmp", b"MTRPSNAP".to_vec()),
        ];
        out.push(("leftovers".to_string(), store_input(true, &leftovers)));
    }
    out
}

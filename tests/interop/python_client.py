#!/usr/bin/env python3
"""The Python grpcio client of the interoperability suite.

Run by tests/tests/interop.rs against a real metropolisd:

    python3 python_client.py CONFIG.json

CONFIG names the daemon's endpoints and files (see tests/src/interop.rs).
Every scenario runs with grpcio's default channel settings and prints one
JSON line: {"scenario", "endpoint", "ok", "skipped", "detail"}. Stubs of
the project's services are generated into a temporary directory with
grpc_tools.protoc from proto/; health and reflection stubs come from
grpcio-health-checking and grpcio-reflection.
"""

import base64
import datetime
import importlib
import json
import os
import re
import sys
import tempfile
import time
import traceback

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import NameOID
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2


# The files whose services the suite calls; their imports are generated too.
SERVICE_PROTOS = [
    "metropolis/node/core/curator/proto/api/api.proto",
    "cloud/bmaas/server/api/agent.proto",
    "metropolis/proto/api/debug.proto",
]
UNARY_TIMEOUT = 10
STREAM_TIMEOUT = 20
SERVICES = {
    "curator": "metropolis.node.core.curator.proto.api.Curator",
    "debug": "metropolis.proto.api.NodeDebugService",
}


class Skip(Exception):
    """The scenario cannot run on this machine (e.g. no tracefs)."""


def check(ok, message):
    """Fails the scenario with `message` unless `ok`."""
    if not ok:
        raise AssertionError(message)


def wait_tracefs_restored(tracefs):
    """Waits until the daemon put tracefs back: tracer nop, tracing off."""
    deadline = time.monotonic() + 10
    while True:
        tracer = read(os.path.join(tracefs, "current_tracer")).strip()
        on = read(os.path.join(tracefs, "tracing_on")).strip()
        if tracer == b"nop" and on == b"0":
            return
        check(time.monotonic() < deadline,
              f"tracefs not restored after cancel: current_tracer={tracer!r} tracing_on={on!r}")
        time.sleep(0.05)


def proto_closure(proto_dir):
    """The service files and every file they import from proto_dir."""
    seen, todo = [], list(SERVICE_PROTOS)
    while todo:
        name = todo.pop()
        if name in seen or name.startswith("google/protobuf/"):
            continue
        seen.append(name)
        with open(os.path.join(proto_dir, name), encoding="utf-8") as f:
            todo.extend(re.findall(r'^\s*import\s+(?:public\s+)?"([^"]+)";', f.read(), re.M))
    return sorted(seen)


def generate_stubs(proto_dir, out_dir):
    """Generates the messages and stubs into out_dir and imports them."""
    from grpc_tools import protoc  # imported late: only this needs grpcio-tools

    well_known = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    files = proto_closure(proto_dir)
    args = ["protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", *files]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {files}")
    sys.path.insert(0, out_dir)

    def module(path):
        return importlib.import_module(path[: -len(".proto")].replace("/", ".") + "_pb2")

    def grpc_module(path):
        return importlib.import_module(path[: -len(".proto")].replace("/", ".") + "_pb2_grpc")

    return {
        "curator": module(SERVICE_PROTOS[0]),
        "curator_grpc": grpc_module(SERVICE_PROTOS[0]),
        "agent": module(SERVICE_PROTOS[1]),
        "agent_grpc": grpc_module(SERVICE_PROTOS[1]),
        "debug": module(SERVICE_PROTOS[2]),
        "debug_grpc": grpc_module(SERVICE_PROTOS[2]),
        "common": module("metropolis/proto/common/common.proto"),
        "management": module("metropolis/proto/api/management.proto"),
    }


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Client:
    """The scenarios, each a method returning a short success note."""

    def __init__(self, config, pb):
        self.c = config
        self.pb = pb
        self.ca = read(config["ca"])

    # Channels, all with grpcio's defaults.

    def unix(self):
        return grpc.insecure_channel("unix:" + self.c["socket"])

    def tls(self, addr, key=None, cert=None):
        creds = grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=key, certificate_chain=cert)
        return grpc.secure_channel(addr, creds)

    def owner(self):
        owner = os.path.join(self.c["data_dir"], "owner")
        return self.tls(self.c["curator"], read(os.path.join(owner, "owner-key.pem")),
                        read(os.path.join(owner, "owner.pem")))

    def debug(self):
        return grpc.insecure_channel(self.c["debug"])

    # 1. The UNIX socket, as this node.

    def backlog(self, channel, what):
        """Reads a NodesInCluster backlog; returns the stream and the nodes."""
        curator = self.pb["curator"]
        stub = self.pb["curator_grpc"].CuratorStub(channel)
        kind = curator.WatchRequest.NodesInCluster()
        stream = stub.Watch(curator.WatchRequest(nodes_in_cluster=kind), timeout=STREAM_TIMEOUT)
        nodes = {}
        for event in stream:
            nodes.update((n.id, n) for n in event.nodes)
            if event.progress == curator.WatchEvent.PROGRESS_LAST_BACKLOGGED:
                break
        else:
            raise AssertionError(f"{what}: the stream ended before PROGRESS_LAST_BACKLOGGED")
        me = self.c["node_id"]
        check(me in nodes, f"{what}: this node {me} is not in the backlog {sorted(nodes)}")
        return stream, nodes

    def unix_watch_and_status(self):
        curator, common = self.pb["curator"], self.pb["common"]
        me, address = self.c["node_id"], self.c["status_address"]
        with self.unix() as channel:
            nodes_stream, _ = self.backlog(channel, "Watch(NodesInCluster)")
            stub = self.pb["curator_grpc"].CuratorStub(channel)
            status = common.NodeStatus(external_address=address)
            status.timestamp.GetCurrentTime()
            stub.UpdateNodeStatus(
                curator.UpdateNodeStatusRequest(node_id=me, status=status), timeout=UNARY_TIMEOUT)
            # The open NodesInCluster stream sees the update ...
            for event in nodes_stream:
                if any(n.id == me and n.status.external_address == address for n in event.nodes):
                    break
            else:
                raise AssertionError("Watch(NodesInCluster) ended without the status update")
            nodes_stream.cancel()
            # ... and a NodeInCluster watch of this node starts with it.
            kind = curator.WatchRequest.NodeInCluster(node_id=me)
            one = stub.Watch(curator.WatchRequest(node_in_cluster=kind), timeout=STREAM_TIMEOUT)
            event = next(one)
            one.cancel()
            check([n.id for n in event.nodes] == [me],
                  f"Watch(NodeInCluster) first event has nodes {[n.id for n in event.nodes]}")
            got = event.nodes[0].status.external_address
            check(got == address, f"Watch(NodeInCluster) shows address {got!r}, not {address!r}")
            check(event.progress == curator.WatchEvent.PROGRESS_UNSPECIFIED,
                  f"Watch(NodeInCluster) event has progress {event.progress}")
        return f"backlog, UpdateNodeStatus({address}), NodeInCluster sees it"

    # 2. The owner over mutual TLS.

    def owner_watch_over_tls(self):
        with self.owner() as channel:
            stream, nodes = self.backlog(channel, "Watch(NodesInCluster) as owner")
            stream.cancel()
        return f"backlog of {len(nodes)} node(s) as the owner"

    # 3. AgentCallback with self-signed Ed25519 agent certificates.

    @staticmethod
    def self_signed(key):
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "interop agent")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=1))
                .sign(key, None))
        return cert.public_bytes(serialization.Encoding.PEM)

    def registered_agent(self):
        """The key file metroctl wrote, read as a user would, and a
        certificate self-signed over it."""
        key_pem = read(self.c["agent_key"])
        key = serialization.load_pem_private_key(key_pem, password=None)
        check(isinstance(key, ed25519.Ed25519PrivateKey), f"agent key is {type(key).__name__}")
        return self.tls(self.c["agent"], key_pem, self.self_signed(key))

    def heartbeat(self, channel, machine_id):
        stub = self.pb["agent_grpc"].AgentCallbackStub(channel)
        return stub.Heartbeat(self.pb["agent"].HeartbeatRequest(machine_id=machine_id),
                              timeout=UNARY_TIMEOUT)

    def expect_code(self, call, code, what):
        try:
            call()
        except grpc.RpcError as e:
            check(e.code() == code, f"{what}: expected {code.name}, got "
                  f"{e.code().name}: {e.details()}")
            return f"{code.name}: {e.details()}"
        raise AssertionError(f"{what}: expected {code.name}, got OK")

    def agent_registered_heartbeat(self):
        with self.registered_agent() as channel:
            resp = self.heartbeat(channel, self.c["machine_id"])
        check(not resp.HasField("installation_request"),
              "a machine without a request got an installation_request")
        return "OK, no installation request"

    def agent_unregistered_key(self):
        key = ed25519.Ed25519PrivateKey.generate()
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        with self.tls(self.c["agent"], key_pem, self.self_signed(key)) as channel:
            return self.expect_code(lambda: self.heartbeat(channel, self.c["machine_id"]),
                                    grpc.StatusCode.UNAUTHENTICATED, "an unregistered key")

    def agent_bad_machine_id(self):
        with self.registered_agent() as channel:
            return self.expect_code(lambda: self.heartbeat(channel, "not-a-uuid"),
                                    grpc.StatusCode.INVALID_ARGUMENT, "machine_id not-a-uuid")

    # 4. The debug service over plain HTTP/2.

    def kubeconfig(self, channel, ident, groups):
        stub = self.pb["debug_grpc"].NodeDebugServiceStub(channel)
        req = self.pb["debug"].GetDebugKubeconfigRequest(id=ident, groups=groups)
        return stub.GetDebugKubeconfig(req, timeout=UNARY_TIMEOUT).debug_kubeconfig

    def debug_kubeconfig(self):
        ident = "interop-python"
        with self.debug() as channel:
            yaml = self.kubeconfig(channel, ident, ["interop-a", "interop-b"])
        found = re.search(r"client-certificate-data:\s*(\S+)", yaml)
        check(found is not None and "kind: Config" in yaml, f"not a kubeconfig: {yaml[:300]!r}")
        cert = x509.load_pem_x509_certificate(base64.b64decode(found.group(1)))
        cn = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
        check(cn == [ident] and orgs == ["interop-a", "interop-b"],
              f"certificate subject CN={cn} O={orgs}")
        return f"kubeconfig for CN={ident}"

    def debug_logs(self):
        common, mgmt = self.pb["common"], self.pb["management"]
        ident = "interop-logs-python"
        with self.debug() as channel:
            self.kubeconfig(channel, ident, [])
            stub = self.pb["debug_grpc"].NodeDebugServiceStub(channel)
            req = mgmt.GetLogsRequest(
                dn="root",
                filters=[common.LogFilter(with_children=common.LogFilter.WithChildren())],
                backlog_mode=mgmt.GetLogsRequest.BACKLOG_ALL,
                stream_mode=mgmt.GetLogsRequest.STREAM_DISABLE)
            entries, streamed = [], 0
            for resp in stub.GetLogs(req, timeout=STREAM_TIMEOUT):
                entries.extend(resp.backlog_entries)
                streamed += len(resp.stream_entries)
        check(streamed == 0, f"STREAM_DISABLE sent {streamed} stream entries")
        texts = [(e.dn, " ".join(e.leveled.lines) or e.raw.data) for e in entries]
        check(any(dn == "root.debug" and f"id={ident}" in t for dn, t in texts),
              f"no root.debug entry with id={ident} among {len(texts)}: {texts[-5:]}")
        return f"{len(entries)} backlog entries, the issuance among them"

    def debug_load_image(self):
        archive = read(self.c["image_archive"])
        chunks = (self.pb["debug"].ImagePart(data_part=archive[i:i + 4096])
                  for i in range(0, len(archive), 4096))
        with self.debug() as channel:
            stub = self.pb["debug_grpc"].NodeDebugServiceStub(channel)
            stub.LoadImage(chunks, timeout=STREAM_TIMEOUT)
        with open(os.path.join(self.c["data_dir"], "images", "index.json"), encoding="utf-8") as f:
            index = json.load(f)
        names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name")
                 for m in index.get("manifests", [])]
        check(self.c["image_name"] in names, f"{self.c['image_name']} not in the store: {names}")
        return f"{len(archive)} bytes imported as {self.c['image_name']}"

    def debug_trace(self):
        tracefs = self.c.get("tracefs")
        if not tracefs:
            raise Skip("tracefs is not mounted and writable")
        marker = f"metropolis-interop-python-{os.getpid()}"
        with self.debug() as channel:
            stub = self.pb["debug_grpc"].NodeDebugServiceStub(channel)
            stream = stub.Trace(self.pb["debug"].TraceRequest(tracer="nop"), timeout=STREAM_TIMEOUT)
            # The response headers come once the session is set up.
            stream.initial_metadata()
            if stream.done():
                list(stream)  # raises the call's error
            on = read(os.path.join(tracefs, "tracing_on")).strip()
            check(on == b"1", f"tracing_on is {on!r} once the Trace call is answered")
            with open(os.path.join(tracefs, "trace_marker"), "w", encoding="utf-8") as f:
                f.write(marker)
            seen = []
            for event in stream:
                if marker in event.raw_line:
                    break
                seen.append(event.raw_line)
            else:
                raise AssertionError(f"the stream ended without {marker}; saw {seen[-5:]}")
            stream.cancel()
        wait_tracefs_restored(tracefs)
        return "marker traced; tracefs restored after cancel"

    # 5. Health on each listener; 6. reflection.

    def health(self, channel):
        resp = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=UNARY_TIMEOUT)
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        check(resp.status == health_pb2.HealthCheckResponse.SERVING, f"status {name}")
        return name

    def health_unix(self):
        with self.unix() as channel:
            return self.health(channel)

    def health_curator_tls(self):
        with self.tls(self.c["curator"]) as channel:
            return self.health(channel)

    def health_agent_tls(self):
        with self.tls(self.c["agent"]) as channel:
            return self.health(channel)

    def health_debug(self):
        with self.debug() as channel:
            return self.health(channel)

    def reflection(self, channel, version, service):
        # v1 and v1alpha are the same messages under two package names;
        # grpcio-reflection ships the v1alpha classes, used here for both.
        call = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
        requests = [reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol=service)]
        responses = list(call(iter(requests), timeout=UNARY_TIMEOUT))
        check(len(responses) == 2, f"{len(responses)} responses to 2 requests")
        listed = [s.name for s in responses[0].list_services_response.service]
        check(service in listed, f"{service} not listed: {listed}")
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in responses[1].file_descriptor_response.file_descriptor_proto]
        package, _, name = service.rpartition(".")
        check(any(f.package == package and any(s.name == name for s in f.service) for f in files),
              f"file_containing_symbol {service}: got files {[f.name for f in files]}, "
              f"error {responses[1].error_response.error_message!r}")
        return f"lists {len(listed)} services and describes {service}"

    def reflection_v1_debug(self):
        with self.debug() as channel:
            return self.reflection(channel, "v1", SERVICES["debug"])

    def reflection_v1alpha_debug(self):
        with self.debug() as channel:
            return self.reflection(channel, "v1alpha", SERVICES["debug"])

    def reflection_v1_curator_tls(self):
        with self.tls(self.c["curator"]) as channel:
            return self.reflection(channel, "v1", SERVICES["curator"])

    def reflection_v1alpha_curator_tls(self):
        with self.tls(self.c["curator"]) as channel:
            return self.reflection(channel, "v1alpha", SERVICES["curator"])


def describe(e):
    """A failure as one bounded line: the gRPC status, or the exception."""
    if isinstance(e, grpc.RpcError) and hasattr(e, "code"):
        text = f"gRPC {e.code().name}: {e.details()}"
    else:
        text = f"{type(e).__name__}: {e}"
        where = [f for f in traceback.extract_tb(e.__traceback__) if f.name != "check"]
        if where:
            text += f" (at {os.path.basename(where[-1].filename)}:{where[-1].lineno})"
    return text[:1500]


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        config = json.load(f)
    print(json.dumps({"stack": f"Python grpcio {grpc.__version__}"}), flush=True)
    with tempfile.TemporaryDirectory(prefix="interop-py-") as out:
        client = Client(config, generate_stubs(config["proto_dir"], out))
        for name, endpoint in config["scenarios"]:
            result = {"scenario": name, "endpoint": endpoint, "ok": False, "skipped": False}
            # What gRPC logs during the scenario goes to its own section.
            print(f"== scenario {name}", file=sys.stderr, flush=True)
            try:
                result["detail"] = getattr(client, name)()
                result["ok"] = True
            except Skip as e:
                result.update(ok=True, skipped=True, detail=str(e))
            except Exception as e:  # every failure is reported, none ends the run
                result["detail"] = describe(e)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env node
// The Node @grpc/grpc-js client of the interoperability suite.
//
// Run by tests/tests/interop.rs against a real metropolisd:
//
//     node node_client.js CONFIG.json
//
// CONFIG names the daemon's endpoints and files (see tests/src/interop.rs).
// Every scenario runs with grpc-js's default channel settings and prints one
// JSON line: {"scenario", "endpoint", "ok", "skipped", "detail"}. The
// project's services are loaded at run time by @grpc/proto-loader from
// proto/; health and reflection from grpc-health-check and @grpc/reflection.
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const tls = require('node:tls');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const health = require('grpc-health-check');
const descriptor = require('protobufjs/ext/descriptor');

const UNARY_MS = 10000;
const STREAM_MS = 20000;
const SERVICES = {
  curator: 'metropolis.node.core.curator.proto.api.Curator',
  debug: 'metropolis.proto.api.NodeDebugService',
};
const LOADER = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };

class Skip extends Error {}

function check(ok, message) {
  if (!ok) throw new Error(message);
}

function deadline(ms) {
  return { deadline: Date.now() + ms };
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function lookup(pkg, name) {
  return name.split('.').reduce((o, part) => o[part], pkg);
}

function loadServices(protoDir) {
  const pkg = grpc.loadPackageDefinition(protoLoader.loadSync([
    'metropolis/node/core/curator/proto/api/api.proto',
    'cloud/bmaas/server/api/agent.proto',
    'metropolis/proto/api/debug.proto',
  ], { ...LOADER, includeDirs: [protoDir] }));
  const reflectionDir = path.join(
    path.dirname(require.resolve('@grpc/reflection/package.json')), 'build', 'proto');
  const reflection = (version) => lookup(grpc.loadPackageDefinition(protoLoader.loadSync(
    `grpc/reflection/${version}/reflection.proto`, { ...LOADER, includeDirs: [reflectionDir] })),
  `grpc.reflection.${version}.ServerReflection`);
  return {
    Curator: lookup(pkg, SERVICES.curator),
    AgentCallback: lookup(pkg, 'cloud.bmaas.server.api.AgentCallback'),
    NodeDebugService: lookup(pkg, SERVICES.debug),
    Health: grpc.makeGenericClientConstructor(health.service, 'Health'),
    Reflection: { v1: reflection('v1'), v1alpha: reflection('v1alpha') },
  };
}

/// A unary call as a promise.
function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, deadline(UNARY_MS), (err, resp) => (err ? reject(err) : resolve(resp)));
  });
}

/// Reads a stream's next message; null when it ended.
async function next(it, what) {
  const { value, done } = await it.next();
  if (done) return null;
  check(value !== undefined, `${what}: no message`);
  return value;
}

class Client {
  constructor(config, services) {
    this.c = config;
    this.s = services;
    this.ca = fs.readFileSync(config.ca);
  }

  // Clients, all with grpc-js's defaults.
  unix(Service) {
    return new Service(`unix:${this.c.socket}`, grpc.credentials.createInsecure());
  }

  tls(Service, addr, key, cert) {
    return new Service(addr, grpc.credentials.createSsl(this.ca, key || null, cert || null));
  }

  // The owner's certificate is issued by the cluster CA. Given that CA
  // as a root, Node's TLS (OpenSSL) sends it along with the client
  // certificate, and the curator, as the reference, takes exactly one
  // client certificate (a chain is Unauthenticated). So the owner's
  // channel has no root and does not check the server itself; the
  // server's certificate is checked against the cluster CA by a
  // handshake of its own first (ownerServerChecked).
  owner(Service) {
    const dir = path.join(this.c.data_dir, 'owner');
    const verify = { rejectUnauthorized: false };
    return new Service(this.c.curator, grpc.credentials.createSsl(null,
      fs.readFileSync(path.join(dir, 'owner-key.pem')),
      fs.readFileSync(path.join(dir, 'owner.pem')), verify));
  }

  // Whether the curator's TLS port presents a certificate chained to the
  // cluster CA (a handshake with that CA as the only root).
  ownerServerChecked() {
    const [host, port] = [this.c.curator.replace(/:\d+$/, ''), Number(this.c.curator.split(':').pop())];
    return new Promise((resolve, reject) => {
      const socket = tls.connect({ host, port, ca: this.ca, checkServerIdentity: () => undefined,
        ALPNProtocols: ['h2'] }, () => {
        const ok = socket.authorized;
        const why = socket.authorizationError;
        socket.destroy();
        if (ok) resolve(); else reject(new Error(`the curator's certificate: ${why}`));
      });
      socket.on('error', reject);
    });
  }

  debug() {
    return new this.s.NodeDebugService(this.c.debug, grpc.credentials.createInsecure());
  }

  // 1. The UNIX socket, as this node.
  async backlog(curator, what) {
    const call = curator.Watch({ nodes_in_cluster: {} }, deadline(STREAM_MS));
    const it = call[Symbol.asyncIterator]();
    const nodes = new Map();
    for (;;) {
      const event = await next(it, what);
      check(event !== null, `${what}: the stream ended before PROGRESS_LAST_BACKLOGGED`);
      for (const n of event.nodes) nodes.set(n.id, n);
      if (event.progress === 'PROGRESS_LAST_BACKLOGGED') break;
    }
    check(nodes.has(this.c.node_id),
      `${what}: this node ${this.c.node_id} is not in the backlog ${[...nodes.keys()]}`);
    return { call, it, nodes };
  }

  async unix_watch_and_status() {
    const me = this.c.node_id;
    const address = this.c.status_address;
    const curator = this.unix(this.s.Curator);
    try {
      const all = await this.backlog(curator, 'Watch(NodesInCluster)');
      const now = Date.now();
      const status = {
        external_address: address,
        timestamp: { seconds: String(Math.floor(now / 1000)), nanos: (now % 1000) * 1e6 },
      };
      await unary(curator, 'UpdateNodeStatus', { node_id: me, status });
      // The open NodesInCluster stream sees the update ...
      for (;;) {
        const event = await next(all.it, 'Watch(NodesInCluster)');
        check(event !== null, 'Watch(NodesInCluster) ended without the status update');
        if (event.nodes.some((n) => n.id === me && n.status.external_address === address)) break;
      }
      all.call.cancel();
      // ... and a NodeInCluster watch of this node starts with it.
      const one = curator.Watch({ node_in_cluster: { node_id: me } }, deadline(STREAM_MS));
      const event = await next(one[Symbol.asyncIterator](), 'Watch(NodeInCluster)');
      one.cancel();
      check(event !== null, 'Watch(NodeInCluster) ended without an event');
      const ids = event.nodes.map((n) => n.id);
      check(ids.length === 1 && ids[0] === me, `Watch(NodeInCluster) first event has nodes ${ids}`);
      const got = event.nodes[0].status.external_address;
      check(got === address, `Watch(NodeInCluster) shows address ${got}, not ${address}`);
      check(event.progress === 'PROGRESS_UNSPECIFIED',
        `Watch(NodeInCluster) event has progress ${event.progress}`);
      return `backlog, UpdateNodeStatus(${address}), NodeInCluster sees it`;
    } finally {
      curator.close();
    }
  }

  // 2. The owner over mutual TLS.
  async owner_watch_over_tls() {
    await this.ownerServerChecked();
    const curator = this.owner(this.s.Curator);
    try {
      const { call, nodes } = await this.backlog(curator, 'Watch(NodesInCluster) as owner');
      call.cancel();
      return `backlog of ${nodes.size} node(s) as the owner`;
    } finally {
      curator.close();
    }
  }

  // 3. AgentCallback: the key metroctl wrote, with the certificate the
  // project's PKI self-signs over it; and a key nobody registered.
  agent(keyFile, certFile) {
    return this.tls(this.s.AgentCallback, this.c.agent, fs.readFileSync(keyFile),
      fs.readFileSync(certFile));
  }

  async expectCode(promise, code, what) {
    try {
      await promise;
    } catch (e) {
      if (e.code === undefined) throw e;
      const name = grpc.status[e.code];
      check(e.code === code, `${what}: expected ${grpc.status[code]}, got ${name}: ${e.details}`);
      return `${name}: ${e.details}`;
    }
    throw new Error(`${what}: expected ${grpc.status[code]}, got OK`);
  }

  async agent_registered_heartbeat() {
    const agent = this.agent(this.c.agent_key, this.c.agent_cert);
    try {
      const resp = await unary(agent, 'Heartbeat', { machine_id: this.c.machine_id });
      check(!resp.installation_request, 'a machine without a request got an installation_request');
      return 'OK, no installation request';
    } finally {
      agent.close();
    }
  }

  async agent_unregistered_key() {
    const agent = this.agent(this.c.stranger_key, this.c.stranger_cert);
    try {
      return await this.expectCode(unary(agent, 'Heartbeat', { machine_id: this.c.machine_id }),
        grpc.status.UNAUTHENTICATED, 'an unregistered key');
    } finally {
      agent.close();
    }
  }

  async agent_bad_machine_id() {
    const agent = this.agent(this.c.agent_key, this.c.agent_cert);
    try {
      return await this.expectCode(unary(agent, 'Heartbeat', { machine_id: 'not-a-uuid' }),
        grpc.status.INVALID_ARGUMENT, 'machine_id not-a-uuid');
    } finally {
      agent.close();
    }
  }

  // 4. The debug service over plain HTTP/2.
  async debug_kubeconfig() {
    const id = 'interop-node';
    const debug = this.debug();
    try {
      const resp = await unary(debug, 'GetDebugKubeconfig', { id, groups: ['interop-a', 'interop-b'] });
      const yaml = resp.debug_kubeconfig;
      const found = /client-certificate-data:\s*(\S+)/.exec(yaml);
      check(found && yaml.includes('kind: Config'), `not a kubeconfig: ${yaml.slice(0, 300)}`);
      const cert = new crypto.X509Certificate(Buffer.from(found[1], 'base64'));
      const subject = cert.subject.split('\n');
      const cn = subject.filter((l) => l.startsWith('CN=')).map((l) => l.slice(3));
      const orgs = subject.filter((l) => l.startsWith('O=')).map((l) => l.slice(2));
      check(cn.join() === id && orgs.join() === 'interop-a,interop-b',
        `certificate subject ${JSON.stringify(cert.subject)}`);
      return `kubeconfig for CN=${id}`;
    } finally {
      debug.close();
    }
  }

  async debug_logs() {
    const id = 'interop-logs-node';
    const debug = this.debug();
    try {
      await unary(debug, 'GetDebugKubeconfig', { id, groups: [] });
      const call = debug.GetLogs({
        dn: 'root',
        filters: [{ with_children: {} }],
        backlog_mode: 'BACKLOG_ALL',
        stream_mode: 'STREAM_DISABLE',
      }, deadline(STREAM_MS));
      const entries = [];
      let streamed = 0;
      for await (const resp of call) {
        entries.push(...resp.backlog_entries);
        streamed += resp.stream_entries.length;
      }
      check(streamed === 0, `STREAM_DISABLE sent ${streamed} stream entries`);
      const texts = entries.map((e) => [e.dn, e.leveled ? e.leveled.lines.join(' ') : e.raw.data]);
      check(texts.some(([dn, t]) => dn === 'root.debug' && t.includes(`id=${id}`)),
        `no root.debug entry with id=${id} among ${texts.length}: ${JSON.stringify(texts.slice(-5))}`);
      return `${entries.length} backlog entries, the issuance among them`;
    } finally {
      debug.close();
    }
  }

  async debug_load_image() {
    const archive = fs.readFileSync(this.c.image_archive);
    const debug = this.debug();
    try {
      await new Promise((resolve, reject) => {
        const call = debug.LoadImage(deadline(STREAM_MS), (err) => (err ? reject(err) : resolve()));
        for (let i = 0; i < archive.length; i += 4096) {
          call.write({ data_part: archive.subarray(i, i + 4096) });
        }
        call.end();
      });
    } finally {
      debug.close();
    }
    const index = JSON.parse(fs.readFileSync(path.join(this.c.data_dir, 'images', 'index.json')));
    const names = (index.manifests || []).map(
      (m) => (m.annotations || {})['org.opencontainers.image.ref.name']);
    check(names.includes(this.c.image_name), `${this.c.image_name} not in the store: ${names}`);
    return `${archive.length} bytes imported as ${this.c.image_name}`;
  }

  async debug_trace() {
    const tracefs = this.c.tracefs;
    if (!tracefs) throw new Skip('tracefs is not mounted and writable');
    const read = (f) => fs.readFileSync(path.join(tracefs, f), 'utf8').trim();
    const marker = `metropolis-interop-node-${process.pid}`;
    const debug = this.debug();
    try {
      const call = debug.Trace({ tracer: 'nop' }, deadline(STREAM_MS));
      // The response headers come once the session is set up.
      const answered = new Promise((resolve, reject) => {
        call.once('metadata', resolve);
        call.once('status', (st) => (st.code === grpc.status.OK ? resolve()
          : reject(Object.assign(new Error(st.details), { code: st.code, details: st.details }))));
      });
      const it = call[Symbol.asyncIterator]();
      await answered;
      const on = read('tracing_on');
      check(on === '1', `tracing_on is ${on} once the Trace call is answered`);
      fs.writeFileSync(path.join(tracefs, 'trace_marker'), marker);
      const seen = [];
      for (;;) {
        const event = await next(it, 'Trace');
        check(event !== null, `the stream ended without ${marker}; saw ${seen.slice(-5)}`);
        if (event.raw_line.includes(marker)) break;
        seen.push(event.raw_line);
      }
      call.cancel();
      const until = Date.now() + 10000;
      for (;;) {
        const tracer = read('current_tracer');
        const on = read('tracing_on');
        if (tracer === 'nop' && on === '0') break;
        check(Date.now() < until,
          `tracefs not restored after cancel: current_tracer=${tracer} tracing_on=${on}`);
        await sleep(50);
      }
      return 'marker traced; tracefs restored after cancel';
    } finally {
      debug.close();
    }
  }

  // 5. Health on each listener; 6. reflection.
  async health(client) {
    try {
      const resp = await unary(client, 'check', { service: '' });
      check(resp.status === 'SERVING', `status ${resp.status}`);
      return resp.status;
    } finally {
      client.close();
    }
  }

  health_unix() {
    return this.health(this.unix(this.s.Health));
  }

  health_curator_tls() {
    return this.health(this.tls(this.s.Health, this.c.curator));
  }

  health_agent_tls() {
    return this.health(this.tls(this.s.Health, this.c.agent));
  }

  health_debug() {
    return this.health(new this.s.Health(this.c.debug, grpc.credentials.createInsecure()));
  }

  async reflection(client, service) {
    try {
      const responses = await new Promise((resolve, reject) => {
        const got = [];
        const call = client.ServerReflectionInfo(deadline(UNARY_MS));
        call.on('data', (r) => got.push(r));
        call.on('error', reject);
        call.on('end', () => resolve(got));
        call.write({ list_services: '' });
        call.write({ file_containing_symbol: service });
        call.end();
      });
      check(responses.length === 2, `${responses.length} responses to 2 requests`);
      const listed = responses[0].list_services_response.service.map((s) => s.name);
      check(listed.includes(service), `${service} not listed: ${listed}`);
      const r = responses[1];
      const files = (r.file_descriptor_response ? r.file_descriptor_response.file_descriptor_proto
        : []).map((b) => descriptor.FileDescriptorProto.decode(b));
      const dot = service.lastIndexOf('.');
      const [pkg, name] = [service.slice(0, dot), service.slice(dot + 1)];
      check(files.some((f) => f.package === pkg && (f.service || []).some((s) => s.name === name)),
        `file_containing_symbol ${service}: got files ${files.map((f) => f.name)}, error ${
          JSON.stringify(r.error_response && r.error_response.error_message)}`);
      return `lists ${listed.length} services and describes ${service}`;
    } finally {
      client.close();
    }
  }

  reflection_v1_debug() {
    const Reflection = this.s.Reflection.v1;
    return this.reflection(new Reflection(this.c.debug, grpc.credentials.createInsecure()),
      SERVICES.debug);
  }

  reflection_v1alpha_debug() {
    const Reflection = this.s.Reflection.v1alpha;
    return this.reflection(new Reflection(this.c.debug, grpc.credentials.createInsecure()),
      SERVICES.debug);
  }

  reflection_v1_curator_tls() {
    return this.reflection(this.tls(this.s.Reflection.v1, this.c.curator), SERVICES.curator);
  }

  reflection_v1alpha_curator_tls() {
    return this.reflection(this.tls(this.s.Reflection.v1alpha, this.c.curator), SERVICES.curator);
  }
}

/// A failure as one bounded line: the gRPC status, or the exception.
function describe(e) {
  const text = e && e.code !== undefined && grpc.status[e.code] !== undefined
    ? `gRPC ${grpc.status[e.code]}: ${e.details}`
    : `${(e && e.name) || 'Error'}: ${(e && e.message) || e}${
      e && e.code ? ` (${e.code})` : ''}`;
  return text.slice(0, 1500);
}

async function main() {
  const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const version = require('@grpc/grpc-js/package.json').version;
  process.stdout.write(`${JSON.stringify({ stack: `Node ${process.version} @grpc/grpc-js ${version}` })}\n`);
  const client = new Client(config, loadServices(config.proto_dir));
  for (const [scenario, endpoint] of config.scenarios) {
    const result = { scenario, endpoint, ok: false, skipped: false };
    // What gRPC logs during the scenario goes to its own section.
    process.stderr.write(`== scenario ${scenario}\n`);
    try {
      result.detail = await client[scenario]();
      result.ok = true;
    } catch (e) {
      if (e instanceof Skip) Object.assign(result, { ok: true, skipped: true, detail: e.message });
      else result.detail = describe(e);
    }
    process.stdout.write(`${JSON.stringify(result)}\n`);
  }
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write(`${e && e.stack}\n`);
  process.exit(1);
});

// The Helm chart helm/shoal, rendered by the real helm (3.17) and checked against the Kubernetes
// API schemas offline (kubernetes-models: the official OpenAPI schemas compiled to validators).
// What this stands in for: the API server's validation of the objects `helm install` would
// create, and the scheduler/kubelet reading them. No cluster is involved: the assertions read
// the objects, they do not run them (tests/podman-kube-play does that with podman).
//
// Run by ctest (tests/CMakeLists.txt) as `node --test`; needs SHOAL_TOOLS (helm, node_modules
// from scripts/setup.sh) and the built binaries in SHOAL_AGENT_BIN, SHOAL_TRACKER_BIN and
// SHOAL_CTL_BIN, whose --help proves that the chart only uses flags and variables they have.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, execFileSync, spawn, spawnSync } from "node:child_process";
import http from "node:http";
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const here = path.dirname(fileURLToPath(import.meta.url));
const chart = path.resolve(here, "../../helm/shoal");
const tools = process.env.SHOAL_TOOLS || "/opt/shoal-tools";
const helm = path.join(tools, "bin/helm");
const require = createRequire(path.join(tools, "node_modules/"));
const yaml = require("js-yaml");
const execFileAsync = promisify(execFile);

// Runs helm template with the given --set/--set-string/-f arguments; returns the objects.
function render(args = [], extra = []) {
  const out = execFileSync(helm, ["template", "shoal", chart, "--namespace", "shoal-system", ...extra, ...args], {
    encoding: "utf8",
  });
  return yaml.loadAll(out).filter((d) => d);
}

// NOTES.txt as `helm install` would print it. helm 3.17 renders NOTES only at install, which
// needs a cluster even with --dry-run, so a copy of the chart renders it as a ConfigMap's data
// with the same values (tpl of the file), through helm template.
function renderNotes(args = []) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "shoal-notes-"));
  fs.cpSync(chart, path.join(dir, "shoal"), { recursive: true });
  fs.copyFileSync(path.join(chart, "templates/NOTES.txt"), path.join(dir, "shoal/notes.txt"));
  fs.writeFileSync(
    path.join(dir, "shoal/templates/zz-notes.yaml"),
    'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n{{ tpl (.Files.Get "notes.txt") . | indent 4 }}\n',
  );
  const out = execFileSync(helm, ["template", "shoal", path.join(dir, "shoal"), "--namespace", "shoal-system",
    "--show-only", "templates/zz-notes.yaml", ...args], { encoding: "utf8" });
  fs.rmSync(dir, { recursive: true, force: true });
  return yaml.load(out).data.notes;
}

// helm template that must fail; returns its stderr.
function renderFails(args) {
  const r = spawnSync(helm, ["template", "shoal", chart, ...args], { encoding: "utf8" });
  assert.notEqual(r.status, 0, `helm template ${args.join(" ")} should have failed`);
  return r.stderr;
}

const find = (objs, kind, nameSuffix) =>
  objs.find((o) => o.kind === kind && (!nameSuffix || o.metadata.name.endsWith(nameSuffix)));

// Validates one object with the kubernetes-models class of its apiVersion/kind.
function validate(obj) {
  const [group, version] = obj.apiVersion.includes("/") ? obj.apiVersion.split("/") : ["", obj.apiVersion];
  if (group === "monitoring.coreos.com") {
    // Not part of the Kubernetes API: checked by shape here and by the tests below.
    assert.equal(version, "v1");
    if (obj.kind === "PrometheusRule") assert.ok(obj.spec.groups.length > 0 && obj.spec.groups.every((g) => g.rules.length > 0));
    else assert.ok(obj.spec.selector && obj.spec.podMetricsEndpoints.length > 0);
    return;
  }
  const mod = require(`kubernetes-models/${group ? group + "/" : ""}${version}/${obj.kind}`);
  const Model = mod[obj.kind];
  assert.ok(Model, `no schema for ${obj.apiVersion} ${obj.kind}`);
  try {
    new Model(obj).validate();
  } catch (e) {
    throw new Error(`${obj.kind}/${obj.metadata.name} does not validate: ${e.message}`);
  }
}

// A file for --set-file (how an operator passes a config.json without shell quoting).
function tempFile(content) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "shoal-chart-"));
  const file = path.join(dir, "config.json");
  fs.writeFileSync(file, content);
  return file;
}

const envOf = (container) => Object.fromEntries((container.env || []).map((e) => [e.name, e.value ?? e.valueFrom]));

// The value sets the chart is rendered with; every one must lint and validate.
const valueSets = {
  default: [],
  "dockerd on": ["--set", "nodeSetup.dockerd.enabled=true"],
  "containerd only": ["--set", "nodeSetup.crio.enabled=false", "--set", "nodeSetup.dockerd.enabled=false"],
  "crio and arp": ["--set", "nodeSetup.crio.enabled=true", "--set", "nodeSetup.arpSysctls.enabled=true"],
  "existing secret": ["--set", "credentials.existingSecret=cluster-pull-secret"],
  "created secret": ["--set-file", `credentials.dockerConfigJson=${tempFile('{"auths":{"gcr.io":{"auth":"dTpw"}}}')}`],
  "monitoring CRDs, hostIP": ["--set", "agent.shim.bind=hostIP", "--api-versions", "monitoring.coreos.com/v1/PodMonitor",
    "--api-versions", "monitoring.coreos.com/v1/PrometheusRule"],
  "no agent metrics port, no dashboard": ["--set", "agent.metrics.enabled=false", "--set", "monitoring.grafanaDashboard.enabled=false"],
  "2500 nodes": ["-f", path.join(here, "values-2500-nodes.yaml")],
  "existing auth secret": ["--set", "auth.existingSecret=shoal-tokens"],
  "agent snapshotter on": ["--set", "agent.snapshotter.enabled=true", "--set", "agent.snapshotter.hostPath=/mnt/ssd/snapshots"],
  "given tokens, mid-rotation": ["--set-string", `auth.agentToken=${"n".repeat(40)}`,
    "--set-string", `auth.previousAgentTokens={${"o".repeat(40)}}`, "--set-string", `auth.operatorToken=${"p".repeat(16)}`],
};

for (const [name, args] of Object.entries(valueSets)) {
  test(`helm lint --strict and schema validation: ${name}`, () => {
    const lintArgs = args.filter((a) => !a.startsWith("--api-versions") && !a.startsWith("monitoring.coreos"));
    execFileSync(helm, ["lint", "--strict", chart, ...lintArgs], { encoding: "utf8" });
    const objs = render(args);
    assert.ok(objs.length >= 6);
    for (const o of objs) validate(o);
  });
}

test("agent DaemonSet: host network, node identity, cache hostPath, probes, every taint, node-critical", () => {
  const objs = render();
  const ds = find(objs, "DaemonSet", "-agent");
  const pod = ds.spec.template.spec;
  assert.equal(pod.hostNetwork, true);
  assert.equal(pod.dnsPolicy, "ClusterFirstWithHostNet");
  assert.equal(pod.priorityClassName, "system-node-critical");
  assert.deepEqual(pod.tolerations, [{ operator: "Exists" }]);
  assert.equal(pod.hostPID, undefined, "hostPID only when dockerd setup is on");
  assert.equal(ds.spec.updateStrategy.type, "RollingUpdate");
  assert.equal(ds.spec.updateStrategy.rollingUpdate.maxUnavailable, "10%");
  const agent = pod.containers.find((c) => c.name === "agent");
  const env = envOf(agent);
  assert.deepEqual(env.NODE_IP, { fieldRef: { fieldPath: "status.hostIP" } });
  assert.deepEqual(env.SHOAL_NODE_NAME, { fieldRef: { fieldPath: "spec.nodeName" } });
  assert.equal(env.SHOAL_LISTEN, "127.0.0.1:5000");
  assert.equal(env.SHOAL_SWARM_LISTEN, "$(NODE_IP):6881");
  assert.equal(env.SHOAL_METRICS_LISTEN, "$(NODE_IP):5001");
  assert.equal(env.SHOAL_LIBTORRENT_SETTINGS, "announce_ip=$(NODE_IP)");
  assert.equal(env.SHOAL_CACHE_BUDGET, "80%");
  assert.equal(env.SHOAL_CACHE_DIR, "/var/cache/shoal");
  // NODE_IP must come before the variables that expand it.
  const names = agent.env.map((e) => e.name);
  assert.ok(names.indexOf("NODE_IP") < names.indexOf("SHOAL_SWARM_LISTEN"));
  assert.ok(names.indexOf("NODE_IP") < names.indexOf("SHOAL_METRICS_LISTEN"));
  // Every tracker replica's stable name, in order.
  assert.equal(
    env.SHOAL_TRACKERS,
    [0, 1, 2].map((i) => `http://shoal-tracker-${i}.shoal-tracker.shoal-system.svc:7070`).join(","),
  );
  const cache = pod.volumes.find((v) => v.name === "cache");
  assert.deepEqual(cache.hostPath, { path: "/mnt/shoal", type: "DirectoryOrCreate" });
  for (const p of ["startupProbe", "readinessProbe", "livenessProbe"]) {
    assert.equal(agent[p].httpGet.port, 5000, p);
    assert.equal(agent[p].httpGet.host, "127.0.0.1", `${p}: the shim is on loopback`);
  }
  assert.equal(agent.readinessProbe.httpGet.path, "/readyz");
  assert.deepEqual(
    agent.ports.map((p) => [p.name, p.containerPort, p.hostPort]),
    [["shim", 5000, 5000], ["swarm", 6881, 6881], ["metrics", 5001, 5001]],
  );
  assert.equal(agent.securityContext.allowPrivilegeEscalation, false);
  assert.equal(agent.securityContext.readOnlyRootFilesystem, true);
  assert.deepEqual(agent.securityContext.capabilities.drop, ["ALL"]);
  assert.equal(agent.securityContext.privileged, undefined);
  assert.ok(pod.terminationGracePeriodSeconds > 10, "longer than the agent's 10 s drain");
  const hostRoot = agent.volumeMounts.find((m) => m.name === "host-root");
  assert.equal(hostRoot.readOnly, true);
  // Scrape annotations on the metrics port (node IP), not on the loopback shim.
  assert.equal(ds.spec.template.metadata.annotations["prometheus.io/scrape"], "true");
  assert.equal(ds.spec.template.metadata.annotations["prometheus.io/port"], "5001");
  assert.match(ds.spec.template.metadata.annotations["checksum/config"], /^[0-9a-f]{64}$/);
});

test("node setup: containerd by default, nothing else written, never privileged", () => {
  const pod = find(render(), "DaemonSet", "-agent").spec.template.spec;
  assert.deepEqual(pod.initContainers.map((c) => c.name), ["node-setup"]);
  const setup = pod.initContainers[0];
  assert.deepEqual(setup.command, ["shoalctl", "node-setup"]);
  assert.ok(setup.args.includes("--containerd-certs-dir=/etc/containerd/certs.d"));
  assert.ok(setup.args.includes("--registry=docker.io"));
  assert.ok(setup.args.includes("--agent=127.0.0.1:5000"));
  assert.ok(!setup.args.some((a) => a.startsWith("--dockerd") || a.startsWith("--crio")));
  assert.equal(setup.securityContext.privileged, undefined);
  assert.ok(!setup.securityContext.capabilities.add.includes("KILL"));
  const writable = setup.volumeMounts.filter((m) => !m.readOnly).map((m) => m.mountPath);
  assert.deepEqual(writable, ["/host/etc/containerd/certs.d"]);
});

test("node setup: dockerd opt-in adds the daemon.json mount, hostPID and KILL; ARP is its own privileged step", () => {
  const pod = find(
    render(["--set", "nodeSetup.dockerd.enabled=true", "--set", "nodeSetup.arpSysctls.enabled=true",
      "--set", "nodeSetup.containerd.enabled=false"]),
    "DaemonSet", "-agent",
  ).spec.template.spec;
  assert.equal(pod.hostPID, true);
  assert.deepEqual(pod.initContainers.map((c) => c.name), ["arp-sysctls", "node-setup"]);
  const [arp, setup] = pod.initContainers;
  assert.equal(arp.securityContext.privileged, true);
  assert.deepEqual(arp.args, ["--arp-gc-thresh=80000,90000,100000"]);
  assert.ok(setup.args.includes("--dockerd-config=/etc/docker/daemon.json"));
  assert.ok(setup.securityContext.capabilities.add.includes("KILL"));
  assert.deepEqual(setup.volumeMounts.filter((m) => !m.readOnly).map((m) => m.mountPath), ["/host/etc/docker"]);
});

test("agent snapshotter: opt-in passes the socket and root, mounts both at their host paths, adds the extraction capabilities, and leaves containerd's config.toml to the node image", () => {
  const offPod = find(render(), "DaemonSet", "-agent").spec.template.spec;
  const offAgent = offPod.containers.find((c) => c.name === "agent");
  assert.equal(envOf(offAgent).SHOAL_SNAPSHOTTER_SOCKET, undefined);
  assert.equal(offAgent.securityContext.capabilities.add, undefined);
  assert.ok(!offPod.volumes.some((v) => v.name.startsWith("snapshotter")));

  const objs = render(["--set", "agent.snapshotter.enabled=true", "--set", "agent.cache.hostPath=/mnt/ssd"]);
  const pod = find(objs, "DaemonSet", "-agent").spec.template.spec;
  const agent = pod.containers.find((c) => c.name === "agent");
  const env = envOf(agent);
  assert.equal(env.SHOAL_SNAPSHOTTER_SOCKET, "/run/shoal/snapshotter.sock");
  assert.equal(env.SHOAL_SNAPSHOTTER_ROOT, "/mnt/ssd/snapshotter", "on the cache's SSD by default");
  // containerd on the host dials the socket and mounts the directories the agent names: the
  // agent must see both at the host's paths.
  for (const [name, hostPath] of [["snapshotter-socket", "/run/shoal"], ["snapshotter-root", "/mnt/ssd/snapshotter"]]) {
    assert.deepEqual(pod.volumes.find((v) => v.name === name).hostPath, { path: hostPath, type: "DirectoryOrCreate" }, name);
    const mount = agent.volumeMounts.find((m) => m.name === name);
    assert.equal(mount.mountPath, hostPath, `${name}: the same path as on the host`);
    assert.equal(mount.readOnly, undefined, `${name}: writable`);
  }
  for (const cap of ["CHOWN", "FOWNER", "MKNOD", "SYS_ADMIN"]) assert.ok(agent.securityContext.capabilities.add.includes(cap), cap);
  assert.equal(agent.securityContext.privileged, undefined);
  assert.equal(agent.securityContext.allowPrivilegeEscalation, false);
  // config.toml needs a containerd restart: node setup (the init container) does not touch it.
  const setup = pod.initContainers.find((c) => c.name === "node-setup");
  assert.ok(!setup.args.some((a) => a.includes("snapshotter")));
  assert.deepEqual(setup.volumeMounts.filter((m) => !m.readOnly).map((m) => m.mountPath), ["/host/etc/containerd/certs.d"]);
  const notes = renderNotes(["--set", "agent.snapshotter.enabled=true"]);
  assert.match(notes, /containerd snapshotter: the agents serve \/run\/shoal\/snapshotter.sock/);
  assert.match(notes, /--containerd-config \/etc\/containerd\/config.toml --containerd-snapshotter/);
  assert.doesNotMatch(renderNotes(), /containerd snapshotter/);

  const custom = find(render(["--set", "agent.snapshotter.enabled=true", "--set", "agent.snapshotter.hostPath=/mnt/nvme/snaps",
    "--set", "agent.snapshotter.socketDir=/var/run/shoal"]), "DaemonSet", "-agent").spec.template.spec;
  const customEnv = envOf(custom.containers.find((c) => c.name === "agent"));
  assert.equal(customEnv.SHOAL_SNAPSHOTTER_SOCKET, "/var/run/shoal/snapshotter.sock");
  assert.equal(customEnv.SHOAL_SNAPSHOTTER_ROOT, "/mnt/nvme/snaps");
});

test("tracker: StatefulSet with required anti-affinity, headless Service, PDB, non-root", () => {
  const objs = render();
  const sts = find(objs, "StatefulSet", "-tracker");
  assert.equal(sts.spec.replicas, 3);
  assert.equal(sts.spec.serviceName, "shoal-tracker");
  const term = sts.spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0];
  assert.equal(term.topologyKey, "kubernetes.io/hostname");
  assert.deepEqual(term.labelSelector.matchLabels, sts.spec.selector.matchLabels);
  const svc = find(objs, "Service", "-tracker");
  assert.equal(svc.spec.clusterIP, "None");
  assert.equal(svc.spec.publishNotReadyAddresses, true);
  assert.deepEqual(svc.spec.selector, sts.spec.selector.matchLabels);
  const pdb = find(objs, "PodDisruptionBudget");
  assert.equal(pdb.spec.maxUnavailable, 1);
  assert.deepEqual(pdb.spec.selector.matchLabels, sts.spec.selector.matchLabels);
  const c = sts.spec.template.spec.containers[0];
  assert.equal(sts.spec.template.spec.securityContext.runAsNonRoot, true);
  assert.equal(c.ports[0].containerPort, 7070);
  assert.equal(envOf(c).SHOAL_TRUST_IP_PARAM, "true");
  // UDP announces (BEP 15) on the same port number, declared on the pod and the Service, and
  // the agents told to use them; off, neither side opens or uses UDP.
  assert.deepEqual(c.ports.map((p) => [p.name, p.containerPort, p.protocol]),
    [["http", 7070, "TCP"], ["announce-udp", 7070, "UDP"]]);
  assert.deepEqual(svc.spec.ports.map((p) => [p.name, p.port, p.protocol]),
    [["http", 7070, "TCP"], ["announce-udp", 7070, "UDP"]]);
  assert.equal(envOf(c).SHOAL_UDP_ANNOUNCE, "true");
  // Agents announce in batches by default; without batches, over UDP unless it is off.
  assert.equal(envOf(find(objs, "DaemonSet").spec.template.spec.containers[0]).SHOAL_TRACKER_ANNOUNCE, "batch");
  assert.equal(envOf(find(render(["--set", "tracker.batchAnnounce=false"]), "DaemonSet").spec.template.spec.containers[0]).SHOAL_TRACKER_ANNOUNCE, "udp");
  {
    const off = render(["--set", "tracker.udpAnnounce=false", "--set", "tracker.batchAnnounce=false"]);
    const offSts = find(off, "StatefulSet");
    assert.deepEqual(offSts.spec.template.spec.containers[0].ports.map((p) => p.protocol), ["TCP"]);
    assert.equal(envOf(offSts.spec.template.spec.containers[0]).SHOAL_UDP_ANNOUNCE, "false");
    assert.equal(envOf(find(off, "DaemonSet").spec.template.spec.containers[0]).SHOAL_TRACKER_ANNOUNCE, "http");
    const batched = render(["--set", "tracker.batchAnnounce=true"]);
    assert.equal(envOf(find(batched, "DaemonSet").spec.template.spec.containers[0]).SHOAL_TRACKER_ANNOUNCE, "batch");
  }
  // The replicas share the cluster's upstream cap (each grants maxUpstreamFetchers / replicas).
  assert.equal(envOf(c).SHOAL_MAX_UPSTREAM_FETCHERS, "9");
  assert.equal(envOf(c).SHOAL_TRACKER_REPLICAS, "3");
  assert.match(renderFails(["--set", "tracker.replicas=4", "--set", "tracker.maxUpstreamFetchers=3"]),
    /tracker.maxUpstreamFetchers \(3\) must be at least tracker.replicas \(4\)/);
  for (const p of ["startupProbe", "readinessProbe", "livenessProbe"]) assert.equal(c[p].httpGet.path, "/healthz");
  assert.equal(sts.spec.template.metadata.annotations["prometheus.io/scrape"], "true");
  // A preferred spread when asked for (e.g. a test cluster smaller than the replica count).
  const soft = find(render(["--set", "tracker.antiAffinity=preferred"]), "StatefulSet");
  assert.ok(soft.spec.template.spec.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution);
});

test("upstream map and credentials: a created Secret, an existing one, or none", () => {
  let objs = render(["--set", "upstreams.map.gcr\\.io=https://gcr.io", "--set", "upstreams.unmapped=error"]);
  const cm = find(objs, "ConfigMap", "-agent");
  assert.deepEqual(JSON.parse(cm.data["upstreams.json"]), {
    upstreams: { "docker.io": "https://registry-1.docker.io", "gcr.io": "https://gcr.io" },
    unmapped: "error",
  });
  let agent = find(objs, "DaemonSet", "-agent").spec.template.spec.containers[0];
  assert.equal(envOf(agent).SHOAL_CREDENTIALS, undefined);
  assert.equal(find(objs, "Secret", "-upstream-credentials"), undefined);
  assert.ok(find(objs, "DaemonSet", "-agent").spec.template.spec.initContainers[0].args.includes(
    "--registry=docker.io,gcr.io"));

  const config = '{"auths":{"gcr.io":{"auth":"dTpw"}}}';
  objs = render(["--set-file", `credentials.dockerConfigJson=${tempFile(config)}`]);
  const secret = find(objs, "Secret", "-upstream-credentials");
  assert.equal(secret.type, "kubernetes.io/dockerconfigjson");
  assert.equal(Buffer.from(secret.data[".dockerconfigjson"], "base64").toString(), config);
  let ds = find(objs, "DaemonSet", "-agent");
  assert.equal(envOf(ds.spec.template.spec.containers[0]).SHOAL_CREDENTIALS, "/etc/shoal/credentials/config.json");
  const vol = ds.spec.template.spec.volumes.find((v) => v.name === "credentials");
  assert.deepEqual(vol.secret, { secretName: secret.metadata.name, items: [{ key: ".dockerconfigjson", path: "config.json" }] });
  const before = ds.spec.template.metadata.annotations["checksum/credentials"];

  // Another credential rolls the pods (the checksum changes).
  objs = render(["--set-file", `credentials.dockerConfigJson=${tempFile('{"auths":{}}')}`]);
  assert.notEqual(find(objs, "DaemonSet", "-agent").spec.template.metadata.annotations["checksum/credentials"], before);

  objs = render(["--set", "credentials.existingSecret=cluster-pull-secret"]);
  assert.equal(find(objs, "Secret", "-upstream-credentials"), undefined);
  ds = find(objs, "DaemonSet", "-agent");
  assert.equal(ds.spec.template.spec.volumes.find((v) => v.name === "credentials").secret.secretName, "cluster-pull-secret");
});

// The cluster credentials Secret's values, decoded.
const secretData = (secret) =>
  Object.fromEntries(Object.entries(secret.data).map(([k, v]) => [k, Buffer.from(v, "base64").toString()]));
// The tokens of a token file as agent and tracker read it (blank lines and # comments skipped).
const tokensOf = (text) => text.split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
// What an agent's pod mounts from the cluster credentials Secret.
const agentItems = [{ key: "agent-token", path: "agent-token" }, { key: "peer-ca.crt", path: "peer-ca.crt" },
  { key: "peer-ca.key", path: "peer-ca.key" }];
const authKeys = ["agent-token", "agent-tokens", "operator-token", "operator-tokens"];

test("cluster credentials: a generated Secret with the tokens and the peer CA; trackers get the accepted lists and the CA certificate, agents their token and the CA", () => {
  const objs = render();
  const secret = find(objs, "Secret", "-cluster-credentials");
  assert.ok(secret, "the chart creates the cluster credentials Secret");
  assert.equal(secret.metadata.name, "shoal-cluster-credentials");
  assert.equal(secret.type, "Opaque");
  const data = secretData(secret);
  assert.deepEqual(Object.keys(data).sort(), [...authKeys, "peer-ca.crt", "peer-ca.key"].sort());
  // The peer CA: a CA certificate and its key, from helm's genCA (checked with openssl).
  assert.match(data["peer-ca.crt"], /^-----BEGIN CERTIFICATE-----/);
  assert.match(data["peer-ca.key"], /PRIVATE KEY-----/);
  const caText = execFileSync("openssl", ["x509", "-noout", "-text"], { input: data["peer-ca.crt"] }).toString();
  assert.match(caText, /CA:TRUE/, "the peer CA is a CA");
  const keyMod = execFileSync("openssl", ["rsa", "-noout", "-modulus"], { input: data["peer-ca.key"] }).toString();
  const certMod = execFileSync("openssl", ["x509", "-noout", "-modulus"], { input: data["peer-ca.crt"] }).toString();
  assert.equal(keyMod, certMod, "peer-ca.key is the CA certificate's key");
  for (const k of authKeys) {
    const tokens = tokensOf(data[k]);
    assert.ok(tokens.length >= 1, `${k} holds a token`);
    for (const t of tokens) assert.match(t, /^[!-~]{40,512}$/, `${k}: a generated token has at least 40 printable characters`);
  }
  assert.deepEqual(tokensOf(data["agent-tokens"]), [data["agent-token"]]);
  assert.deepEqual(tokensOf(data["operator-tokens"]), [data["operator-token"]]);
  assert.notEqual(data["agent-token"], data["operator-token"], "two roles, two tokens");
  // helm template has no cluster to look the Secret up in: every render generates new tokens.
  assert.notEqual(secretData(find(render(), "Secret", "-cluster-credentials"))["agent-token"], data["agent-token"]);

  const sts = find(objs, "StatefulSet", "-tracker");
  const tracker = sts.spec.template.spec.containers[0];
  const trackerEnv = envOf(tracker);
  assert.equal(trackerEnv.SHOAL_AGENT_TOKENS_FILE, "/etc/shoal/tokens/agent-tokens");
  assert.equal(trackerEnv.SHOAL_OPERATOR_TOKENS_FILE, "/etc/shoal/tokens/operator-tokens");
  assert.equal(trackerEnv.SHOAL_INSECURE_OPEN, undefined);
  assert.equal(trackerEnv.SHOAL_PEER_CA_CERT, "/etc/shoal/tokens/peer-ca.crt");
  const trackerMounts = tracker.volumeMounts.filter((m) => m.name === "tokens");
  assert.deepEqual(trackerMounts, [{ name: "tokens", mountPath: "/etc/shoal/tokens", readOnly: true }],
    "one directory mount, no subPath (subPath mounts never see a Secret update)");
  const trackerVol = sts.spec.template.spec.volumes.find((v) => v.name === "tokens");
  assert.deepEqual(trackerVol.secret.items, [
    { key: "agent-tokens", path: "agent-tokens" }, { key: "operator-tokens", path: "operator-tokens" },
    { key: "peer-ca.crt", path: "peer-ca.crt" }], "trackers get the CA certificate, never its key");
  assert.equal(trackerVol.secret.secretName, secret.metadata.name);
  assert.equal(trackerVol.secret.defaultMode, 0o440);
  assert.equal(sts.spec.template.spec.securityContext.fsGroup, sts.spec.template.spec.securityContext.runAsUser,
    "the non-root tracker can read its 0440 files");

  const ds = find(objs, "DaemonSet", "-agent");
  const pod = ds.spec.template.spec;
  const agent = pod.containers.find((c) => c.name === "agent");
  assert.equal(envOf(agent).SHOAL_TRACKER_TOKEN_FILE, "/etc/shoal/tokens/agent-token");
  assert.equal(envOf(agent).SHOAL_PEER_CA_CERT, "/etc/shoal/tokens/peer-ca.crt");
  assert.equal(envOf(agent).SHOAL_PEER_CA_KEY, "/etc/shoal/tokens/peer-ca.key");
  assert.deepEqual(agent.volumeMounts.filter((m) => m.name === "tokens"),
    [{ name: "tokens", mountPath: "/etc/shoal/tokens", readOnly: true }]);
  const agentVol = pod.volumes.find((v) => v.name === "tokens");
  assert.deepEqual(agentVol.secret, { secretName: secret.metadata.name, defaultMode: 0o400, items: agentItems },
    "agents get only the token they present and the peer CA: not the accepted lists, not the operator token");
  // No other volume of any pod the chart renders carries this Secret, and nothing mounts it with subPath.
  for (const o of objs) {
    const spec = o.spec?.template?.spec;
    if (!spec) continue;
    for (const v of spec.volumes || []) {
      if (v.secret?.secretName !== secret.metadata.name) continue;
      assert.ok(o === sts || o === ds, `${o.kind}/${o.metadata.name} mounts the cluster credentials`);
      for (const c of [...(spec.initContainers || []), ...spec.containers]) {
        for (const m of c.volumeMounts || []) {
          if (m.name !== v.name) continue;
          assert.equal(m.subPath, undefined, `${c.name}: no subPath on the token volume`);
          assert.equal(c.name, o === sts ? "tracker" : "agent", `${c.name} does not need the tokens`);
        }
      }
    }
  }
  // A rotation must not restart every pod at once: no checksum of this Secret on any pod.
  const given = (t) => render(["--set-string", `auth.agentToken=${t}`]);
  const a = given("a".repeat(40)), b = given("b".repeat(40));
  for (const [kind, suffix] of [["DaemonSet", "-agent"], ["StatefulSet", "-tracker"]]) {
    assert.deepEqual(find(a, kind, suffix).spec.template, find(b, kind, suffix).spec.template,
      `${kind}: another token leaves the pod template unchanged`);
  }
});

test("cluster credentials: given tokens; previous tokens accepted after the current one", () => {
  const [cur, old1, old2, op, opOld] = ["c", "o", "q", "p", "r"].map((ch) => ch.repeat(20) + "-Tok3n!");
  const objs = render(["--set-string", `auth.agentToken=${cur}`, "--set-string", `auth.previousAgentTokens={${old1},${old2}}`,
    "--set-string", `auth.operatorToken=${op}`, "--set-string", `auth.previousOperatorTokens={${opOld}}`]);
  const data = secretData(find(objs, "Secret", "-cluster-credentials"));
  assert.equal(data["agent-token"], cur);
  assert.deepEqual(tokensOf(data["agent-tokens"]), [cur, old1, old2], "the current token first, then the previous ones");
  assert.equal(data["operator-token"], op);
  assert.deepEqual(tokensOf(data["operator-tokens"]), [op, opOld]);
  for (const k of authKeys) assert.ok(tokensOf(data[k]).every((t) => t.length >= 16), k);
  // A previous token that is also the current one is listed once.
  const dup = secretData(find(render(["--set-string", `auth.agentToken=${cur}`, "--set-string", `auth.previousAgentTokens={${cur},${old1}}`]),
    "Secret", "-cluster-credentials"));
  assert.deepEqual(tokensOf(dup["agent-tokens"]), [cur, old1]);
  // Rotation step 3 (README): previousAgentTokens=null leaves the current token alone.
  const done = secretData(find(render(["--set-string", `auth.agentToken=${cur}`, "--set", "auth.previousAgentTokens=null"]),
    "Secret", "-cluster-credentials"));
  assert.deepEqual(tokensOf(done["agent-tokens"]), [cur]);
});

test("cluster credentials: auth.existingSecret creates no Secret and mounts that one", () => {
  const objs = render(["--set", "auth.existingSecret=shoal-tokens", "--set-string", `auth.agentToken=${"x".repeat(20)}`]);
  assert.equal(objs.filter((o) => o.kind === "Secret").length, 0, "no Secret at all (no upstream credentials either)");
  const sts = find(objs, "StatefulSet", "-tracker");
  const ds = find(objs, "DaemonSet", "-agent");
  assert.equal(sts.spec.template.spec.volumes.find((v) => v.name === "tokens").secret.secretName, "shoal-tokens");
  assert.equal(ds.spec.template.spec.volumes.find((v) => v.name === "tokens").secret.secretName, "shoal-tokens");
  assert.deepEqual(ds.spec.template.spec.volumes.find((v) => v.name === "tokens").secret.items, agentItems);
  assert.equal(envOf(sts.spec.template.spec.containers[0]).SHOAL_AGENT_TOKENS_FILE, "/etc/shoal/tokens/agent-tokens");
});

// A stand-in for the API server, enough for `helm template --dry-run=server` to run lookup: the
// discovery of v1 and a GET of one Secret. Returns the kubeconfig path and the requests seen.
async function fakeApiServer(secrets) {
  const seen = [];
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, "http://api");
    seen.push(`${req.method} ${url.pathname}`);
    const send = (code, body) => {
      res.writeHead(code, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    if (url.pathname === "/api/v1") {
      return send(200, { kind: "APIResourceList", groupVersion: "v1",
        resources: [{ name: "secrets", singularName: "secret", namespaced: true, kind: "Secret", verbs: ["get"] }] });
    }
    const m = url.pathname.match(/^\/api\/v1\/namespaces\/([^/]+)\/secrets\/([^/]+)$/);
    const secret = m && secrets[`${m[1]}/${m[2]}`];
    if (secret) {
      return send(200, { kind: "Secret", apiVersion: "v1", metadata: { name: m[2], namespace: m[1] }, type: "Opaque",
        data: Object.fromEntries(Object.entries(secret).map(([k, v]) => [k, Buffer.from(v).toString("base64")])) });
    }
    send(404, { kind: "Status", apiVersion: "v1", status: "Failure", reason: "NotFound", code: 404 });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "shoal-kubeconfig-"));
  const kubeconfig = path.join(dir, "config");
  fs.writeFileSync(kubeconfig, yaml.dump({
    apiVersion: "v1", kind: "Config", "current-context": "fake",
    clusters: [{ name: "fake", cluster: { server: `http://127.0.0.1:${server.address().port}` } }],
    users: [{ name: "fake", user: {} }],
    contexts: [{ name: "fake", context: { cluster: "fake", user: "fake" } }],
  }));
  return { kubeconfig, seen, close: () => { server.close(); fs.rmSync(dir, { recursive: true, force: true }); } };
}

test("cluster credentials: an upgrade keeps the tokens of the Secret in the cluster (lookup); given tokens win", async () => {
  const [agentTok, opTok] = ["k".repeat(48), "m".repeat(48)];
  const api = await fakeApiServer({
    // As the chart wrote it, the operator token with a trailing newline as a hand-made one may have.
    "shoal-system/shoal-cluster-credentials": { "agent-token": agentTok, "agent-tokens": `${agentTok}\n`,
      "operator-token": `${opTok}\n`, "operator-tokens": `${opTok}\n` },
  });
  try {
    // helm template --dry-run=server runs lookup against the cluster, as helm upgrade does.
    const upgrade = async (args = []) => {
      const { stdout } = await execFileAsync(helm, ["template", "shoal", chart, "--namespace", "shoal-system",
        "--dry-run=server", "--show-only", "templates/cluster-credentials-secret.yaml", ...args],
      { encoding: "utf8", env: { ...process.env, KUBECONFIG: api.kubeconfig } });
      return secretData(yaml.load(stdout));
    };
    let data = await upgrade();
    assert.ok(api.seen.includes("GET /api/v1/namespaces/shoal-system/secrets/shoal-cluster-credentials"), api.seen.join("\n"));
    assert.equal(data["agent-token"], agentTok, "the agents' token is kept: no rotation by accident");
    assert.equal(data["operator-token"], opTok);
    assert.deepEqual(tokensOf(data["agent-tokens"]), [agentTok]);
    assert.deepEqual(tokensOf(data["operator-tokens"]), [opTok]);
    // Rotation step 1: the kept token stays what agents present; the next one is accepted too.
    const next = "n".repeat(48);
    data = await upgrade(["--set-string", `auth.previousAgentTokens={${next}}`]);
    assert.equal(data["agent-token"], agentTok);
    assert.deepEqual(tokensOf(data["agent-tokens"]), [agentTok, next]);
    // Step 2: a token given in values wins over the one in the cluster.
    data = await upgrade(["--set-string", `auth.agentToken=${next}`, "--set-string", `auth.previousAgentTokens={${agentTok}}`]);
    assert.equal(data["agent-token"], next);
    assert.deepEqual(tokensOf(data["agent-tokens"]), [next, agentTok]);
    assert.equal(data["operator-token"], opTok, "the operator token is kept meanwhile");
  } finally {
    api.close();
  }
});

test("monitoring: PodMonitor only when the CRD exists; agents scraped on the metrics port, or on the shim off loopback", () => {
  const pmArgs = ["--api-versions", "monitoring.coreos.com/v1/PodMonitor"];
  const endpoints = (pm) => pm.spec.podMetricsEndpoints.map((e) => [e.port, e.relabelings.find((r) => r.targetLabel === "job").replacement]);
  const components = (pm) => pm.spec.selector.matchExpressions.find((m) => m.key === "app.kubernetes.io/component").values;
  assert.equal(find(render(), "PodMonitor"), undefined);
  // Default: agents on their metrics port (node IP) whatever the shim's bind; the job label
  // names the component, which the dashboard and the alert rules select by.
  let pm = find(render([], pmArgs), "PodMonitor");
  assert.deepEqual(endpoints(pm), [["http", "shoal-tracker"], ["metrics", "shoal-agent"]]);
  assert.deepEqual(components(pm), ["tracker", "agent"]);
  // Without the metrics port, agents on loopback cannot be scraped: trackers only.
  let objs = render(["--set", "agent.metrics.enabled=false"], pmArgs);
  pm = find(objs, "PodMonitor");
  assert.deepEqual(endpoints(pm), [["http", "shoal-tracker"]]);
  assert.deepEqual(components(pm), ["tracker"]);
  let ds = find(objs, "DaemonSet", "-agent");
  assert.equal(ds.spec.template.metadata.annotations["prometheus.io/scrape"], undefined);
  assert.equal(envOf(ds.spec.template.spec.containers[0]).SHOAL_METRICS_LISTEN, undefined);
  assert.deepEqual(ds.spec.template.spec.containers[0].ports.map((p) => p.name), ["shim", "swarm"]);
  // Without it but with the shim on the node IP: the shim serves /metrics.
  objs = render(["--set", "agent.metrics.enabled=false", "--set", "agent.shim.bind=hostIP"], pmArgs);
  assert.deepEqual(endpoints(find(objs, "PodMonitor")), [["http", "shoal-tracker"], ["shim", "shoal-agent"]]);
  ds = find(objs, "DaemonSet", "-agent");
  assert.equal(ds.spec.template.metadata.annotations["prometheus.io/port"], "5000");
  const agent = ds.spec.template.spec.containers[0];
  assert.equal(envOf(agent).SHOAL_LISTEN, "$(NODE_IP):5000");
  assert.equal(agent.readinessProbe.httpGet.host, undefined, "kubelet probes the pod IP, the node's");
  // Both: the metrics port still wins (it answers nothing but /metrics and /healthz).
  objs = render(["--set", "agent.shim.bind=hostIP", "--set", "agent.metrics.port=9101"], pmArgs);
  assert.deepEqual(endpoints(find(objs, "PodMonitor")), [["http", "shoal-tracker"], ["metrics", "shoal-agent"]]);
  ds = find(objs, "DaemonSet", "-agent");
  assert.equal(ds.spec.template.metadata.annotations["prometheus.io/port"], "9101");
  assert.equal(envOf(ds.spec.template.spec.containers[0]).SHOAL_METRICS_LISTEN, "$(NODE_IP):9101");
  assert.match(renderFails(["--set", "agent.metrics.port=0"]), /agent.metrics.port: Must be greater than or equal to 1/);
});

test("post-delete hook: cleanup DaemonSet on every node and a Job that waits for it", () => {
  const objs = render(["--set", "nodeSetup.dockerd.enabled=true"]);
  const hooks = objs.filter((o) => (o.metadata.annotations || {})["helm.sh/hook"] === "post-delete");
  assert.deepEqual(hooks.map((o) => o.kind).sort(), ["DaemonSet", "Job", "Role", "RoleBinding", "ServiceAccount"]);
  const ds = hooks.find((o) => o.kind === "DaemonSet");
  const init = ds.spec.template.spec.initContainers[0];
  assert.deepEqual(init.command, ["shoalctl", "node-setup", "--cleanup"]);
  const setup = find(objs, "DaemonSet", "-agent").spec.template.spec.initContainers.find((c) => c.name === "node-setup");
  assert.deepEqual(init.args, setup.args, "cleanup removes exactly what setup writes");
  assert.deepEqual(ds.spec.template.spec.tolerations, [{ operator: "Exists" }]);
  const job = hooks.find((o) => o.kind === "Job");
  assert.ok(Number(job.metadata.annotations["helm.sh/hook-weight"]) > Number(ds.metadata.annotations["helm.sh/hook-weight"]));
  const role = hooks.find((o) => o.kind === "Role");
  assert.deepEqual(role.rules, [{ apiGroups: ["apps"], resources: ["daemonsets"], resourceNames: [ds.metadata.name], verbs: ["get"] }]);
  assert.equal(render(["--set", "nodeSetup.cleanupOnUninstall=false"]).filter((o) => o.kind === "Job").length, 0);
});

test("the chart uses only flags and variables the built binaries have", () => {
  const bins = { agent: process.env.SHOAL_AGENT_BIN, tracker: process.env.SHOAL_TRACKER_BIN, ctl: process.env.SHOAL_CTL_BIN };
  for (const b of Object.values(bins)) assert.ok(b && fs.existsSync(b), `built binary ${b} (set by ctest)`);
  const help = (bin, ...args) => execFileSync(bin, [...args, "--help"], { encoding: "utf8" });
  const agentHelp = help(bins.agent), trackerHelp = help(bins.tracker), setupHelp = help(bins.ctl, "node-setup");
  const doctorHelp = help(bins.ctl, "doctor");
  const all = [
    render(["--set", "nodeSetup.dockerd.enabled=true", "--set", "nodeSetup.crio.enabled=true", "--set", "nodeSetup.arpSysctls.enabled=true",
      "--set", "agent.snapshotter.enabled=true",
      "--set-file", `credentials.dockerConfigJson=${tempFile("{}")}`, "--set", "agent.nodeLabels.pool=gpu"]),
  ].flat();
  for (const o of all) {
    const pod = o.spec?.template?.spec;
    if (!pod) continue;
    for (const c of [...(pod.initContainers || []), ...pod.containers]) {
      const h = c.command[0] === "shoal-agent" ? agentHelp : c.command[0] === "shoal-tracker" ? trackerHelp : c.command[0] === "shoalctl" ? setupHelp : null;
      if (!h) continue;
      for (const e of c.env || []) if (e.name.startsWith("SHOAL_")) assert.ok(h.includes(e.name), `${c.name}: ${e.name} is not in --help`);
      for (const a of [...c.command.slice(2), ...(c.args || [])]) {
        const flag = a.split("=")[0];
        assert.ok(h.includes(flag), `${c.name}: ${flag} is not in --help`);
      }
    }
  }
  // The doctor line in NOTES.txt.
  const notes = renderNotes();
  const doctorLine = notes.slice(notes.indexOf("shoalctl doctor"), notes.indexOf("Prefetch before"));
  for (const flag of doctorLine.match(/--[a-z-]+/g)) assert.ok(doctorHelp.includes(flag), `NOTES: doctor ${flag}`);
  const prefetchLine = notes.slice(notes.indexOf("shoalctl prefetch"), notes.indexOf("Runtimes on"));
  const prefetchHelp = help(bins.ctl, "prefetch");
  for (const flag of prefetchLine.match(/--[a-z-]+/g)) assert.ok(prefetchHelp.includes(flag), `NOTES: prefetch ${flag}`);
});

test("NOTES.txt: how to check the rollout and to prefetch, naming this release's objects", () => {
  const notes = renderNotes(["--set", "nodeSetup.dockerd.enabled=true"]);
  assert.match(notes, /rollout status statefulset\/shoal-tracker/);
  assert.match(notes, /rollout status daemonset\/shoal-agent/);
  assert.match(notes, /shoalctl prefetch gcr.io\/proj\/trainer:v7 --cluster/);
  // The operator token from the chart's Secret, on stdin.
  assert.ok(notes.includes(
    "kubectl -n shoal-system get secret shoal-cluster-credentials -o jsonpath='{.data.operator-token}' | base64 -d | \\\n" +
    "  kubectl -n shoal-system exec -i shoal-tracker-0 -- \\\n"), notes);
  assert.match(notes, /--operator-token-file \/dev\/stdin --tracker http:/);
  assert.match(renderNotes(["--set", "auth.existingSecret=shoal-tokens"]), /get secret shoal-tokens -o jsonpath='\{\.data\.operator-token\}'/);
  assert.ok(notes.includes("http://shoal-tracker-0.shoal-tracker.shoal-system.svc:7070,http://shoal-tracker-1."));
  assert.match(notes, /dockerd: registry-mirrors and max-concurrent-downloads merged/);
  assert.match(notes, /config_path/);
});

test("values.schema.json rejects wrong values with a clear message", () => {
  const cases = [
    [["--set", "tracker.replicas=1"], "tracker.replicas: Must be greater than or equal to 2"],
    [["--set", "agent.shim.bind=0.0.0.0"], "agent.shim.bind must be one of the following"],
    [["--set", "agent.cache.budget=lots"], "agent.cache.budget: Does not match pattern"],
    [["--set", "agent.cache.hostPath=mnt/shoal"], "agent.cache.hostPath: Does not match pattern"],
    [["--set", "agent.shim.port=70000"], "agent.shim.port: Must be less than or equal to 65535"],
    [["--set", "agent.updateStrategy.maxUnavailable=0"], "agent.updateStrategy.maxUnavailable"],
    [["--set", "agent.extraEnv.LISTEN=x"], "agent.extraEnv"],
    [["--set", "upstreams.map.gcr\\.io=gcr.io"], "upstreams.map.gcr.io: Does not match pattern"],
    [["--set", "upstreams.unmapped=maybe"], "upstreams.unmapped: Does not match pattern"],
    [["--set", "nodeSetup.crio.dropIn=/etc/crio.conf"], "nodeSetup.crio.dropIn: Does not match pattern"],
    [["--set", "nodeSetup.dockerd.enable=true"], "Additional property enable is not allowed"],
    [["--set", "tracker.antiAffinity=none"], "tracker.antiAffinity must be one of the following"],
    [["--set", "clusterCredentials.token=x"], "Additional property clusterCredentials is not allowed"],
    [["--set-string", "auth.previousAgentTokens=" + "o".repeat(40)], "auth.previousAgentTokens: Invalid type. Expected: array, given: string"],
    [["--set-string", "auth.agentToken=short"], "auth.agentToken: Does not match pattern"],
    [["--set-string", "auth.agentToken=has a space in the middle"], "auth.agentToken: Does not match pattern"],
    [["--set-string", `auth.operatorToken=#${"c".repeat(30)}`], "auth.operatorToken: Does not match pattern"],
    [["--set-string", "auth.previousOperatorTokens={tooshort}"], "auth.previousOperatorTokens.0: Does not match pattern"],
    [["--set", "auth.existingSecret=Not_A_Name"], "auth.existingSecret: Does not match pattern"],
    [["--set", "image.pullPolicy=Sometimes"], "image.pullPolicy must be one of the following"],
    [["--set", "agent.snapshotter.hostPath=mnt/snaps"], "agent.snapshotter.hostPath"],
    [["--set", "agent.snapshotter.socket=/run/x.sock"], "Additional property socket is not allowed"],
  ];
  for (const [args, message] of cases) {
    const err = renderFails(args);
    assert.ok(err.includes(message), `${args.join(" ")}: expected "${message}" in:\n${err}`);
  }
});

// ---- Dashboard and alert rules against what the processes really export ----

const dashboardFile = path.join(chart, "dashboards/shoal.json");
const alertsFile = path.join(chart, "files/alerts.yaml");
const operationsDoc = path.resolve(here, "../../docs/operations.md");
// Labels a scrape adds to every series (the PodMonitor's target labels); anything else must be
// on the metric in a live /metrics. Never a digest or a node name: those are unbounded.
const targetLabels = new Set(["job", "instance", "namespace", "pod", "container", "endpoint"]);

// Waits for a process's --port-file; returns the port.
async function portFrom(file, proc, log) {
  for (let i = 0; i < 200; i++) {
    if (proc.exitCode !== null) throw new Error(`exited ${proc.exitCode} before writing ${file}:\n${fs.readFileSync(log, "utf8")}`);
    const text = fs.existsSync(file) ? fs.readFileSync(file, "utf8").trim() : "";
    if (text) return Number(text);
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`no ${file} after 10 s:\n${fs.readFileSync(log, "utf8")}`);
}

const httpGet = (url) => new Promise((resolve, reject) => {
  http.get(url, (res) => {
    const chunks = [];
    res.on("data", (c) => chunks.push(c));
    res.on("end", () => resolve({ status: res.statusCode, body: Buffer.concat(chunks) }));
  }).on("error", reject);
});

// A registry with one image demo/app:1 whose config and layer are the same blob (Range requests
// answered), enough for an agent's pull-through.
async function fakeRegistry(blob) {
  const sha256 = (b) => "sha256:" + require("node:crypto").createHash("sha256").update(b).digest("hex");
  const digest = sha256(blob);
  const manifest = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: { mediaType: "application/vnd.oci.image.config.v1+json", digest, size: blob.length },
    layers: [{ mediaType: "application/vnd.oci.image.layer.v1.tar", digest, size: blob.length }] }));
  const manifestDigest = sha256(manifest);
  const server = http.createServer((req, res) => {
    if (req.url === "/v2/") { res.writeHead(200, { "content-type": "application/json" }); return res.end("{}"); }
    if (req.url === "/v2/demo/app/manifests/1" || req.url === `/v2/demo/app/manifests/${manifestDigest}`) {
      res.writeHead(200, { "content-type": "application/vnd.oci.image.manifest.v1+json", "content-length": manifest.length,
        "docker-content-digest": manifestDigest });
      return res.end(req.method === "HEAD" ? undefined : manifest);
    }
    if (!req.url.endsWith(`/blobs/${digest}`)) { res.writeHead(404); return res.end(); }
    const m = /bytes=(\d+)-(\d*)/.exec(req.headers.range || "");
    const start = m ? Number(m[1]) : 0;
    const end = m && m[2] ? Math.min(Number(m[2]), blob.length - 1) : blob.length - 1;
    const headers = { "content-length": end - start + 1, "docker-content-digest": digest, "content-type": "application/octet-stream" };
    if (m) headers["content-range"] = `bytes ${start}-${end}/${blob.length}`;
    res.writeHead(m ? 206 : 200, headers);
    res.end(req.method === "HEAD" ? undefined : blob.subarray(start, end + 1));
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${server.address().port}`, digest, close: () => server.close() };
}

// Metric families of a /metrics text: base name (histograms' and summaries' _bucket/_sum/_count
// folded) -> the label names seen on its series.
function parseMetrics(text, into = new Map()) {
  const types = new Map();
  for (const line of text.split("\n")) {
    const t = /^# TYPE (\S+) (\S+)/.exec(line);
    if (t) types.set(t[1], t[2]);
  }
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s/.exec(line);
    assert.ok(m, `not a sample line: ${line}`);
    let name = m[1];
    const base = name.replace(/_(bucket|sum|count)$/, "");
    if (base !== name && ["histogram", "summary"].includes(types.get(base))) name = base;
    const labels = into.get(name) || new Set();
    for (const l of (m[3] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="/g)) if (l[1] !== "le" && l[1] !== "quantile") labels.add(l[1]);
    into.set(name, labels);
  }
  return into;
}

// The metrics a tracker and two agents export after real pulls: one agent swarming through the
// tracker (with tokens), then serving the blob again from its cache; one whose tracker is gone,
// so it falls back to the registry; a request without a token refused (counters with labels
// appear only once counted). Started from the
// binaries ctest built; every process is killed at the end.
let liveMetricsPromise;
function liveMetrics() {
  liveMetricsPromise ??= (async () => {
    const bins = { agent: process.env.SHOAL_AGENT_BIN, tracker: process.env.SHOAL_TRACKER_BIN };
    for (const b of Object.values(bins)) assert.ok(b && fs.existsSync(b), `built binary ${b} (set by ctest)`);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "shoal-live-metrics-"));
    const procs = [];
    const start = (bin, name, args) => {
      const log = path.join(dir, `${name}.log`);
      const out = fs.openSync(log, "w");
      const proc = spawn(bin, [...args, "--port-file", path.join(dir, `${name}.port`), "--log-format", "text"],
        { stdio: ["ignore", out, out] });
      fs.closeSync(out);
      procs.push(proc);
      return portFrom(path.join(dir, `${name}.port`), proc, log);
    };
    const registry = await fakeRegistry(require("node:crypto").randomBytes(3 << 20));
    try {
      const tokens = { agent: path.join(dir, "agent-token"), operator: path.join(dir, "operator-token") };
      fs.writeFileSync(tokens.agent, `${"a".repeat(40)}\n`);
      fs.writeFileSync(tokens.operator, `${"o".repeat(40)}\n`);
      const trackerPort = await start(bins.tracker, "tracker", ["--listen", "127.0.0.1:0",
        "--agent-tokens-file", tokens.agent, "--operator-tokens-file", tokens.operator]);
      const agentArgs = (name, tracker, extra = []) => ["--listen", "127.0.0.1:0", "--cache-dir", path.join(dir, name),
        "--tracker", tracker, "--tracker-token-file", tokens.agent, "--swarm-listen", "127.0.0.1:0", "--insecure-peers",
        "--cache-budget", "1GiB", "--upstream", `docker.io=${registry.url}`, ...extra];
      const swarmed = await start(bins.agent, "agent", agentArgs("agent", `http://127.0.0.1:${trackerPort}`));
      // Port 1 on loopback refuses: no tracker answers, and with no grace the agent goes upstream.
      const alone = await start(bins.agent, "agent-alone", agentArgs("agent-alone", "http://127.0.0.1:1",
        ["--tracker-grace-ms", "0", "--manifest-wait-ms", "0"]));
      for (const port of [swarmed, swarmed, alone]) {
        for (const p of ["manifests/1", `blobs/${registry.digest}`]) {
          const r = await httpGet(`http://127.0.0.1:${port}/v2/demo/app/${p}`);
          assert.equal(r.status, 200, `GET ${p} through the agent on ${port}`);
        }
      }
      assert.equal((await httpGet(`http://127.0.0.1:${trackerPort}/v1/cluster`)).status, 401, "no operator token");
      const metrics = { agent: new Map(), tracker: new Map() };
      for (const [port, kind] of [[swarmed, "agent"], [alone, "agent"], [trackerPort, "tracker"]]) {
        const r = await httpGet(`http://127.0.0.1:${port}/metrics`);
        assert.equal(r.status, 200);
        parseMetrics(r.body.toString(), metrics[kind]);
      }
      // What the pulls must have made appear, or the comparison below proves little.
      for (const name of ["shoal_swarm_fallback_total", "shoal_manifest_tracker_fallbacks_total", "shoal_upstream_blob_fetches_total",
        "shoal_swarm_chunks_total", "shoal_shim_requests_total"]) {
        assert.ok(metrics.agent.has(name), `agents export ${name} after the pulls`);
      }
      for (const name of ["shoal_tracker_http_requests_total", "shoal_tracker_blob_api_requests_total", "shoal_tracker_refused_requests_total"]) {
        assert.ok(metrics.tracker.has(name), `the tracker exports ${name} after the pulls`);
      }
      // up is Prometheus' own, per target.
      metrics.all = new Map([...metrics.agent, ...metrics.tracker, ["up", new Set()]]);
      return metrics;
    } finally {
      for (const p of procs) if (p.exitCode === null) p.kill("SIGKILL");
      registry.close();
      await Promise.all(procs.map((p) => (p.exitCode === null && p.signalCode === null ? new Promise((r) => p.once("exit", r)) : null)));
      fs.rmSync(dir, { recursive: true, force: true });
    }
  })();
  return liveMetricsPromise;
}

// Grafana's variables replaced by what they expand to, so the expression is plain PromQL.
const expandGrafana = (expr) => expr.replaceAll("$__rate_interval", "5m").replaceAll("$__range", "1h")
  .replaceAll("$namespace", ".*").replaceAll("$instance", ".*");

// Metric and label names an expression uses: selectors name{...}, bare shoal_* names, and the
// labels of by/without/on/ignoring/group_left/group_right. Errors name what is not exported.
function checkExpr(expr, live, where) {
  const errors = [];
  const text = expandGrafana(expr).replace(/"(?:[^"\\]|\\.)*"/g, '""');
  const used = new Set();
  // A histogram's series (name_bucket with its le, name_sum, name_count) are its family's.
  const family = (name) => {
    if (live.has(name)) return name;
    const base = name.replace(/_(bucket|sum|count)$/, "");
    return base !== name && live.has(base) ? base : name;
  };
  const bucketsUsed = /_bucket\b/.test(text);
  for (const m of text.matchAll(/([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}/g)) {
    const [, series, matchers] = m;
    const name = family(series);
    used.add(name);
    if (!live.has(name)) { errors.push(`${where}: ${series} is not exported`); continue; }
    for (const l of matchers.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)/g)) {
      if (!targetLabels.has(l[1]) && !live.get(name).has(l[1])) errors.push(`${where}: ${name} has no label ${l[1]}`);
    }
  }
  for (const m of text.matchAll(/\bshoal_[a-zA-Z0-9_:]*/g)) {
    const name = family(m[0]);
    used.add(name);
    if (!live.has(name)) errors.push(`${where}: ${m[0]} is not exported`);
  }
  const labelsOfUsed = new Set([...used].flatMap((n) => [...(live.get(n) || [])]));
  if (bucketsUsed) labelsOfUsed.add("le");
  for (const m of text.matchAll(/\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)/g)) {
    for (const l of m[2].split(",").map((x) => x.trim()).filter(Boolean)) {
      if (!targetLabels.has(l) && !labelsOfUsed.has(l)) errors.push(`${where}: no metric in it has the label ${l} (${m[0]})`);
    }
  }
  if (used.size === 0) errors.push(`${where}: names no metric`);
  return errors;
}

// Every panel with its queries (rows hold their panels when collapsed).
const dashboardPanels = (d) => d.panels.flatMap((p) => (p.type === "row" ? p.panels || [] : [p]));
const dashboardQueries = (d) => [
  ...dashboardPanels(d).flatMap((p) => (p.targets || []).map((t) => [`panel "${p.title}" ${t.refId}`, t.expr])),
  ...d.templating.list.filter((v) => v.type === "query").map((v) => [`variable ${v.name}`,
    (typeof v.query === "string" ? v.query : v.query.query).replace(/^label_values\((.*),\s*[a-z_]+\)$/, "$1")]),
];
const alertRules = () => yaml.load(fs.readFileSync(alertsFile, "utf8")).groups.flatMap((g) => g.rules);

test("dashboard: the JSON parses, every panel has queries, and they use the datasource variable", () => {
  const d = JSON.parse(fs.readFileSync(dashboardFile, "utf8"));
  assert.equal(d.uid, "shoal-overview");
  const panels = dashboardPanels(d);
  assert.ok(panels.length >= 20, `${panels.length} panels`);
  assert.equal(new Set(d.panels.map((p) => p.id)).size, d.panels.length, "panel ids are unique");
  const rows = d.panels.filter((p) => p.type === "row").map((p) => p.title);
  for (const q of ["every node", "NAT", "slow or failing", "bottleneck", "Cache"]) {
    assert.ok(rows.some((r) => r.includes(q)), `a row about ${q}: ${rows.join(" | ")}`);
  }
  assert.ok(d.templating.list.some((v) => v.type === "datasource" && v.name === "datasource"));
  for (const p of panels) {
    assert.ok(p.title && p.description, `panel ${p.id} has a title and a description`);
    assert.ok(p.targets?.length > 0 && p.targets.every((t) => t.expr), `panel "${p.title}" has queries`);
    assert.deepEqual(p.datasource, { type: "prometheus", uid: "${datasource}" }, p.title);
    assert.ok(p.gridPos.w > 0 && p.gridPos.x + p.gridPos.w <= 24, `panel "${p.title}" fits the grid`);
  }
});

test("dashboard and alert rules name only metrics and labels a live tracker and agent export", async () => {
  const live = await liveMetrics();
  const d = JSON.parse(fs.readFileSync(dashboardFile, "utf8"));
  const errors = [
    ...dashboardQueries(d).flatMap(([where, expr]) => checkExpr(expr, live.all, where)),
    ...alertRules().flatMap((r) => checkExpr(r.expr, live.all, `alert ${r.alert}`)),
  ];
  assert.deepEqual(errors, [], `live metrics: ${[...live.all.keys()].sort().join(" ")}`);
  // The metrics the operator's questions need are all used somewhere.
  const everything = JSON.stringify(d) + fs.readFileSync(alertsFile, "utf8");
  for (const name of ["shoal_upstream_blob_bytes_total", "shoal_swarm_peer_bytes_total", "shoal_shim_blob_bytes_total",
    "shoal_swarm_fallback_total", "shoal_tracker_leases_active", "shoal_tracker_lease_waits_total", "shoal_cache_budget_bytes",
    "shoal_cache_evictions_total", "shoal_tracker_prefetch_nodes", "shoal_tracker_http_requests_total", "shoal_tracker_peers"]) {
    assert.ok(everything.includes(name), `${name} is on the dashboard or in the rules`);
  }
  // Agent series carry no unbounded label.
  for (const [name, labels] of live.agent) for (const l of ["digest", "node", "image", "blob"]) assert.ok(!labels.has(l), `${name}{${l}}`);
});

const promtool = ["/usr/bin/promtool", path.join(tools, "bin/promtool")].find((p) => fs.existsSync(p));

test("promtool check rules: the alert rules, and every dashboard query as a recording rule", { skip: !promtool && "promtool not installed (Debian package prometheus, scripts/setup.sh)" }, () => {
  const out = execFileSync(promtool, ["check", "rules", alertsFile], { encoding: "utf8" });
  assert.match(out, new RegExp(`SUCCESS: ${alertRules().length} rules found`));
  const d = JSON.parse(fs.readFileSync(dashboardFile, "utf8"));
  const rules = dashboardQueries(d).map(([, expr], i) => ({ record: `shoal:dashboard_query_${i}`, expr: expandGrafana(expr) }));
  const file = tempFile("");
  fs.writeFileSync(file, yaml.dump({ groups: [{ name: "dashboard", rules }] }));
  const r = spawnSync(promtool, ["check", "rules", file], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});

test("dashboard ConfigMap: the sidecar's label, the JSON unchanged, namespace and label configurable, off when disabled", () => {
  const cm = find(render(), "ConfigMap", "-dashboard");
  assert.equal(cm.metadata.namespace, "shoal-system");
  assert.equal(cm.metadata.labels.grafana_dashboard, "1");
  assert.deepEqual(JSON.parse(cm.data["shoal.json"]), JSON.parse(fs.readFileSync(dashboardFile, "utf8")),
    "the file as is: Grafana's {{instance}} legends are not Helm templates");
  assert.ok(Buffer.byteLength(cm.data["shoal.json"]) < 512 * 1024, "well below a ConfigMap's 1 MiB");
  const custom = find(render(["--set", "monitoring.grafanaDashboard.label=dashboards", "--set-string", "monitoring.grafanaDashboard.labelValue=shoal",
    "--set", "monitoring.grafanaDashboard.namespace=monitoring", "--set", "monitoring.grafanaDashboard.annotations.grafana_folder=shoal"]), "ConfigMap", "-dashboard");
  assert.equal(custom.metadata.namespace, "monitoring");
  assert.equal(custom.metadata.labels.dashboards, "shoal");
  assert.equal(custom.metadata.labels.grafana_dashboard, undefined);
  assert.equal(custom.metadata.annotations.grafana_folder, "shoal");
  assert.equal(find(render(["--set", "monitoring.grafanaDashboard.enabled=false"]), "ConfigMap", "-dashboard"), undefined);
  assert.match(renderFails(["--set", "monitoring.grafanaDashboard.label=has space"]), /monitoring.grafanaDashboard.label: Does not match pattern/);
});

test("PrometheusRule: only when the CRD exists; the groups of files/alerts.yaml; a runbook line per alert in docs/operations.md", () => {
  const ruleArgs = ["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"];
  assert.equal(find(render(), "PrometheusRule"), undefined);
  assert.equal(find(render(["--set", "monitoring.prometheusRule.enabled=false"], ruleArgs), "PrometheusRule"), undefined);
  const pr = find(render([], ruleArgs), "PrometheusRule");
  validate(pr);
  assert.equal(pr.metadata.namespace, "shoal-system");
  const file = yaml.load(fs.readFileSync(alertsFile, "utf8"));
  assert.deepEqual(pr.spec.groups, file.groups, "rendered unchanged: the rules promtool checked are the rules Prometheus runs");
  const names = alertRules().map((r) => r.alert);
  for (const a of ["ShoalAgentDown", "ShoalTrackerReplicaDown", "ShoalDirectFallbacks", "ShoalUpstreamErrors", "ShoalCacheNearBudget",
    "ShoalPrefetchStuck", "ShoalLeasesStuck"]) assert.ok(names.includes(a), a);
  // Each alert's runbook: an annotation naming its line in the Alerts section, which exists.
  const doc = fs.readFileSync(operationsDoc, "utf8");
  const alertsSection = doc.slice(doc.indexOf("\n### Alerts"));
  assert.ok(doc.includes("\n### Alerts"), "docs/operations.md has an Alerts section");
  for (const r of alertRules()) {
    assert.equal(r.annotations.runbook, `docs/operations.md, Alerts: ${r.alert}`);
    assert.ok(r.annotations.summary && r.labels.severity, r.alert);
    assert.match(alertsSection, new RegExp(`^- \\*\\*${r.alert}\\*\\*`, "m"), `a runbook line for ${r.alert}`);
  }
  // runbook_url and extra labels when asked for; a rule's own severity stays.
  const withUrl = find(render(["--set", "monitoring.prometheusRule.runbookUrl=https://git.example/shoal/blob/main/docs/operations.md#alerts",
    "--set", "monitoring.prometheusRule.ruleLabels.team=infra", "--set", "monitoring.prometheusRule.ruleLabels.severity=page",
    "--set", "monitoring.prometheusRule.labels.release=kube-prometheus-stack"], ruleArgs), "PrometheusRule");
  assert.equal(withUrl.metadata.labels.release, "kube-prometheus-stack");
  for (const r of withUrl.spec.groups.flatMap((g) => g.rules)) {
    assert.equal(r.annotations.runbook_url, "https://git.example/shoal/blob/main/docs/operations.md#alerts");
    assert.equal(r.labels.team, "infra");
    assert.notEqual(r.labels.severity, "page");
  }
});

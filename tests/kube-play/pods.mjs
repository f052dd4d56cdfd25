// Turns the chart's rendered agent DaemonSet and tracker StatefulSet into plain Pods that
// `podman kube play` runs (it plays Pods and Deployments, not DaemonSets or StatefulSets).
// What it stands in for, and nothing more:
//   - the DaemonSet controller: one agent Pod, from the DaemonSet's own pod template;
//   - the StatefulSet controller: tracker Pod "-0" from the StatefulSet's template;
//   - the node: every hostPath is moved under HOST (a temp dir standing for the node's /);
//   - the downward API (podman fills no fieldRef): NODE_IP = 127.0.0.1, SHOAL_NODE_NAME = NODE;
//   - cluster DNS (the trackers' headless-Service names): SHOAL_TRACKERS = TRACKER_URL;
//   - Secret volumes (podman 4.3 plays none): each pod's Secret volume becomes a ConfigMap of
//     its own holding only the items that volume selects, so a pod still sees exactly the files
//     Kubernetes would mount (the agent its agent-token, the tracker the accepted lists) and the
//     tracker still refuses calls without a token. Podman applies no defaultMode or fsGroup to
//     them: its files are 0644. The chart's ConfigMaps are played along (podman reads them from
//     the same YAML).
//   - dependent environment variables (podman 4.3 passes "$(NODE_IP):6881" on literally; it
//     expands $(VAR) nowhere in env values): each value's $(VAR) references are expanded here
//     the way the kubelet does it (variables defined earlier in the same container's env;
//     "$$" is a literal "$"; a reference to an unknown variable is left as it is).
//   - volumeMounts[].subPath (podman kube play reads it from 4.4 on; 4.3 ignores it and mounts
//     the whole volume, so /etc/shoal/upstreams.json would be a directory): what the kubelet
//     does for a ConfigMap subPath, done here: the key's file is written under HOST where the
//     kubelet keeps a pod's ConfigMap volumes (var/lib/kubelet/pods/POD/volumes/
//     kubernetes.io~configmap/VOLUME/KEY), and that one file is bind-mounted (a hostPath
//     volume of type File) at the mount path. Like a subPath mount, it never sees an update.
//     A subPath into a hostPath volume becomes a hostPath volume of PATH/SUBPATH; any other
//     subPath is refused here rather than silently mounted whole.
//   - hostPID (podman kube play reads it from 4.5 on; 4.3 gives the pod a private PID namespace,
//     and node setup's SIGHUP to the host's dockerd, found by its pid file, would hit no
//     process): no Pod field of 4.3 can say it, so pods.json marks the pod ("hostPID": true,
//     the field is kept) and kube-play-proof.sh plays that pod with a containers.conf of
//     `pidns = "host"`, which podman applies to each of its containers (init ones too), and
//     checks the PID mode it got.
//   - init containers run once (Kubernetes never restarts one that succeeded): podman 4.3 gives
//     them the pod's restart policy, and under "Always" (a DaemonSet's) it restarted the
//     succeeded node-setup container while `kube play` was removing it ("failed to remove once
//     init container ... as it is running", seen with the host PID namespace). A pod with init
//     containers is played with restartPolicy OnFailure: the same for init containers, and for
//     the agent it only differs if the agent exits 0 (it then stays down). And podman 4.3
//     deletes a "once" init container (its default) after it ran, logs and all, where
//     `kubectl logs -c node-setup` still shows them: such a pod carries podman's annotation
//     io.podman.annotations.init.container.type=always (kept, run at each pod start).
//   - ports of a hostNetwork pod: in Kubernetes they are informational there (hostPort must
//     equal containerPort; the process listens on the node's network itself). podman 4.3 makes
//     every containerPort a port mapping, hostPort or not, and refuses any with the host network
//     ("PortMappings can only be used with Bridge or slirp4netns networking"): a hostNetwork
//     pod's ports are dropped here, so its ports are the node's ports, as in Kubernetes.
//   - probes: a probe naming a port (tracker: "port: http") gets its number, as the kubelet
//     looks it up (podman 4.3 made it http://localhost:0/healthz). podman turns the liveness
//     probe into a healthcheck that its systemd timers would run; this machine has no systemd
//     ("unable to get systemd connection to add healthchecks" in kube play's output), so
//     kube-play-proof.sh runs each pod's healthcheck once itself (`podman healthcheck run`).
// Usage: node pods.mjs RENDERED.yaml HOST TRACKER_URL TRACKER_PORT OUTDIR
// writes OUTDIR/POD.yaml for each pod (with the ConfigMaps it mounts), and OUTDIR/pods.json:
// [{"name", "file", "hostPID", "configMaps": [...]}], the podman volumes its ConfigMaps
// become (they outlive `podman kube down`); and the files of ConfigMap subPath mounts under HOST.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const tools = process.env.SHOAL_TOOLS || "/opt/shoal-tools";
const require = createRequire(path.join(tools, "node_modules/"));
const yaml = require("js-yaml");

const [rendered, host, trackerUrl, trackerPort, outDir] = process.argv.slice(2);
if (!outDir) throw new Error("usage: node pods.mjs RENDERED.yaml HOST TRACKER_URL TRACKER_PORT OUTDIR");
const objs = yaml.loadAll(fs.readFileSync(rendered, "utf8")).filter((o) => o);
const isHook = (o) => (o.metadata.annotations || {})["helm.sh/hook"];
const ds = objs.find((o) => o.kind === "DaemonSet" && !isHook(o));
const sts = objs.find((o) => o.kind === "StatefulSet");
const secrets = new Map(objs.filter((o) => o.kind === "Secret" && !isHook(o)).map((o) => [o.metadata.name, o]));
const configMaps = objs.filter((o) => o.kind === "ConfigMap" && !isHook(o));

function fixEnv(containers) {
  for (const c of containers || []) {
    for (const e of c.env || []) {
      if (e.name === "NODE_IP") e.value = "127.0.0.1";
      if (e.name === "SHOAL_NODE_NAME") e.value = "kube-play-node";
      if (e.name === "SHOAL_TRACKERS") e.value = trackerUrl;
      if (e.valueFrom) delete e.valueFrom;
    }
    expandDependentEnv(c);
  }
}

// Kubernetes' expansion of $(VAR) in env values (k8s.io/kubernetes third_party/forked/golang/
// expansion): VAR is looked up among the variables defined before it in this container.
function expandDependentEnv(c) {
  const defined = new Map();
  for (const e of c.env || []) {
    if (typeof e.value === "string") {
      e.value = e.value.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (ref, name) =>
        ref === "$$" ? "$" : defined.has(name) ? defined.get(name) : ref);
      defined.set(e.name, e.value);
    }
  }
}

// subPath mounts, which podman 4.3 ignores (see the top of this file).
function convertSubPaths(name, spec) {
  const volumes = new Map((spec.volumes || []).map((v) => [v.name, v]));
  const cmByName = new Map(configMaps.map((cm) => [cm.metadata.name, cm]));
  let converted = 0;
  for (const c of [...(spec.initContainers || []), ...(spec.containers || [])]) {
    for (const m of c.volumeMounts || []) {
      if (m.subPath === undefined) continue;
      const v = volumes.get(m.volumeName || m.name);
      const sub = m.subPath;
      if (path.isAbsolute(sub) || sub.split("/").includes("..")) {
        throw new Error(`pod ${name}: ${c.name} mounts subPath ${sub}, which Kubernetes refuses`);
      }
      const subName = `${m.name}-subpath-${converted++}`;
      if (v && v.configMap) {
        const cm = cmByName.get(v.configMap.name);
        if (!cm) throw new Error(`pod ${name}: no ConfigMap ${v.configMap.name} for volume ${v.name}`);
        // The volume's files: its items (key -> path), or every key.
        const files = Object.fromEntries((v.configMap.items || Object.keys(cm.data || {}).map((key) => ({ key, path: key })))
          .map(({ key, path: file }) => [file, (cm.data || {})[key]]));
        if (typeof files[sub] !== "string") {
          throw new Error(`pod ${name}: ${c.name} mounts subPath ${sub} of ConfigMap ${cm.metadata.name}, which has no such file`);
        }
        const file = path.join(host, "var/lib/kubelet/pods", name, "volumes/kubernetes.io~configmap", v.name, sub);
        fs.mkdirSync(path.dirname(file), { recursive: true });
        fs.writeFileSync(file, files[sub], { mode: 0o644 });
        spec.volumes.push({ name: subName, hostPath: { path: file, type: "File" } });
      } else if (v && v.hostPath) {
        spec.volumes.push({ name: subName, hostPath: { path: path.join(v.hostPath.path, sub) } });
      } else {
        throw new Error(`pod ${name}: ${c.name} mounts subPath ${sub} of volume ${m.name}: not converted for podman`);
      }
      m.name = subName;
      delete m.subPath;
    }
  }
}

function pod(name, template) {
  const spec = structuredClone(template.spec);
  for (const v of spec.volumes || []) {
    if (v.hostPath) v.hostPath.path = path.join(host, v.hostPath.path);
    if (v.secret) {
      const secret = secrets.get(v.secret.secretName);
      if (!secret) throw new Error(`pod ${name}: volume ${v.name} names Secret ${v.secret.secretName}, which the chart did not render`);
      const decoded = Object.fromEntries(
        Object.entries(secret.data || {}).map(([k, b64]) => [k, Buffer.from(b64, "base64").toString("utf8")]));
      const items = v.secret.items || Object.keys(decoded).map((key) => ({ key, path: key }));
      const data = {};
      for (const { key, path: file } of items) {
        if (!(key in decoded)) throw new Error(`pod ${name}: Secret ${secret.metadata.name} has no key ${key}`);
        data[file] = decoded[key];
      }
      const cmName = `${name}-${v.name}`;
      configMaps.push({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: cmName }, data });
      v.configMap = { name: cmName };
      delete v.secret;
    }
  }
  fixEnv(spec.initContainers);
  fixEnv(spec.containers);
  convertSubPaths(name, spec);
  // podman has no priority classes.
  delete spec.priorityClassName;
  if ((spec.initContainers || []).length > 0) spec.restartPolicy = "OnFailure";
  // Probes that name a port ("port: http"): podman 4.3 makes the liveness probe a healthcheck
  // of http://localhost:0/... from them; the kubelet looks the name up in the container's ports.
  for (const c of [...(spec.initContainers || []), ...(spec.containers || [])]) {
    const byName = new Map((c.ports || []).filter((p) => p.name).map((p) => [p.name, p.containerPort]));
    for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"].map((k) => c[k]).filter((p) => p)) {
      for (const h of [probe.httpGet, probe.tcpSocket].filter((h) => h && typeof h.port === "string")) {
        if (!byName.has(h.port)) throw new Error(`pod ${name}: ${c.name}'s probe names port ${h.port}, which it does not have`);
        h.port = byName.get(h.port);
      }
    }
  }
  if (spec.hostNetwork) {
    for (const c of [...(spec.initContainers || []), ...(spec.containers || [])]) {
      for (const port of c.ports || []) {
        if (port.hostPort !== undefined && port.hostPort !== port.containerPort) {
          throw new Error(`pod ${name}: ${c.name} has hostPort ${port.hostPort} != containerPort ${port.containerPort} on the host network`);
        }
      }
      delete c.ports;
    }
  }
  const metadata = { name, labels: template.metadata.labels };
  if ((spec.initContainers || []).length > 0) {
    metadata.annotations = { "io.podman.annotations.init.container.type": "always" };
  }
  return { apiVersion: "v1", kind: "Pod", metadata, spec };
}

const tracker = pod(`${sts.metadata.name}-0`, sts.spec.template);
// Pod networking stands in for the cluster network: the tracker's port is published on loopback.
tracker.spec.containers[0].ports[0].hostPort = Number(trackerPort);
tracker.spec.containers[0].ports[0].hostIP = "127.0.0.1";
delete tracker.spec.affinity;
const agent = pod(`${ds.metadata.name}-kube-play-node`, ds.spec.template);

const index = [];
fs.mkdirSync(outDir, { recursive: true });
for (const p of [tracker, agent]) {
  const used = new Set((p.spec.volumes || []).filter((v) => v.configMap).map((v) => v.configMap.name));
  const cms = configMaps.filter((cm) => used.has(cm.metadata.name));
  const file = path.join(outDir, `${p.metadata.name}.yaml`);
  fs.writeFileSync(file, [...cms, p].map((o) => yaml.dump(o)).join("---\n"));
  index.push({ name: p.metadata.name, file, hostPID: p.spec.hostPID === true, configMaps: [...used] });
}
fs.writeFileSync(path.join(outDir, "pods.json"), JSON.stringify(index, null, 2) + "\n");

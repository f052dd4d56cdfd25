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
// Usage: node pods.mjs RENDERED.yaml HOST TRACKER_URL TRACKER_PORT > pods.yaml
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const tools = process.env.SHOAL_TOOLS || "/opt/shoal-tools";
const require = createRequire(path.join(tools, "node_modules/"));
const yaml = require("js-yaml");

const [rendered, host, trackerUrl, trackerPort] = process.argv.slice(2);
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
  // podman has no priority classes.
  delete spec.priorityClassName;
  return { apiVersion: "v1", kind: "Pod", metadata: { name, labels: template.metadata.labels }, spec };
}

const tracker = pod(`${sts.metadata.name}-0`, sts.spec.template);
// Pod networking stands in for the cluster network: the tracker's port is published on loopback.
tracker.spec.containers[0].ports[0].hostPort = Number(trackerPort);
tracker.spec.containers[0].ports[0].hostIP = "127.0.0.1";
delete tracker.spec.affinity;
const agent = pod(`${ds.metadata.name}-kube-play-node`, ds.spec.template);
process.stdout.write([...configMaps, tracker, agent].map((o) => yaml.dump(o)).join("---\n"));

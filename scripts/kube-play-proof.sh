#!/usr/bin/env bash
# The chart's rendered pods, run for real with `podman kube play` from the image that
# scripts/build-image.sh built (run that first; this script does not build it). Not part of
# scripts/test.sh: the image build alone compiles the whole project (too slow for CI's budget).
#
# A temp dir stands for the node's / (every hostPath of the pods is moved under it); a
# docker-registry on loopback stands for gcr.io and Docker Hub; tests/kube-play/pods.mjs turns the
# DaemonSet and StatefulSet into Pods and says which parts of Kubernetes it stands in for.
# Then, through the agent pod:
#   1. skopeo (a real client) copies an image by the registry-prefix name;
#   2. a real containerd pulls it with the hosts.toml the init container wrote into the "host";
#   3. a real dockerd, whose daemon.json the init container merged into and sent SIGHUP, lists
#      the mirror in `docker info` without a restart and pulls a Docker Hub name through it.
# Usage: scripts/kube-play-proof.sh     (as root; keeps nothing unless SHOAL_KEEP_TMP=1)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
OUT="${SHOAL_IMAGE_DIR:-$ROOT/build/image}"
VERSION="$(sed -n 's/^project(shoal VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)"
IMAGE="localhost/shoal:$VERSION"
SHOAL_TOOLS="${SHOAL_TOOLS:-/opt/shoal-tools}"
HELM="$SHOAL_TOOLS/bin/helm"
export CONTAINERS_CONF="$OUT/containers.conf"
podman_() { podman --root "$OUT/storage" --runroot "$OUT/run" --storage-driver overlay "$@"; }
podman_ image exists "$IMAGE" || { echo "kube-play: no $IMAGE: run scripts/build-image.sh" >&2; exit 2; }

WORK="$(mktemp -d /tmp/shoal-kube-play-XXXXXX)"
HOST="$WORK/host"
mkdir -p "$HOST"
pids=()
cleanup() {
  set +e
  [ -f "$WORK/pods.yaml" ] && podman_ kube down "$WORK/pods.yaml" >/dev/null 2>&1
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  umount "$WORK/docker-data" 2>/dev/null
  if [ "${SHOAL_KEEP_TMP:-0}" = 1 ]; then echo "kube-play: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 "${2:-300}"); do curl -fsS -o /dev/null "$1" && return 0; sleep 0.2; done; return 1; }
step() { echo "kube-play: $*"; }

REG_PORT=$(free_port); SHIM_PORT=$(free_port); SWARM_PORT=$(free_port); TRACKER_PORT=$(free_port)

# The upstream: Debian's docker-registry, filled with the shoal image itself (~6 layers).
cat > "$WORK/registry.yml" <<EOF
version: 0.1
storage: {filesystem: {rootdirectory: $WORK/registry}, delete: {enabled: true}}
http: {addr: 127.0.0.1:$REG_PORT}
log: {level: warn}
EOF
docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 & pids+=($!)
wait_http "http://127.0.0.1:$REG_PORT/v2/"
for name in proj/shoal library/shoal; do
  skopeo copy -q --dest-tls-verify=false "oci-archive:$OUT/shoal-$VERSION.oci.tar" \
    "docker://127.0.0.1:$REG_PORT/$name:1"
done
UP_DIGEST="$(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://127.0.0.1:$REG_PORT/proj/shoal:1")"
step "upstream 127.0.0.1:$REG_PORT has proj/shoal:1 and library/shoal:1 ($UP_DIGEST)"

# The node's dockerd, running before the agent arrives, with a daemon.json of its own.
mkdir -p "$HOST/etc/docker" "$HOST/var/run"
cat > "$HOST/etc/docker/daemon.json" <<EOF
{
  "log-level": "info",
  "data-root": "$WORK/docker-data",
  "exec-root": "$WORK/docker-exec",
  "pidfile": "$HOST/var/run/docker.pid",
  "hosts": ["unix://$WORK/docker.sock"],
  "storage-driver": "vfs",
  "iptables": false,
  "bridge": "none"
}
EOF
cp "$HOST/etc/docker/daemon.json" "$WORK/daemon.json.before"
dockerd --config-file "$HOST/etc/docker/daemon.json" >"$WORK/dockerd.log" 2>&1 & pids+=($!)
export DOCKER_HOST="unix://$WORK/docker.sock" DOCKER_CONFIG="$WORK/docker-client"
mkdir -p "$DOCKER_CONFIG"
for _ in $(seq 1 300); do /usr/bin/docker version >/dev/null 2>&1 && break; sleep 0.2; done
DOCKERD_PID="$(cat "$HOST/var/run/docker.pid")"
step "dockerd pid $DOCKERD_PID, mirrors before: $(/usr/bin/docker info --format '{{json .RegistryConfig.Mirrors}}')"

# Render the chart for this "node" and play it.
"$HELM" template shoal helm/shoal --namespace shoal-system \
  --set image.repository=localhost/shoal --set image.tag="$VERSION" --set image.pullPolicy=Never \
  --set agent.shim.port="$SHIM_PORT" --set agent.swarm.port="$SWARM_PORT" \
  --set-string "upstreams.map.gcr\\.io=http://127.0.0.1:$REG_PORT" \
  --set-string "upstreams.map.docker\\.io=http://127.0.0.1:$REG_PORT" \
  --set nodeSetup.dockerd.enabled=true --set nodeSetup.crio.enabled=true \
  --set agent.logFormat=text >"$WORK/rendered.yaml"
node tests/kube-play/pods.mjs "$WORK/rendered.yaml" "$HOST" "http://127.0.0.1:$TRACKER_PORT" \
  "$TRACKER_PORT" >"$WORK/pods.yaml"
podman_ kube play "$WORK/pods.yaml"
wait_http "http://127.0.0.1:$TRACKER_PORT/healthz" || { podman_ pod logs shoal-tracker-0 | tail; exit 1; }
wait_http "http://127.0.0.1:$SHIM_PORT/healthz" 600 || { podman_ pod logs shoal-agent-kube-play-node | tail -30; exit 1; }
step "tracker pod and agent pod are up; the init container said:"
podman_ logs shoal-agent-kube-play-node-node-setup 2>&1 | sed 's/^/  /'

# 1. A real client through the agent pod.
skopeo copy -q --src-tls-verify=false "docker://127.0.0.1:$SHIM_PORT/gcr.io/proj/shoal:1" "oci:$WORK/skopeo-out:1"
GOT="sha256:$(sha256sum "$WORK/skopeo-out/blobs/sha256/$(jq -r '.manifests[0].digest' "$WORK/skopeo-out/index.json" | cut -d: -f2)" | cut -d' ' -f1)"
[ "$(jq -r '.manifests[0].digest' "$WORK/skopeo-out/index.json")" = "$UP_DIGEST" ] || { echo "kube-play: skopeo got another manifest" >&2; exit 1; }
step "1. skopeo copied gcr.io/proj/shoal:1 through the agent pod: $UP_DIGEST"

# 2. containerd with the hosts.toml the init container wrote into the host's certs.d.
cat "$HOST/etc/containerd/certs.d/gcr.io/hosts.toml" | sed 's/^/  /'
cat > "$WORK/containerd.toml" <<EOF
version = 2
root = "$WORK/containerd/root"
state = "$WORK/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$WORK/containerd.sock"
[ttrpc]
  address = "$WORK/containerd-ttrpc.sock"
EOF
containerd --config "$WORK/containerd.toml" >"$WORK/containerd.log" 2>&1 & pids+=($!)
for _ in $(seq 1 150); do ctr --address "$WORK/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
ctr --address "$WORK/containerd.sock" images pull --snapshotter native \
  --hosts-dir "$HOST/etc/containerd/certs.d" gcr.io/proj/shoal:1 >/dev/null
CTR_DIGEST="$(ctr --address "$WORK/containerd.sock" images ls | awk '$1 == "gcr.io/proj/shoal:1" {print $3}')"
[ "$CTR_DIGEST" = "$UP_DIGEST" ] || { echo "kube-play: containerd has $CTR_DIGEST" >&2; exit 1; }
step "2. containerd pulled gcr.io/proj/shoal:1 through the agent pod with the written hosts.toml"

# 3. dockerd: merged daemon.json, SIGHUP, no restart, pulls a Docker Hub name through the mirror.
MIRRORS=""
for _ in $(seq 1 50); do
  MIRRORS="$(/usr/bin/docker info --format '{{json .RegistryConfig.Mirrors}}')"
  case "$MIRRORS" in *"127.0.0.1:$SHIM_PORT"*) break ;; esac
  sleep 0.2
done
case "$MIRRORS" in *"127.0.0.1:$SHIM_PORT"*) ;; *) echo "kube-play: dockerd mirrors: $MIRRORS" >&2; exit 1 ;; esac
[ "$(cat "$HOST/var/run/docker.pid")" = "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" || { echo "kube-play: dockerd restarted" >&2; exit 1; }
diff <(jq -S 'del(."registry-mirrors", ."insecure-registries", ."max-concurrent-downloads")' "$HOST/etc/docker/daemon.json") \
     <(jq -S . "$WORK/daemon.json.before") >/dev/null || { echo "kube-play: daemon.json lost keys" >&2; exit 1; }
/usr/bin/docker pull -q shoal:1 >/dev/null
step "3. dockerd (pid $DOCKERD_PID, not restarted) lists $MIRRORS and pulled docker.io/library/shoal:1 through it"
step "agent metrics: $(curl -fsS "http://127.0.0.1:$SHIM_PORT/metrics" | grep -E '^shoal_shim_blob_bytes_total' | head -3 | tr '\n' ' ')"
echo "kube-play: 3 passed, 0 failed"

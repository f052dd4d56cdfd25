#!/usr/bin/env bash
# Sets up the machine, builds shoal and runs the whole test suite (unit + integration).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
# Two at a time: the integration tests are processes on loopback and fit a 2-core machine.
ctest --preset release -j2 --timeout 900 "$@"

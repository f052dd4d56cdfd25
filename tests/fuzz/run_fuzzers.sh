#!/usr/bin/env bash
# Runs libFuzzer binaries from a SHOAL_FUZZ=ON build for a while each, one after the other.
#   tests/fuzz/run_fuzzers.sh BUILD_DIR [SECONDS_EACH=60] [NAME...]
# NAME is a target without the _fuzz suffix (default: every <name>_fuzz found in BUILD_DIR).
# New corpus entries go to BUILD_DIR/fuzz-corpus/<name>/, crashes to BUILD_DIR/fuzz-artifacts/;
# the checked-in seeds in tests/fuzz/corpus/<name>/ are read, never written. Exit status is
# non-zero if any fuzzer found a crash, leak, timeout or FUZZ_CHECK failure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
build="${1:?usage: $0 BUILD_DIR [SECONDS_EACH] [NAME...]}"
seconds="${2:-60}"
shift $(( $# >= 2 ? 2 : 1 ))
build="$(cd "$build" && pwd)"

names=("$@")
if [ "${#names[@]}" -eq 0 ]; then
  for src in "$here"/*_fuzz.cc; do
    n="$(basename "$src" _fuzz.cc)"
    names+=("$n")
  done
fi

failed=0
for n in "${names[@]}"; do
  bin="$(find "$build" -type f -name "${n}_fuzz" -perm -u+x | head -n1)"
  if [ -z "$bin" ]; then
    echo "run_fuzzers: no ${n}_fuzz under $build (configure: CXX=clang++ -DSHOAL_FUZZ=ON)" >&2
    failed=1
    continue
  fi
  corpus="$build/fuzz-corpus/$n"
  artifacts="$build/fuzz-artifacts/$n/"
  mkdir -p "$corpus" "$artifacts"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts")
  if [ -f "$here/$n.dict" ]; then args+=(-dict="$here/$n.dict"); fi
  echo "run_fuzzers: $n for ${seconds}s"
  if "$bin" "${args[@]}" "$corpus" "$here/corpus/$n" > "$build/fuzz-$n.log" 2>&1; then
    grep -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)|Done [0-9]+ runs" \
      "$build/fuzz-$n.log" | sed "s/^/  $n: /"
  else
    echo "run_fuzzers: $n FAILED, see $build/fuzz-$n.log and $artifacts" >&2
    tail -n 30 "$build/fuzz-$n.log" >&2
    failed=1
  fi
done
exit "$failed"

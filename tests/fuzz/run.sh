#!/usr/bin/env bash
# Runs every fuzz target (cargo fuzz, libFuzzer) for a while, each over its corpus.
#
#   tests/fuzz/run.sh [--seconds N | --runs N] [TARGET...]
#
#   --seconds N   how long each target runs (default 5: the short run CI does)
#   --runs N      how many executions each target runs instead (e.g. 10000000)
#   TARGET        the targets to run (default: every one in tests/fuzz/fuzz_targets)
#
# cargo-fuzz is installed once into the tools cache (/var/tmp/shoal-tools, or
# $SHOAL_TOOLS); the targets build without sanitizers (`-s none`: safe Rust, a panic is the
# bug) on the machine's stable toolchain (RUSTC_BOOTSTRAP for libFuzzer's flags), into
# $SHOAL_FUZZ_TARGET (default /var/tmp/shoal-fuzz-target). Each target starts from the seeds
# in tests/fuzz/corpus/TARGET (a few hundred small inputs of its coverage-minimal corpus) and
# the corpus it grew so far in the tools cache (fuzz-corpus/TARGET), where new entries go,
# so the checkout stays as it is; a crash stops the run and leaves its input in
# tests/fuzz/artifacts/TARGET: copy it to tests/fuzz/regressions/TARGET with the fix, so
# tests/tests/fuzz_corpus.rs replays it forever. Exit status: 0 no crash, 1 a crash or a
# build failure, 2 usage.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
tools="${SHOAL_TOOLS:-/var/tmp/shoal-tools}"
seconds=5
runs=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) [ $# -ge 2 ] || { echo "run.sh: --seconds needs a number" >&2; exit 2; }; seconds="$2"; shift 2 ;;
    --runs) [ $# -ge 2 ] || { echo "run.sh: --runs needs a number" >&2; exit 2; }; runs="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$here"/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi

fuzz="$tools/cargo-fuzz/bin/cargo-fuzz"
if [ ! -x "$fuzz" ]; then
  echo "== installing cargo-fuzz into $tools/cargo-fuzz (once)" >&2
  cargo install --locked --root "$tools/cargo-fuzz" cargo-fuzz@0.13.2 >&2
fi
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${SHOAL_FUZZ_TARGET:-/var/tmp/shoal-fuzz-target}"
cd "$repo"
"$fuzz" fuzz build --fuzz-dir tests/fuzz -s none
for t in "${targets[@]}"; do
  grown="$tools/fuzz-corpus/$t"
  mkdir -p "$grown" "tests/fuzz/corpus/$t"
  if [ -n "$runs" ]; then limit=(-runs="$runs"); else limit=(-max_total_time="$seconds"); fi
  echo "== fuzz $t (${runs:+$runs runs}${runs:-$seconds s})" >&2
  "$fuzz" fuzz run --fuzz-dir tests/fuzz -s none "$t" "$grown" "tests/fuzz/corpus/$t" -- \
    "${limit[@]}" -max_len=65536 -print_final_stats=1 2>"$CARGO_TARGET_DIR/fuzz-$t.log" \
    || { tail -40 "$CARGO_TARGET_DIR/fuzz-$t.log" >&2; echo "run.sh: $t failed (input in tests/fuzz/artifacts/$t)" >&2; exit 1; }
  grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$CARGO_TARGET_DIR/fuzz-$t.log" >&2 || true
done

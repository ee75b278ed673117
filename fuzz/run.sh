#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer's coverage instrumentation on the stable toolchain
# (the flags `cargo fuzz build --sanitizer none` passes) and runs each for SECONDS seconds
# (default 20) from its committed seed corpus. New inputs go to a scratch copy of the
# corpus, so a run leaves the repository as it was; a crash, an out-of-memory or a
# timeout (60 s for one input) leaves its input in target/fuzz-artifacts/<target>/ and
# fails the script; a slow input (over 10 s, instrumented) is only reported.
#
#   fuzz/run.sh [SECONDS] [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-20}"
shift || true
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
  targets=(log_group codec manifest segment spill_value spill_segment)
fi
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Copt-level=1"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-../target/fuzz}"
# An explicit target keeps the flags off build scripts and proc macros (as cargo fuzz does).
host="$(rustc -vV | sed -n 's/^host: //p')"
cargo build --quiet --bins --target "$host"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t" "$CARGO_TARGET_DIR/../fuzz-artifacts/$t"
  cp corpus/"$t"/* "$scratch/$t/"
  echo "fuzz: $t for ${seconds}s"
  "$CARGO_TARGET_DIR/$host/debug/$t" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=2048 \
    -artifact_prefix="$CARGO_TARGET_DIR/../fuzz-artifacts/$t/" -print_final_stats=1 \
    "$scratch/$t" 2>&1 | grep -E "^(#[0-9]+ *DONE|stat::number_of_executed_units|stat::new_units_added|==[0-9]+==|SUMMARY|Test unit written)" || true
  artifacts="$CARGO_TARGET_DIR/../fuzz-artifacts/$t"
  # Slow inputs are reported, not failed: the instrumented build runs several times slower
  # than a release one, and timeouts (-timeout) are failures of their own.
  for slow in "$artifacts"/slow-unit-*; do
    [ -e "$slow" ] && echo "fuzz: $t: a slow input (not a failure): $slow"
  done
  failing=$(find "$artifacts" -type f ! -name 'slow-unit-*' | head -5)
  if [ -n "$failing" ]; then
    echo "fuzz: $t found a failing input:" $failing
    # Replay the first one so the log says what failed (a panic message, a signal).
    first=$(echo "$failing" | head -1)
    "$CARGO_TARGET_DIR/$host/debug/$t" -rss_limit_mb=2048 "$first" 2>&1 | tail -40 || true
    exit 1
  fi
done
echo "fuzz: ok"

#!/usr/bin/env bash
# Mutation testing of the state machine, the buffer and the RL layer with cargo-mutants.
#
#   scripts/mutants.sh [--minutes M] [--shard K/N] [--out DIR] [--full-only] [--recheck] [PATH...]
#
# PATH defaults to src/state src/buffer src/rollout. Each mutant is tested in two stages, so
# the whole suite runs only where it is needed:
#
#   1. the quick stage: the unit tests and the model-based tests (proptest runs against a
#      reference model), which catch most mutants in a few seconds;
#   2. the full stage: every mutant the quick stage missed or timed out on, against the
#      whole suite but the kill -9 harness and the byte-flip sweeps of the decoders
#      (.cargo/mutants.toml).
#
# --minutes bounds the wall time of the whole call (default 60); a call cut short keeps what
# it found, and the next call with the same --out and --shard picks up where it stopped.
# --full-only runs only the full stage, on what the quick stage let through so far (to
# settle those before the quick stage has seen every mutant).
# --recheck puts the mutants missed so far back in the full stage's queue, to check them
# against tests written since.
# --shard K/N takes the mutants whose name hashes to K modulo N (0-based), so N machines,
# or N calls, split one run. Outcomes land in DIR (default target/mutants/shard-K-of-N):
# quick/ and full/ hold each stage's settled lists and cargo-mutants' own output of its
# last call (mutants.out/, with a log per mutant), and missed.txt at the top is the result:
# the mutants no test catches. docs/testing.md says where the runs stand. Outcomes settled
# under the other shards of the same N in DIR's parent count too.
#
# Needs cargo-mutants (`cargo install cargo-mutants --locked`) and cargo-nextest.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=60
shard=0/1
out=""
full_only=0
recheck=0
paths=()
while (($#)); do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --shard) shard="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --full-only) full_only=1; shift ;;
        --recheck) recheck=1; shift ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        -*) echo "mutants.sh: unknown flag $1" >&2; exit 2 ;;
        *) paths+=("$1"); shift ;;
    esac
done
((${#paths[@]})) || paths=(src/state src/buffer src/rollout)
[[ "$shard" =~ ^[0-9]+/[1-9][0-9]*$ ]] || { echo "mutants.sh: --shard takes K/N" >&2; exit 2; }
out="${out:-target/mutants/shard-${shard/\//-of-}}"
mkdir -p "$out"
command -v cargo-mutants >/dev/null || { echo "mutants.sh: install cargo-mutants first" >&2; exit 2; }

files=()
for p in "${paths[@]}"; do
    if [[ -d "$p" ]]; then files+=(-f "$p/**/*.rs"); else files+=(-f "$p"); fi
done

# The dependencies stay built between calls: cargo-mutants copies the source tree to a
# scratch directory per call, and a shared target directory spares a cold build of
# arrow and parquet each time.
export CARGO_TARGET_DIR="${MUTANTS_TARGET_DIR:-$PWD/target/mutants-build}"
deadline=$((SECONDS + minutes * 60))
left() { echo $((deadline - SECONDS)); }

# The shard: the mutants whose name (file:line:col: what it changes) hashes to K modulo N,
# so an edit moves only the mutants of the lines it shifts, not every mutant after them.
# Names carry line numbers: results recorded before an edit of a file no longer match its
# mutants, which are then tested again.
k=${shard%/*}; n=${shard#*/}
cargo mutants "${files[@]}" --list | sort -u \
    | perl -MDigest::MD5=md5 -ne "print if unpack('N', md5(\$_)) % $n == $k" > "$out/all.txt"

# Outcomes settled under another shard of the same N on this machine count here too (a name
# is the same mutant whichever shard tested it), so changing how mutants are shared out
# loses nothing.
shopt -s nullglob
for stage in quick full; do
    mkdir -p "$out/$stage"
    for list in killed survived timeout; do
        mine="$out/$stage/$list.txt"
        touch "$mine"
        siblings=("$out"/../shard-*-of-"$n"/"$stage"/"$list".txt)
        sort -u "${siblings[@]}" /dev/null | comm -12 - "$out/all.txt" | sort -u - "$mine" -o "$mine"
    done
done
shopt -u nullglob

# Per stage, what is settled accumulates across calls: killed.txt (caught, or unviable: the
# mutant does not build) and survived.txt (missed, or timed out).
run_stage() { # STAGE INPUT [cargo test args...]
    local stage=$1 input=$2; shift 2
    local dir="$out/$stage" todo="$out/$stage/todo.txt"
    mkdir -p "$dir"
    touch "$dir/killed.txt" "$dir/survived.txt" "$dir/timeout.txt"
    settle "$dir"
    sort -u "$dir/killed.txt" "$dir/survived.txt" | comm -23 "$input" - > "$todo"
    if [[ ! -s "$todo" ]] || (($(left) <= 0)); then return 0; fi
    local regexes=()
    while IFS= read -r name; do
        regexes+=(-F "^$(printf '%s' "$name" | sed 's/[][\.*^$(){}?+|/]/\\&/g')\$")
    done < "$todo"
    # Only the files the queued mutants are in: cargo-mutants 27.1 applies no name filter to
    # its struct-field deletions (sourcefrog/cargo-mutants#632), so every such mutant of
    # the files named would be tested again on each call.
    local todo_files=()
    while IFS= read -r file; do todo_files+=(-f "$file"); done < <(cut -d: -f1 "$todo" | sort -u)
    echo "mutants.sh: $stage stage: $(wc -l < "$todo") mutants, $(left) s left"
    timeout --foreground "$(left)" cargo mutants "${todo_files[@]}" "${regexes[@]}" \
        --baseline skip --timeout "$TEST_TIMEOUT" --build-timeout 600 --no-shuffle \
        -o "$dir" "$@" || true
    settle "$dir"
}

# Folds the outcomes of a stage's last cargo-mutants call (mutants.out, which the next call
# moves aside) into the stage's settled lists; also after a call that was killed. Once only:
# a recheck takes names off the lists, and folding the same call again would put them back.
settle() { # DIR
    local dir=$1 o="$1/mutants.out"
    if [[ -d "$o" && ! -e "$o/settled" ]]; then
        cat "$o/caught.txt" "$o/unviable.txt" 2>/dev/null >> "$dir/killed.txt" || true
        cat "$o/missed.txt" "$o/timeout.txt" 2>/dev/null >> "$dir/survived.txt" || true
        cat "$o/timeout.txt" 2>/dev/null >> "$dir/timeout.txt" || true
        touch "$o/settled"
    fi
    sort -u -o "$dir/killed.txt" "$dir/killed.txt"
    sort -u -o "$dir/survived.txt" "$dir/survived.txt"
    sort -u -o "$dir/timeout.txt" "$dir/timeout.txt"
}

# Stage 1: the unit tests (with the state machine's model test), the integration tests that
# drive the public API against a reference model, and those of leases, staleness, eviction,
# amends and gets.
# Given as cargo arguments, so the build builds only these targets too.
quick=()
for target in --lib --test=model --test=persist_model --test=spill_model --test=selection \
    --test=rate_limit --test=lease --test=staleness --test=eviction --test=amend --test=get; do
    quick+=(--cargo-arg="$target")
done
# Mutants of the RL layer and of spilling also get the tests of their own types: without
# them nearly every one passed the quick stage only to be caught by the full one, at three
# times the cost. Those test binaries add seconds to each build, so other mutants go without.
with_tests() { # TARGET... -> the quick stage's cargo args plus these targets
    printf '%s\n' "${quick[@]}"
    for target; do printf -- '--cargo-arg=--test=%s\n' "$target"; done
}
if ((full_only)); then
    mkdir -p "$out/quick"
    touch "$out/quick/killed.txt" "$out/quick/survived.txt"
    settle "$out/quick"
else
    grep '^src/rollout/' "$out/all.txt" > "$out/all-rollout.txt" || true
    grep '^src/buffer/spill/' "$out/all.txt" > "$out/all-spill.txt" || true
    grep -v '^src/rollout/\|^src/buffer/spill/' "$out/all.txt" > "$out/all-other.txt" || true
    mapfile -t args < <(with_tests groups ingest_faults packing batcher metrics admission)
    TEST_TIMEOUT=60 run_stage quick "$out/all-rollout.txt" "${args[@]}"
    mapfile -t args < <(with_tests spill spill_faults spill_budget spill_persist)
    TEST_TIMEOUT=60 run_stage quick "$out/all-spill.txt" "${args[@]}"
    TEST_TIMEOUT=60 run_stage quick "$out/all-other.txt" "${quick[@]}"
fi
# Stage 2: what the quick stage let through, against the whole suite. A recheck first takes
# the missed mutants of the code as it is off the full stage's settled list.
if ((recheck)) && [[ -f "$out/full/survived.txt" ]]; then
    settle "$out/full"
    comm -23 "$out/full/survived.txt" "$out/full/timeout.txt" | comm -12 - "$out/all.txt" \
        | comm -23 "$out/full/survived.txt" - > "$out/full/kept.txt"
    mv "$out/full/kept.txt" "$out/full/survived.txt"
fi
comm -12 "$out/quick/survived.txt" "$out/all.txt" | comm -23 - "$out/quick/killed.txt" \
    > "$out/quick/survived-current.txt"
TEST_TIMEOUT=120 run_stage full "$out/quick/survived-current.txt"

# The result, over the mutants of the code as it is (names of edited lines drop out). A
# mutant any test run has caught is caught (the tests only grow), and so is one that makes
# the suite hang (the tests fail, by time). Missed are the quick stage's survivors the full
# suite passed with.
caught=$(mktemp)
sort -u "$out/quick/killed.txt" "$out/full/killed.txt" "$out/full/timeout.txt" > "$caught"
comm -12 "$out/full/survived.txt" "$out/all.txt" | comm -23 - "$caught" > "$out/missed.txt"
count() { comm -12 "$1" "$out/all.txt" | comm "$2" - "$caught" | wc -l; }
passed_quick=$(comm -12 "$out/quick/survived.txt" "$out/all.txt" | comm -23 - "$out/quick/killed.txt")
untested=$(sort -u "$out/quick/killed.txt" "$out/quick/survived.txt" | comm -23 "$out/all.txt" - | wc -l)
untested_full=$(sort -u "$out/full/killed.txt" "$out/full/survived.txt" \
    | comm -23 <(printf '%s\n' "$passed_quick" | sed '/^$/d') - | wc -l)
echo "mutants.sh: shard $shard of ${paths[*]}: $(wc -l < "$out/all.txt") mutants;" \
    "quick stage caught $(count "$out/quick/killed.txt" -12), passed $(printf '%s\n' "$passed_quick" | sed '/^$/d' | wc -l), not yet run $untested;" \
    "full stage caught $(count <(sort -u "$out/full/killed.txt" "$out/full/timeout.txt") -12) of those, not yet run $untested_full"
echo "mutants.sh: $(wc -l < "$out/missed.txt") missed: $out/missed.txt"
rm -f "$caught"

#!/usr/bin/env bash
# Mutation testing of the state machine, the buffer and the RL layer with cargo-mutants.
#
#   scripts/mutants.sh [--minutes M] [--shard K/N] [--only ERE] [--full-only] [--recheck] [PATH...]
#   scripts/mutants.sh --report [PATH...]
#
# PATH defaults to src/state src/buffer src/rollout. Each mutant is tested in two stages, so
# the whole suite runs only where it is needed:
#
#   1. the quick stage: the unit tests and the model-based tests (proptest runs against a
#      reference model), which catch most mutants in a few seconds;
#   2. the full stage: every mutant the quick stage missed, against the whole suite but
#      the kill -9 harness and the byte-flip sweeps of the decoders (.cargo/mutants.toml).
#
# A mutant that makes a test hang (no end within 60 s, where the quick stage's tests take a
# few seconds) is caught by time in either stage: the full suite would only wait longer.
#
# The outcomes are part of the repository: mutants/{quick,full}/{killed,survived,timeout}.txt
# list the mutants each stage has settled, by name (file:line:col: what it changes), so a
# run spans calls, machines and checkouts; commit them with the tests they prompted
# (.gitattributes merges them as sets). A name recorded before its line was edited no
# longer matches a mutant of the code, which is then tested again.
#
# --minutes bounds the wall time of the whole call (default 60); a call cut short keeps what
# it settled, and the next call picks up where it stopped.
# --full-only runs only the full stage, on what the quick stage let through so far (to
# settle those before the quick stage has seen every mutant).
# --recheck puts the mutants that survived so far back in the queues (the full stage's only,
# with --full-only), to check them against tests written since.
# --only ERE takes only the mutants whose name matches the extended regular expression (one
# function's, say: --only 'in SlotTable::claim_restore').
# --shard K/N takes the mutants whose name hashes to K modulo N (0-based), so N machines,
# or N calls, split one run. cargo-mutants' own output of a shard's last call (a log per
# mutant) is in target/mutants/shard-K-of-N, and missed.txt there lists the shard's mutants
# no test catches.
# --report tests nothing: per PATH, how many mutants there are, how many each stage has
# tested and caught, and the missed ones (what docs/testing.md's table shows).
#
# Needs cargo-mutants (`cargo install cargo-mutants --locked`) and cargo-nextest.
set -euo pipefail
# comm needs the lists in the order sort gives them, whatever the locale.
export LC_ALL=C
cd "$(dirname "$0")/.."

minutes=60
shard=0/1
only=
full_only=0
recheck=0
report=0
paths=()
while (($#)); do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --shard) shard="$2"; shift 2 ;;
        --only) only="$2"; shift 2 ;;
        --full-only) full_only=1; shift ;;
        --recheck) recheck=1; shift ;;
        --report) report=1; shift ;;
        -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
        -*) echo "mutants.sh: unknown flag $1" >&2; exit 2 ;;
        *) paths+=("$1"); shift ;;
    esac
done
((${#paths[@]})) || paths=(src/state src/buffer src/rollout)
[[ "$shard" =~ ^[0-9]+/[1-9][0-9]*$ ]] || { echo "mutants.sh: --shard takes K/N" >&2; exit 2; }
command -v cargo-mutants >/dev/null || { echo "mutants.sh: install cargo-mutants first" >&2; exit 2; }

results=mutants
for stage in quick full; do
    mkdir -p "$results/$stage"
    touch "$results/$stage/killed.txt" "$results/$stage/survived.txt" "$results/$stage/timeout.txt"
done

list_mutants() { # PATH... -> every mutant's name, sorted
    local files=() p
    for p; do
        if [[ -d "$p" ]]; then files+=(-f "$p/**/*.rs"); else files+=(-f "$p"); fi
    done
    cargo mutants "${files[@]}" --list | sort -u
}

# The outcome over the mutants named in ALL, of the code as it is. A mutant any test run has
# caught is caught (the tests only grow), and so is one that makes the suite hang in either
# stage (the tests fail, by time). Missed are the quick stage's survivors the full suite
# passed with.
summarize() { # ALL MISSED_OUT LABEL
    local all=$1 missed=$2 label=$3 caught passed
    caught=$(mktemp); passed=$(mktemp)
    sort -u "$results/quick/killed.txt" "$results/quick/timeout.txt" "$results/full/killed.txt" \
        "$results/full/timeout.txt" > "$caught"
    comm -12 "$results/full/survived.txt" "$all" | comm -23 - "$caught" > "$missed"
    sort -u "$results/quick/killed.txt" "$results/quick/timeout.txt" \
        | comm -23 <(comm -12 "$results/quick/survived.txt" "$all") - > "$passed"
    local total tested_quick caught_quick tested_full caught_full
    total=$(wc -l < "$all")
    tested_quick=$(sort -u "$results/quick/killed.txt" "$results/quick/survived.txt" | comm -12 - "$all" | wc -l)
    caught_quick=$(sort -u "$results/quick/killed.txt" "$results/quick/timeout.txt" | comm -12 - "$all" | wc -l)
    tested_full=$(sort -u "$results/full/killed.txt" "$results/full/survived.txt" | comm -12 - "$passed" | wc -l)
    caught_full=$(comm -12 "$caught" "$passed" | wc -l)
    echo "mutants.sh: $label: $total mutants; quick stage tested $tested_quick, caught $caught_quick;" \
        "full stage tested $tested_full of the $(wc -l < "$passed") it let through, caught $caught_full;" \
        "$(wc -l < "$missed") missed"
    rm -f "$caught" "$passed"
}

if ((report)); then
    work=target/mutants/report
    mkdir -p "$work"
    for p in "${paths[@]}"; do
        name=$(printf '%s' "$p" | tr '/' '-')
        list_mutants "$p" | { grep -E -- "${only:-.}" || true; } > "$work/$name.all.txt"
        summarize "$work/$name.all.txt" "$work/$name.missed.txt" "$p"
        sed 's/^/    /' "$work/$name.missed.txt"
    done
    exit 0
fi

work="target/mutants/shard-${shard/\//-of-}"
mkdir -p "$work"

# The dependencies stay built between calls: cargo-mutants copies the source tree to a
# scratch directory per call, and a shared target directory spares a cold build of
# arrow and parquet each time.
export CARGO_TARGET_DIR="${MUTANTS_TARGET_DIR:-$PWD/target/mutants-build}"
deadline=$((SECONDS + minutes * 60))
left() { echo $((deadline - SECONDS)); }

# The shard: the mutants whose name hashes to K modulo N, so an edit moves only the mutants
# of the lines it shifts, not every mutant after them.
k=${shard%/*}; n=${shard#*/}
list_mutants "${paths[@]}" \
    | perl -MDigest::MD5=md5 -ne "print if unpack('N', md5(\$_)) % $n == $k" \
    | { grep -E -- "${only:-.}" || true; } > "$work/all.txt"

# Per stage, what is settled accumulates across calls: killed.txt (caught, or unviable: the
# mutant does not build) and survived.txt (missed, or timed out).
run_stage() { # STAGE INPUT [cargo-mutants args...]
    local stage=$1 input=$2; shift 2
    local todo="$work/$stage-todo.txt"
    settle "$stage"
    sort -u "$results/$stage/killed.txt" "$results/$stage/survived.txt" | comm -23 "$input" - > "$todo"
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
        -o "$work/$stage" "$@" || true
    settle "$stage"
}

# Folds the outcomes of a stage's last cargo-mutants call (mutants.out, which the next call
# moves aside) into the stage's settled lists; also after a call that was killed. Once only:
# a recheck takes names off the lists, and folding the same call again would put them back.
settle() { # STAGE
    local lists="$results/$1" o="$work/$1/mutants.out"
    if [[ -d "$o" && ! -e "$o/settled" ]]; then
        cat "$o/caught.txt" "$o/unviable.txt" 2>/dev/null >> "$lists/killed.txt" || true
        cat "$o/missed.txt" "$o/timeout.txt" 2>/dev/null >> "$lists/survived.txt" || true
        cat "$o/timeout.txt" 2>/dev/null >> "$lists/timeout.txt" || true
        touch "$o/settled"
    fi
    local list
    for list in killed survived timeout; do
        sort -u -o "$lists/$list.txt" "$lists/$list.txt"
    done
}

# Stage 1: the unit tests (with the state machine's model test), the integration tests that
# drive the public API against a reference model, and those of leases, staleness, eviction,
# amends and gets.
# Given as cargo arguments, so the build builds only these targets too.
core_tests=(--lib --test=model --test=selection --test=rate_limit --test=lease --test=staleness
    --test=eviction --test=amend --test=get)
cargo_args() { # TARGET... -> cargo-mutants' arguments to build and test these targets
    local target
    for target; do printf -- '--cargo-arg=%s\n' "$target"; done
}
# A recheck first takes the survivors of the shard's mutants off the settled lists, so the
# tests written since see them: the quick stage's (unless --full-only) and the full stage's.
forget_survivors() { # STAGE
    settle "$1"
    comm -23 "$results/$1/survived.txt" "$results/$1/timeout.txt" | comm -12 - "$work/all.txt" \
        | comm -23 "$results/$1/survived.txt" - > "$work/kept.txt"
    mv "$work/kept.txt" "$results/$1/survived.txt"
}
if ((recheck)); then
    ((full_only)) || forget_survivors quick
    forget_survivors full
fi
if ((full_only)); then
    settle quick
else
    grep '^src/state/' "$work/all.txt" > "$work/all-state.txt" || true
    grep '^src/rollout/' "$work/all.txt" > "$work/all-rollout.txt" || true
    grep '^src/buffer/spill/' "$work/all.txt" > "$work/all-spill.txt" || true
    grep -v '^src/state/\|^src/rollout/\|^src/buffer/spill/' "$work/all.txt" > "$work/all-other.txt" || true
    # The state machine needs no storage: its mutants build without the default features,
    # and so without Arrow and Parquet, in a fraction of the time.
    mapfile -t args < <(cargo_args "${core_tests[@]}")
    TEST_TIMEOUT=60 run_stage quick "$work/all-state.txt" --no-default-features "${args[@]}"
    # Mutants of the RL layer and of spilling also get the tests of their own types: without
    # them nearly every one passed the quick stage only to be caught by the full one, at
    # three times the cost. Those test binaries add seconds to each build, so other mutants
    # go without.
    core_tests+=(--test=persist_model --test=spill_model)
    mapfile -t args < <(cargo_args "${core_tests[@]}" --test={groups,ingest_faults,packing,batcher,metrics,admission})
    TEST_TIMEOUT=60 run_stage quick "$work/all-rollout.txt" "${args[@]}"
    mapfile -t args < <(cargo_args "${core_tests[@]}" --test={spill,spill_faults,spill_budget,spill_persist})
    TEST_TIMEOUT=60 run_stage quick "$work/all-spill.txt" "${args[@]}"
    mapfile -t args < <(cargo_args "${core_tests[@]}")
    TEST_TIMEOUT=60 run_stage quick "$work/all-other.txt" "${args[@]}"
fi
# Stage 2: what the quick stage let through (neither caught nor hung), against the whole
# suite.
sort -u "$results/quick/killed.txt" "$results/quick/timeout.txt" \
    | comm -23 <(comm -12 "$results/quick/survived.txt" "$work/all.txt") - > "$work/full-input.txt"
TEST_TIMEOUT=120 run_stage full "$work/full-input.txt"

summarize "$work/all.txt" "$work/missed.txt" "shard $shard of ${paths[*]}"
echo "mutants.sh: the missed ones: $work/missed.txt"

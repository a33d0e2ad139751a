#!/bin/sh
# Runs cargo-fuzz targets on stable (RUSTC_BOOTSTRAP=1), one after another,
# one fuzzing process each (no -jobs/-workers: the machine is shared).
#
#   fuzz/run.sh [--seconds N] [TARGET...]   fuzz each TARGET (default: all)
#                                           for N seconds (default 60) from
#                                           fuzz/corpus/TARGET and fuzz/seeds/TARGET,
#                                           growing the corpus; logs in fuzz/logs/
#   fuzz/run.sh --cmin [TARGET...]          minimise the corpora (set-cover merge)
#   fuzz/run.sh --replay TARGET FILE...     run TARGET on FILEs (a crash artifact,
#                                           a corpus file) and show the failure
#
# Environment: FUZZ_SANITIZER (default none: the core forbids unsafe code;
# `address` for ASan), FUZZ_ARGS (extra libFuzzer flags). Targets are built
# in release mode with debug assertions and overflow checks (cargo-fuzz's
# default).
set -eu

ORIG="$(pwd)"
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
ALL="rpc watch_machine trace_session archive_validator log_queries agent_loop store_open leader_election_value peer_certificate stored_records trace_pipe_lines registry_responses image_config efi_load_option"
SAN="${FUZZ_SANITIZER:-none}"
SECONDS_EACH=60
MODE=run

case "${1:-}" in
--cmin) MODE=cmin; shift ;;
--replay) MODE=replay; shift ;;
esac
if [ "$MODE" = run ] && [ "${1:-}" = --seconds ]; then
    SECONDS_EACH="$2"
    shift 2
fi

# Longest input per target: archives and LoadImage calls need room.
max_len() {
    case "$1" in
    archive_validator) echo 65536 ;;
    rpc) echo 32768 ;;
    store_open) echo 32768 ;;
    *) echo 8192 ;;
    esac
}

# Whether cmin keeps hit-count features (off for the large corpora).
counters() {
    case "$1" in
    archive_validator | rpc | agent_loop) echo -use_counters=0 ;;
    *) echo -use_counters=1 ;;
    esac
}

if [ "$MODE" = replay ]; then
    target="$1"
    shift
    # File names are relative to where the script was started.
    for f in "$@"; do
        case "$f" in
        /*) set -- "$@" "$f" ;;
        *) set -- "$@" "$ORIG/$f" ;;
        esac
        shift
    done
    echo "== replaying $* through $target"
    exec cargo fuzz run -s "$SAN" "$target" "$@" -- -runs=1
fi

TARGETS="${*:-$ALL}"
mkdir -p logs
for t in $TARGETS; do
    mkdir -p "corpus/$t"
    if [ "$MODE" = cmin ]; then
        echo "== cmin $t ($(ls "corpus/$t" | wc -l) inputs, $(du -sh --apparent-size "corpus/$t" | cut -f1))"
        cargo fuzz build -s "$SAN" "$t" >"logs/$t-cmin.log" 2>&1
        new="corpus/.cmin-$t"
        rm -rf "$new"
        mkdir "$new"
        # A smallest set of inputs covering every feature of the corpus;
        # `cargo fuzz cmin` (-merge=1) keeps more. The targets with large
        # inputs keep every edge rather than every hit-count bucket, so
        # that the checked-in corpora stay a few MB.
        "target/x86_64-unknown-linux-gnu/release/$t" -set_cover_merge=1 $(counters "$t") \
            -max_len="$(max_len "$t")" "$new" "corpus/$t" >>"logs/$t-cmin.log" 2>&1
        rm -rf "corpus/$t"
        mv "$new" "corpus/$t"
        echo "   $(ls "corpus/$t" | wc -l) inputs, $(du -sh --apparent-size "corpus/$t" | cut -f1)"
        continue
    fi
    log="logs/$t-$(date +%Y%m%d-%H%M%S).log"
    echo "== $t for ${SECONDS_EACH}s (sanitizer $SAN), corpus/$t ($(ls "corpus/$t" | wc -l) inputs), log $log"
    status=0
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
    # New inputs go to the first directory; the seeds are only read.
    cargo fuzz run -s "$SAN" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$SECONDS_EACH" -timeout=10 \
        -max_len="$(max_len "$t")" -rss_limit_mb=2048 -print_final_stats=1 \
        ${FUZZ_ARGS:-} >"$log" 2>&1 || status=$?
    # The last status line (executions, coverage, features, corpus) and
    # the final statistics.
    grep -E '^#[0-9]+' "$log" | tail -n 1 || true
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
    if [ "$status" -ne 0 ]; then
        echo "!! $t failed (exit $status); see $log and fuzz/artifacts/$t/"
        grep -E 'panicked at|^Test unit written|SUMMARY' "$log" | head -n 5 || true
        exit "$status"
    fi
    echo "   corpus/$t now $(ls "corpus/$t" | wc -l) inputs"
done

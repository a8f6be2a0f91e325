#!/usr/bin/env bash
# The long reliability run (docs/RELIABILITY.md): what the test command runs
# in small numbers, in large ones. Needs root (loop devices, FUSE) for the
# kill loops, and the nightly toolchain with cargo-fuzz for the fuzzing.
#
#   scripts/long-run.sh [--fuzz-seconds N] [--soak-seconds N] [--kills N] [--cuts N]
#                       [--power-cuts N] [--schedules N]
#
# Defaults: 1,200 crash-replay cut points (--cuts 400 per shape, 3 shapes),
# 3,000 power cuts under concurrent operations (--power-cuts 1,500 per
# shape, 2 shapes), 60,000 thread schedules under shuttle (--schedules
# 10,000 per test, 6 tests: random and PCT schedules of each of the three
# scenarios), 150 kills (--kills 50 per test, 3 kill-loop tests), a
# one-hour soak, and 10 minutes of fuzzing per target (--fuzz-seconds 600,
# 6 targets in fuzz/fuzz_targets: 60 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."

fuzz_seconds=600 soak_seconds=3600 kills=50 cuts=400 power_cuts=1500 schedules=10000
while [ $# -gt 0 ]; do
    case "$1" in
        --fuzz-seconds) fuzz_seconds=$2; shift 2 ;;
        --soak-seconds) soak_seconds=$2; shift 2 ;;
        --kills) kills=$2; shift 2 ;;
        --cuts) cuts=$2; shift 2 ;;
        --power-cuts) power_cuts=$2; shift 2 ;;
        --schedules) schedules=$2; shift 2 ;;
        *) echo "long-run: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

log=${LOGRAID_LONG_RUN_LOG:-long-run-$(date -u +%Y%m%d-%H%M).log}
echo "long-run: writing $log"
step() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$log"; }

step "crash replay: $cuts cut points per shape"
LOGRAID_REPLAY_CUTS=$cuts cargo test --profile test -p lograid --test crash_replay -- --nocapture 2>&1 | tee -a "$log" | grep -E "cut points|test result"

step "power cuts under concurrent operations: $power_cuts per shape"
LOGRAID_CUT_SEEDS=$power_cuts cargo test --profile test -p lograid --test power_cuts -- --nocapture 2>&1 | tee -a "$log" | grep -E "power cuts|test result"

step "thread schedules under shuttle: $schedules of each kind"
LOGRAID_SCHEDULES=$schedules cargo test --profile test -p lograid --features shuttle --test schedules -- --nocapture 2>&1 | tee -a "$log" | grep -E "schedules|test result"

step "kill loops: $kills kills per test"
LOGRAID_KILLS=$kills cargo test --profile test -p lograid-cli --test kill_loop -- --nocapture --test-threads 1 2>&1 | tee -a "$log" | grep -E "kills|test result"

step "soak: $soak_seconds s"
LOGRAID_SOAK_SECONDS=$soak_seconds cargo test --profile test -p lograid --test soak -- --nocapture 2>&1 | tee -a "$log" | grep -E "soak|test result"

if cargo +nightly fuzz --version >/dev/null 2>&1; then
    for target in $(cargo +nightly fuzz list --fuzz-dir fuzz); do
        step "fuzz $target: $fuzz_seconds s"
        cargo +nightly fuzz run --fuzz-dir fuzz "$target" -- -max_total_time="$fuzz_seconds" 2>&1 \
            | tee -a "$log" | grep -E "^(#[0-9]+ +DONE|Done|==[0-9]+== ERROR)" || true
    done
else
    step "fuzz: skipped (needs the nightly toolchain and cargo-fuzz)"
fi
step "done"

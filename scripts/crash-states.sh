#!/usr/bin/env bash
# The long mode of the crash-state test over the real local-directory store
# (crates/intact-core/tests/crash_states.rs): every workload of one to three operations
# (Ace's 1,463), a crash after every call of the store, the durable state, the full one and
# RANDOM random states per point (unsynced calls kept or lost, writes torn at 512 B or 4 KiB),
# one in four crashed again during its recovery. Must check at least 100,000 distinct states
# with 0 failures. Results go in docs/testing.md.
#   scripts/crash-states.sh [RANDOM] [SEED]   (default 4 and 1)
set -euo pipefail
cd "$(dirname "$0")/.."
export INTACT_CRASH_OPS=3
export INTACT_CRASH_RANDOM=${1:-4}
export INTACT_CRASH_SEED=${2:-1}
export INTACT_CRASH_MIN=100000
exec cargo test --release -p intact-core --test crash_states -- --nocapture

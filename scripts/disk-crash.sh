#!/usr/bin/env bash
# The long mode of the block disk's crash test (crates/intact/tests/nbd.rs,
# `kill_9_under_load_recovers_to_the_last_flush_or_later`): fio writes with flushes and a
# client writes versioned blocks with flushes while the server is killed with SIGKILL at a
# random moment; each restart must recover without an alarm, every block at its last
# acknowledged version, every byte readable. ROUNDS rounds (default 500; CI runs 50).
# Needs fio and nbdcopy (libnbd-bin). Results go in docs/testing.md.
#   scripts/disk-crash.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export INTACT_DISK_CRASH_ROUNDS=${1:-500}
export INTACT_REQUIRE_ALL=1
exec cargo test --release -p intact --test nbd kill_9_under_load -- --nocapture

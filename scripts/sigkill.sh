#!/usr/bin/env bash
# The long mode of the SIGKILL loop through the mount (crates/intact/tests/fuse.rs,
# `sigkill_under_load_loses_no_fsynced_file_and_raises_no_alarm`): three workers write,
# overwrite, truncate, rename and unlink files through the mount, fsyncing what they want
# kept; the daemon is killed with SIGKILL at a random moment (0.1 to 1 s in); then fsck
# must be clean and every fsynced file must read back through a new mount. ROUNDS rounds
# per freshness scheme (default 100: 600 in all). Needs /dev/fuse and fusermount3.
# Results go in docs/testing.md.
#   scripts/sigkill.sh [ROUNDS] [SEED] [SCHEMES]
set -euo pipefail
cd "$(dirname "$0")/.."
export INTACT_SIGKILL_ROUNDS=${1:-100}
export INTACT_SIGKILL_SEED=${2:-1}
if [ -n "${3:-}" ]; then export INTACT_SIGKILL_SCHEMES=$3; fi
exec cargo test --release -p intact --test fuse sigkill_under_load -- --nocapture

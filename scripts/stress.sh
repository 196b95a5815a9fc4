#!/usr/bin/env bash
# The long mode of the stress-ng test (crates/intact/tests/stress.rs): the issue's 19
# file-system stressors, 2 instances each, through the mount, 10 minutes per scheme with
# freshness; then no integrity alarm, no EIO, the daemon alive, fsck clean, and the reference
# tree read back after a remount. Results go in docs/testing.md.
#   scripts/stress.sh [SECONDS_PER_SCHEME] [SCHEMES]   (default 600; all six fresh schemes)
set -euo pipefail
cd "$(dirname "$0")/.."
export INTACT_STRESS_SECS=${1:-600}
export INTACT_STRESS_SCHEMES=${2:-mt-eint,mt-eint-cbc,rand-eint,comp-eint,comp-eint-zstd,mac-tree}
export INTACT_REQUIRE_ALL=1
command -v stress-ng >/dev/null || { sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo; $sudo apt-get install -y -qq stress-ng; }
exec cargo test --release -p intact --test stress -- --nocapture

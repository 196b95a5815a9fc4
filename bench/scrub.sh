#!/usr/bin/env bash
# Scrub throughput against the disk's limit (issue 16): a volume of SIZE_GB of real
# (random) data, caches dropped before each timed run, then
#   - cat of every file of the cipher directory (what the disk gives),
#   - intact scrub with 1 and with all cores,
#   - intact fsck (one core, for comparison).
# Prints MB/s for each run, RUNS times, and the range. Needs root (drop_caches).
# Usage: bench/scrub.sh [SIZE_GB] [RUNS]   (defaults: 10, 3)
set -euo pipefail
cd "$(dirname "$0")/.."
size_gb=${1:-10}
runs=${2:-3}
bin=${INTACT_BIN:-target/release/intact}
[ -x "$bin" ] || cargo build --release -p intact
work=${WORK:-$(mktemp -d /var/tmp/intact-scrub.XXXXXX)}
trap 'rm -rf "$work"' EXIT
export INTACT_PASSWORD=bench
vol=(--volume "$work/cipher" --state "$work/state")
"$bin" --state "$work/state" init "$work/cipher" --kdf-memory 1024 --kdf-passes 1 >/dev/null
# Files of 1 GiB (the last one shorter) of random bytes, through the CLI.
left=$((size_gb * 1000))
i=0
while [ "$left" -gt 0 ]; do
  mb=$((left < 1024 ? left : 1024))
  head -c $((mb * 1000 * 1000)) /dev/urandom | "$bin" "${vol[@]}" put - "/f$i"
  left=$((left - mb))
  i=$((i + 1))
done
bytes=$(du -sb "$work/cipher" | cut -f1)
content=$((size_gb * 1000 * 1000 * 1000))
echo "volume: $content content bytes, cipher directory $bytes bytes, $(nproc) cores"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / s / 1e6 }'; }
declare -A all
for r in $(seq 1 "$runs"); do
  drop
  t0=$(date +%s.%N)
  find "$work/cipher" -type f -exec cat {} + >/dev/null
  t=$(echo "$(date +%s.%N) - $t0" | bc)
  all[cat]+="$(rate "$bytes" "$t") "
  for th in 1 "$(nproc)"; do
    drop
    t0=$(date +%s.%N)
    "$bin" "${vol[@]}" scrub --restart --threads "$th" >/dev/null 2>&1
    t=$(echo "$(date +%s.%N) - $t0" | bc)
    all["scrub-$th"]+="$(rate "$content" "$t") "
  done
  drop
  t0=$(date +%s.%N)
  "$bin" "${vol[@]}" fsck >/dev/null 2>&1
  t=$(echo "$(date +%s.%N) - $t0" | bc)
  all[fsck]+="$(rate "$content" "$t") "
done
for k in cat scrub-1 "scrub-$(nproc)" fsck; do
  read -ra v <<<"${all[$k]}"
  min=$(printf '%s\n' "${v[@]}" | sort -n | head -1)
  max=$(printf '%s\n' "${v[@]}" | sort -n | tail -1)
  printf '%-10s MB/s: %s (range %s-%s)\n' "$k" "${v[*]}" "$min" "$max"
done

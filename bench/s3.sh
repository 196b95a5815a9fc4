#!/usr/bin/env bash
# bench/s3.sh — a volume in an S3 bucket against the same bucket with no protection (issue 9).
#
#   bench/s3.sh [SIZE_MIB (256)] [RUNS (3)]
#
# Starts a one-node Garage server (the S3 store of tests/s3.rs; `cargo install garage`) on
# the loopback interface, then for each run: `intact put` and `intact get` of one file of
# SIZE_MIB random bytes on a local directory, the same on a bucket (s3://...), and `rclone
# copyto` up and down the same bucket (apt install rclone; S3 with no encryption, no
# integrity, no freshness: the baseline). The page cache is dropped before each step (root),
# and each step ends when the command has returned (intact's put seals: durable). Prints
# MiB/s per run, then the range over the runs and the ratios to rclone's.
# Needs a release build of intact (INTACT_BIN, default target/release/intact), garage and
# rclone on PATH.
set -euo pipefail
SIZE=${1:-256}
RUNS=${2:-3}
cd "$(dirname "$0")/.."
I=${INTACT_BIN:-target/release/intact}
I=$(readlink -f "$I")
for t in garage rclone openssl; do
  command -v $t >/dev/null || { echo "bench/s3.sh needs $t" >&2; exit 1; }
done
W=$(mktemp -d /var/tmp/intact-s3bench.XXXXXX)
G=""
cleanup() { [ -n "$G" ] && kill "$G" 2>/dev/null; wait 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
. bench/garage.sh
export INTACT_PASSWORD=bench
head -c $((SIZE << 20)) /dev/urandom > "$W/src"
now() { date +%s.%N; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
: > "$W/results"
for run in $(seq "$RUNS"); do
  for sys in local s3 rclone; do
    st=$W/state-$sys-$run
    case $sys in
      local) U=$W/cipher-$run ;;
      s3) U="s3://bench/intact$run?endpoint=http://127.0.0.1:$S3&region=garage" ;;
      rclone) R="G:bench/rclone$run" ;;
    esac
    [ $sys = rclone ] || "$I" --state "$st" init "$U" --kdf-memory 1024 --kdf-passes 1 >/dev/null
    drop
    t0=$(now)
    if [ $sys = rclone ]; then rclone copyto "$W/src" "$R/f" 2>/dev/null
    else "$I" --state "$st" --volume "$U" put "$W/src" /f >/dev/null; fi
    t1=$(now)
    drop
    t2=$(now)
    if [ $sys = rclone ]; then rclone copyto "$R/f" "$W/out" 2>/dev/null
    else "$I" --state "$st" --volume "$U" get /f "$W/out" >/dev/null; fi
    t3=$(now)
    cmp -s "$W/src" "$W/out" || { echo "$sys: what came back differs" >&2; exit 1; }
    rm -f "$W/out"
    echo "$sys $run $t0 $t1 $t2 $t3" >> "$W/results"
  done
done
python3 - "$SIZE" "$W/results" <<'EOF'
import sys
size = int(sys.argv[1])
rows = {}
for line in open(sys.argv[2]):
    sys_, run, t0, t1, t2, t3 = line.split()
    put, get = size / (float(t1) - float(t0)), size / (float(t3) - float(t2))
    print(f"{sys_:7} run {run}: put {put:7.1f} MiB/s, get {get:7.1f} MiB/s")
    rows.setdefault(sys_, []).append((put, get))
names = {"local": "intact, local directory", "s3": "intact, S3 bucket (Garage)",
         "rclone": "rclone, same bucket (no protection)"}
base = rows["rclone"]
print(f"\n{size} MiB, {len(base)} runs, ranges over the runs (MiB/s); ratios: worst over best and best over worst against rclone\n")
print("| system | put MiB/s | get MiB/s | put / rclone | get / rclone |")
print("|---|---:|---:|---:|---:|")
for k in ("local", "s3", "rclone"):
    p = [r[0] for r in rows[k]]; g = [r[1] for r in rows[k]]
    bp = [r[0] for r in base]; bg = [r[1] for r in base]
    print(f"| {names[k]} | {min(p):.0f}–{max(p):.0f} | {min(g):.0f}–{max(g):.0f} | "
          f"{min(p)/max(bp):.2f}–{max(p)/min(bp):.2f} | {min(g)/max(bg):.2f}–{max(g)/min(bg):.2f} |")
EOF

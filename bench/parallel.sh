#!/usr/bin/env bash
# bench/parallel.sh — does a second core help? N readers and N writers on different files,
# N = 1, 2, 4, through the mount, side by side with a plain directory and gocryptfs
# (issue 11: "show the scaling ... and explain the ratio").
#
#   bench/parallel.sh [--runs R] [--size MiB] [--only SYS,SYS,...] [--out FILE]
#
# Systems: plain gocryptfs intact (INTACT_BIN) and, when INTACT_OLD_BIN names another
# build, intact-old (the same scheme: an A/B of two builds in one run). Needs root (FUSE,
# drop_caches), fio, fusermount3, python3, and gocryptfs for its row.
#
# Environment:
#   BENCH_DIR      backing directories (default /var/tmp/intact-parallel), on a real disk
#   INTACT_BIN     intact binary (default /work/target-rel/release/intact, then PATH)
#   INTACT_OLD_BIN an older intact binary for the intact-old row (optional)
#   INTACT_SCHEME  scheme of the intact rows (default mt-eint)
#   INTACT_MOUNT_ARGS extra arguments to `intact mount`
#
# Workloads, for N = 1, 2, 4; every job has a file of its own (SIZE MiB, default 128);
# MB/s (10^6 bytes) = fio's aggregate bandwidth of the N jobs (group_reporting):
#   read      N fio jobs read their files sequentially in 128 KiB requests after a remount
#             (the mount's page cache is empty, every read reaches the daemon; the backing
#             files stay in the machine's page cache: the daemon's CPU is what is measured)
#   read cold the same after drop_caches too (the backing disk is in the loop)
#   write     N fio jobs overwrite their files sequentially in 128 KiB requests, fsync at the
#             end inside the timed region
#   mixed     N readers (as `read`) and N writers (as `write`) at once; both rates printed
# The scaling columns divide by the N = 1 figure of the same system and run.
set -euo pipefail

RUNS=3
SIZE=128
ONLY=""
OUT=""
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --only) ONLY=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "parallel.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

BENCH_DIR=${BENCH_DIR:-/var/tmp/intact-parallel}
INTACT_BIN=${INTACT_BIN:-/work/target-rel/release/intact}
[ -x "$INTACT_BIN" ] || INTACT_BIN=$(command -v intact || true)
INTACT_SCHEME=${INTACT_SCHEME:-mt-eint}
PW=intact-bench-password
NS="1 2 4"

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
die() { echo "parallel.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (FUSE mounts, drop_caches)"
for t in fio fusermount3 mountpoint python3; do
    command -v "$t" >/dev/null || die "missing $t (apt-get install -y fio fuse3 python3)"
done
[ -n "$INTACT_BIN" ] || die "no intact binary: build one (CARGO_TARGET_DIR=/work/target-rel cargo build --release -p intact) or set INTACT_BIN"

SYSTEMS="plain gocryptfs intact"
[ -n "${INTACT_OLD_BIN:-}" ] && SYSTEMS+=" intact-old"
if [ -n "$ONLY" ]; then SYSTEMS=${ONLY//,/ }; fi
case " $SYSTEMS " in *" gocryptfs "*) command -v gocryptfs >/dev/null || die "missing gocryptfs (apt-get install -y gocryptfs) or leave it out with --only" ;; esac

MOUNTED=""
cleanup() {
    local m
    for m in $MOUNTED; do fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || true; done
}
trap cleanup EXIT

bin_of() { case $1 in intact-old) echo "$INTACT_OLD_BIN" ;; *) echo "$INTACT_BIN" ;; esac; }

do_init() { # SYS DIR
    local s=$1 d=$2
    rm -rf "$d"; mkdir -p "$d/cipher" "$d/mnt"
    case $s in
        plain) ;;
        gocryptfs) gocryptfs -init -q -extpass "echo $PW" "$d/cipher" ;;
        intact*) INTACT_PASSWORD=$PW "$(bin_of "$s")" --state "$d/state" init "$d/cipher" \
                     --scheme "$INTACT_SCHEME" --kdf-memory 65536 >/dev/null ;;
    esac
}

do_mount() { # SYS DIR
    local s=$1 d=$2 i
    case $s in
        plain) return 0 ;;
        gocryptfs) gocryptfs -q -extpass "echo $PW" "$d/cipher" "$d/mnt" ;;
        # shellcheck disable=SC2086
        intact*) INTACT_PASSWORD=$PW "$(bin_of "$s")" --state "$d/state" mount "$d/cipher" "$d/mnt" \
                     --log "$d/mount.log" ${INTACT_MOUNT_ARGS:-} ;;
    esac
    for ((i = 0; i < 300; i++)); do mountpoint -q "$d/mnt" && break; sleep 0.1; done
    mountpoint -q "$d/mnt" || die "$s did not mount at $d/mnt"
    MOUNTED+=" $d/mnt"
}

do_umount() { # SYS DIR
    local s=$1 d=$2 i
    [ "$s" = plain ] && { sync; return 0; }
    fusermount3 -u "$d/mnt" || { sleep 1; fusermount3 -u "$d/mnt"; }
    for ((i = 0; i < 600; i++)); do
        pgrep -f -- "$d/cipher" >/dev/null || break
        sleep 0.1
    done
    pgrep -f -- "$d/cipher" >/dev/null && die "$s: daemon still running after unmount"
    MOUNTED=${MOUNTED//" $d/mnt"/}
}

dir_of() { # SYS DIR: where the workload's files are
    [ "$1" = plain ] && echo "$2/cipher" || echo "$2/mnt"
}

# fio_jobs KIND N DIR: one fio process, N jobs, job j on file KIND.j; prints the jobs'
# aggregate MB/s (fio's own clock, from the first request to the last completion, the
# final fsync of the writers included).
fio_jobs() {
    local kind=$1 n=$2 dir=$3 rw extra="" out
    case $kind in
        r) rw=read ;;
        w) rw=write; extra="--end_fsync=1" ;;
    esac
    out=$(mktemp)
    # shellcheck disable=SC2086
    fio --name="$kind" --directory="$dir" --filename_format="$kind.\$jobnum" --rw=$rw \
        --bs=128k --size="${SIZE}m" --numjobs="$n" --ioengine=psync --invalidate=0 \
        --fallocate=none --group_reporting $extra --output-format=json --output="$out"
    python3 - "$out" "$rw" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
print(f"{job[sys.argv[2]]['bw_bytes'] / 1e6:.0f}")
PY
    rm -f "$out"
}

declare -A R   # R[sys,workload,N] = space-separated MB/s over runs

run_one() { # SYS RUN
    local s=$1 d=$BENCH_DIR/$1 n dir pr pw
    do_init "$s" "$d"
    do_mount "$s" "$d"
    dir=$(dir_of "$s" "$d")
    # The files: 4 to read, 4 to overwrite, written once, untimed.
    for j in 0 1 2 3; do
        dd if=/dev/urandom of="$dir/r.$j" bs=1M count="$SIZE" status=none
        dd if=/dev/urandom of="$dir/w.$j" bs=1M count="$SIZE" status=none
    done
    sync
    for n in $NS; do
        # read (backing cached)
        do_umount "$s" "$d"; do_mount "$s" "$d"
        find "$d/cipher" -type f -exec cat {} + >/dev/null
        R[$s,read,$n]+=" $(fio_jobs r "$n" "$dir")"
        # read cold
        do_umount "$s" "$d"; sync; echo 3 >/proc/sys/vm/drop_caches; do_mount "$s" "$d"
        R[$s,cold,$n]+=" $(fio_jobs r "$n" "$dir")"
        # write
        R[$s,write,$n]+=" $(fio_jobs w "$n" "$dir")"
        # mixed
        do_umount "$s" "$d"; do_mount "$s" "$d"
        fio_jobs r "$n" "$dir" >"$BENCH_DIR/r.rate" &
        fio_jobs w "$n" "$dir" >"$BENCH_DIR/w.rate" &
        wait
        pr=$(cat "$BENCH_DIR/r.rate"); pw=$(cat "$BENCH_DIR/w.rate")
        R[$s,mixed,$n]+=" $pr/$pw"
        log "$s run $2 N=$n: read ${R[$s,read,$n]##* } cold ${R[$s,cold,$n]##* } write ${R[$s,write,$n]##* } mixed $pr/$pw MB/s"
    done
    if [[ $s == intact* ]] && grep -qiE "integrity failure|ERROR" "$d/mount.log"; then
        die "$s: errors in its mount log: $(grep -iE 'integrity failure|ERROR' "$d/mount.log" | head -3)"
    fi
    do_umount "$s" "$d"
    rm -rf "$d"
}

mkdir -p "$BENCH_DIR"
for ((run = 1; run <= RUNS; run++)); do
    for s in $SYSTEMS; do run_one "$s" "$run"; done
done

# range "a b c" -> "min–max" (or the one value); mixed cells are "read/write" pairs.
range() { python3 - "$@" <<'EOF'
import sys
vals = sys.argv[1].split()
if not vals:
    print("—"); sys.exit()
if "/" in vals[0]:
    r = [int(v.split("/")[0]) for v in vals]; w = [int(v.split("/")[1]) for v in vals]
    f = lambda xs: f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}–{max(xs)}"
    print(f"{f(r)} / {f(w)}")
else:
    xs = [int(v) for v in vals]
    print(f"{min(xs)}" if min(xs) == max(xs) else f"{min(xs)}–{max(xs)}")
EOF
}
# scale "a b c" "x y z" -> range of per-run ratios x/a (mixed: the read rate's)
scale() { python3 - "$1" "$2" <<'EOF'
import sys
a = [float(v.split("/")[0]) for v in sys.argv[1].split()]
b = [float(v.split("/")[0]) for v in sys.argv[2].split()]
rs = [y / x for x, y in zip(a, b) if x > 0]
print("—" if not rs else f"{min(rs):.2f}–{max(rs):.2f}×")
EOF
}

{
    echo "bench/parallel.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $RUNS runs, ${SIZE} MiB per job, $(nproc) cores; intact: $INTACT_BIN ($INTACT_SCHEME)${INTACT_OLD_BIN:+, intact-old: $INTACT_OLD_BIN}"
    echo
    echo "| system | workload | N=1 MB/s | N=2 MB/s | N=4 MB/s | N=2 / N=1 | N=4 / N=1 |"
    echo "|---|---|---|---|---|---|---|"
    for s in $SYSTEMS; do
        for w in read cold write mixed; do
            label=$w; [ $w = cold ] && label="read cold"; [ $w = mixed ] && label="mixed (read / write)"
            echo "| $s | $label | $(range "${R[$s,$w,1]}") | $(range "${R[$s,$w,2]}") | $(range "${R[$s,$w,4]}") | $(scale "${R[$s,$w,1]}" "${R[$s,$w,2]}") | $(scale "${R[$s,$w,1]}" "${R[$s,$w,4]}") |"
        done
    done
} >"$BENCH_DIR/table.md"
cat "$BENCH_DIR/table.md"
if [ -n "$OUT" ]; then cp "$BENCH_DIR/table.md" "$OUT"; fi

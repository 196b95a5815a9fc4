#!/usr/bin/env bash
# Random 4 KiB overwrites of one large file through the mount, side by side with
# gocryptfs, in one run: fio psync writes with O_DIRECT (every write reaches the daemon) on
# a file first written whole, timed through fio's final fsync. As the writes go on, the
# file's counter intervals fragment (Oprea-Reiter §4.2): this shows whether a write's cost
# grows with them (docs/performance.md, "Random writes and the spilled counters").
#
#   bench/randwrite.sh [MIB:WRITES ...]   (default 128:8192 2048:30000 2048:65536)
#
# Prints per system and case the MB/s of fio's writes as the range over RUNS runs, and
# intact's ratio to gocryptfs (the lowest over the highest, and the reverse); then the
# bytes each daemon wrote to its backing files (its /proc/PID/io wchar, from before fio
# to after fio and, for intact, an `intact sync` that checkpoints) per byte fio wrote.
#
# Environment:
#   BENCH_DIR      backing directories (default /dev/shm/intact-randwrite: tmpfs, so that
#                  the daemons' CPU is measured, not a disk)
#   INTACT_BIN     intact binary (default /work/target-rel/release/intact, then PATH)
#   INTACT_OLD_BIN an older intact binary for an intact-old row (an A/B in one run)
#   INTACT_SCHEME  scheme of the intact rows (default mt-eint)
#   RUNS           runs per system and case (default 3; the systems alternate)
# Needs root (FUSE), fusermount3, fio and gocryptfs.
set -euo pipefail

CASES=${*:-128:8192 2048:30000 2048:65536}
RUNS=${RUNS:-3}
BENCH_DIR=${BENCH_DIR:-/dev/shm/intact-randwrite}
INTACT_BIN=${INTACT_BIN:-/work/target-rel/release/intact}
[ -x "$INTACT_BIN" ] || INTACT_BIN=$(command -v intact || true)
INTACT_SCHEME=${INTACT_SCHEME:-mt-eint}
PW=intact-bench-password

die() { echo "randwrite: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (FUSE mounts)"
for t in fusermount3 mountpoint fio gocryptfs python3; do
    command -v $t >/dev/null || die "missing $t"
done
[ -n "$INTACT_BIN" ] || die "no intact binary: build one or set INTACT_BIN"
SYSTEMS="gocryptfs intact"
[ -n "${INTACT_OLD_BIN:-}" ] && SYSTEMS+=" intact-old"

MOUNTED=""
cleanup() {
    local m
    for m in $MOUNTED; do fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] || rm -rf "$BENCH_DIR"
}
trap cleanup EXIT
bin_of() { case $1 in intact-old) echo "$INTACT_OLD_BIN" ;; *) echo "$INTACT_BIN" ;; esac; }

wchar() { awk '/^wchar/ {print $2}' "/proc/$1/io"; }

one_run() { # SYS MIB WRITES -> MB/s:WRITTEN-PER-BYTE
    local s=$1 mib=$2 writes=$3 d=$BENCH_DIR/$1 i t0 t1 pid w0 w1
    rm -rf "$d"; mkdir -p "$d/cipher" "$d/mnt"
    case $s in
        gocryptfs) gocryptfs -init -q -extpass "echo $PW" "$d/cipher" 2>/dev/null
                   gocryptfs -q -extpass "echo $PW" "$d/cipher" "$d/mnt" 2>/dev/null ;;
        intact*) INTACT_PASSWORD=$PW "$(bin_of "$s")" --state "$d/state" init "$d/cipher" \
                     --scheme "$INTACT_SCHEME" --kdf-memory 65536 >/dev/null
                 INTACT_PASSWORD=$PW "$(bin_of "$s")" --state "$d/state" mount "$d/cipher" \
                     "$d/mnt" --log "$d/mount.log" >/dev/null 2>"$d/mount.err" ||
                     { cat "$d/mount.err" >&2; die "$s: mount failed"; } ;;
    esac
    for ((i = 0; i < 300; i++)); do mountpoint -q "$d/mnt" && break; sleep 0.1; done
    mountpoint -q "$d/mnt" || die "$s did not mount"
    MOUNTED+=" $d/mnt"
    dd if=/dev/urandom of="$d/mnt/r.dat" bs=1M count="$mib" conv=fsync status=none
    sync
    echo 3 >/proc/sys/vm/drop_caches
    pid=$(pgrep -f -- "$d/cipher" | head -1)
    w0=$(wchar "$pid")
    t0=$(date +%s.%N)
    fio --name=rw --filename="$d/mnt/r.dat" --size="${mib}m" --bs=4k --rw=randwrite \
        --ioengine=psync --direct=1 --io_size=$((writes * 4096)) --verify=crc32c \
        --do_verify=0 --verify_state_save=0 --randseed=42 --end_fsync=1 \
        --output-format=json --output="$d/fio.json" >"$d/fio.err" 2>&1 ||
        { tail -n 20 "$d/fio.err" >&2; die "$s: fio failed"; }
    t1=$(date +%s.%N)
    if [[ $s == intact* ]]; then
        "$(bin_of "$s")" sync "$d/mnt" >/dev/null
    fi
    w1=$(wchar "$pid")
    fusermount3 -u "$d/mnt"
    for ((i = 0; i < 600; i++)); do pgrep -f -- "$d/cipher" >/dev/null || break; sleep 0.1; done
    MOUNTED=${MOUNTED//" $d/mnt"/}
    if [[ $s == intact* ]] && grep -qiE "integrity failure|ERROR" "$d/mount.log"; then
        die "$s: errors in its mount log"
    fi
    python3 -c 'import sys; w=int(sys.argv[1]) * 4096; print("%.1f:%.2f" % (w / 1e6 / (float(sys.argv[3]) - float(sys.argv[2])), (int(sys.argv[5]) - int(sys.argv[4])) / w))' \
        "$writes" "$t0" "$t1" "$w0" "$w1"
}

mkdir -p "$BENCH_DIR"
printf 'fio O_DIRECT random 4 KiB writes, MB/s over %s runs (backing: %s)\n' "$RUNS" "$BENCH_DIR"
printf '| file MiB | writes |'; for s in $SYSTEMS; do printf ' %s |' "$s"; done; printf ' intact / gocryptfs |\n'
printf '|---:|---:|'; for s in $SYSTEMS; do printf -- '---:|'; done; printf -- '---:|\n'
declare -A W=()
for c in $CASES; do
    mib=${c%%:*} writes=${c##*:}
    declare -A R=()
    for ((r = 0; r < RUNS; r++)); do
        for s in $SYSTEMS; do
            out=$(one_run "$s" "$mib" "$writes")
            R[$s]+="${out%%:*} "
            W[$c $s]+="${out##*:} "
        done
    done
    printf '| %s | %s |' "$mib" "$writes"
    for s in $SYSTEMS; do
        printf ' %s |' "$(printf '%s\n' ${R[$s]} | sort -g | sed -n '1p;$p' | uniq | paste -sd- | sed 's/-/ – /')"
    done
    lo() { printf '%s\n' ${R[$1]} | sort -g | head -1; }
    hi() { printf '%s\n' ${R[$1]} | sort -g | tail -1; }
    printf ' %s |\n' "$(python3 -c 'import sys; a,b,c,d=map(float,sys.argv[1:]); print("%.2f – %.2f" % (a/d, c/b))' \
        "$(lo intact)" "$(lo gocryptfs)" "$(hi intact)" "$(hi gocryptfs)")"
    unset R
done
echo
printf 'bytes the daemon wrote to its backing files per byte fio wrote (range over %s runs)\n' "$RUNS"
printf '| file MiB | writes |'; for s in $SYSTEMS; do printf ' %s |' "$s"; done; printf '\n'
printf '|---:|---:|'; for s in $SYSTEMS; do printf -- '---:|'; done; printf '\n'
for c in $CASES; do
    printf '| %s | %s |' "${c%%:*}" "${c##*:}"
    for s in $SYSTEMS; do
        printf ' %s |' "$(printf '%s\n' ${W[$c $s]} | sort -g | sed -n '1p;$p' | uniq | paste -sd- | sed 's/-/ – /')"
    done
    printf '\n'
done

#!/usr/bin/env bash
# What small files cost in the store: N files of 1 KiB (in N/1000 directories) written
# through the mount, side by side with gocryptfs, in one run. Prints per system the backing
# directory's allocated and apparent bytes, its files, and the time to create the files and
# unmount (the unmount makes them durable: intact seals at unmount, gocryptfs writes
# through), each as the range over RUNS runs.
#
#   bench/smallstore.sh [N]          (default N = 10000, RUNS = 3)
#
# Environment:
#   BENCH_DIR      backing directories (default /var/tmp/intact-smallstore), on a real disk
#   INTACT_BIN     intact binary (default /work/target-rel/release/intact, then PATH)
#   INTACT_OLD_BIN an older intact binary for an intact-old row (an A/B in one run)
#   INTACT_SCHEME  scheme of the intact rows (default mt-eint)
#   RUNS           runs per system (default 3)
# Needs root (FUSE), fusermount3, python3 and gocryptfs.
set -euo pipefail

N=${1:-10000}
RUNS=${RUNS:-3}
BENCH_DIR=${BENCH_DIR:-/var/tmp/intact-smallstore}
INTACT_BIN=${INTACT_BIN:-/work/target-rel/release/intact}
[ -x "$INTACT_BIN" ] || INTACT_BIN=$(command -v intact || true)
INTACT_SCHEME=${INTACT_SCHEME:-mt-eint}
HERE=$(cd "$(dirname "$0")" && pwd)
PW=intact-bench-password
SIZE=1024

die() { echo "smallstore: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (FUSE mounts)"
for t in fusermount3 mountpoint python3 gocryptfs; do
    command -v $t >/dev/null || die "missing $t"
done
[ -n "$INTACT_BIN" ] || die "no intact binary: build one or set INTACT_BIN"
SYSTEMS="gocryptfs intact"
[ -n "${INTACT_OLD_BIN:-}" ] && SYSTEMS+=" intact-old"

MOUNTED=""
cleanup() {
    local m
    for m in $MOUNTED; do fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || true; done
}
trap cleanup EXIT
bin_of() { case $1 in intact-old) echo "$INTACT_OLD_BIN" ;; *) echo "$INTACT_BIN" ;; esac; }

mkdir -p "$BENCH_DIR"
SRC=$BENCH_DIR/src.bin
head -c $((N * SIZE)) /dev/urandom >"$SRC"

one_run() { # SYS -> "seconds allocated apparent files"
    local s=$1 d=$BENCH_DIR/$1 i t0 t1 per=1000 k
    rm -rf "$d"; mkdir -p "$d/cipher" "$d/mnt"
    case $s in
        gocryptfs) gocryptfs -init -q -extpass "echo $PW" "$d/cipher"
                   gocryptfs -q -extpass "echo $PW" "$d/cipher" "$d/mnt" ;;
        intact*) INTACT_PASSWORD=$PW "$(bin_of "$s")" --state "$d/state" init "$d/cipher" \
                     --scheme "$INTACT_SCHEME" --kdf-memory 65536 >/dev/null
                 INTACT_PASSWORD=$PW "$(bin_of "$s")" --state "$d/state" mount "$d/cipher" \
                     "$d/mnt" --log "$d/mount.log" ;;
    esac
    for ((i = 0; i < 300; i++)); do mountpoint -q "$d/mnt" && break; sleep 0.1; done
    mountpoint -q "$d/mnt" || die "$s did not mount"
    MOUNTED+=" $d/mnt"
    [ "$N" -lt $per ] && per=$N
    t0=$(date +%s.%N)
    for ((k = 0; k < N / per; k++)); do
        mkdir "$d/mnt/d$k"
        # Each directory takes the next slice of SRC.
        python3 - "$SRC" "$d/mnt/d$k" "$per" "$SIZE" "$k" <<'EOF'
import os, sys
src, d, n, size, k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
with open(src, "rb") as f:
    f.seek(k * n * size)
    data = f.read(n * size)
for i in range(n):
    fd = os.open(os.path.join(d, "f%05d" % i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data[i * size:(i + 1) * size])
    os.close(fd)
EOF
    done
    fusermount3 -u "$d/mnt"
    for ((i = 0; i < 600; i++)); do pgrep -f -- "$d/cipher" >/dev/null || break; sleep 0.1; done
    pgrep -f -- "$d/cipher" >/dev/null && die "$s: daemon still running after unmount"
    MOUNTED=${MOUNTED//" $d/mnt"/}
    sync
    t1=$(date +%s.%N)
    if [[ $s == intact* ]] && grep -qiE "integrity failure|ERROR" "$d/mount.log"; then
        die "$s: errors in its mount log"
    fi
    echo "$(printf "%.2f" "$(echo "$t1 - $t0" | bc)") $(du -s -B1 "$d/cipher" | cut -f1) $(du -s -b --apparent-size "$d/cipher" | cut -f1) $(find "$d/cipher" -type f | wc -l)"
}

printf '%s files of %s bytes, %s runs\n' "$N" "$SIZE" "$RUNS"
printf '%-11s %16s %22s %22s %14s %14s\n' system "create+umount s" "allocated bytes" "apparent bytes" "files" "alloc/file"
for s in $SYSTEMS; do
    secs=(); alloc=(); app=(); files=()
    for ((r = 0; r < RUNS; r++)); do
        read -r a b c e < <(one_run "$s")
        secs+=("$a"); alloc+=("$b"); app+=("$c"); files+=("$e")
    done
    range() { printf '%s\n' "$@" | sort -g | sed -n '1p;$p' | paste -sd- | sed 's/-$//'; }
    lo_alloc=$(printf '%s\n' "${alloc[@]}" | sort -n | head -1)
    printf '%-11s %16s %22s %22s %14s %14s\n' "$s" "$(range "${secs[@]}")" "$(range "${alloc[@]}")" \
        "$(range "${app[@]}")" "$(range "${files[@]}")" "$((lo_alloc / N))"
done
[ -n "${KEEP:-}" ] || rm -rf "$BENCH_DIR"

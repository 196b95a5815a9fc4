#!/usr/bin/env bash
# Huge pages for the heap (docs/performance.md, "Huge pages for the heap"): what a random
# memory access costs here on 4 KiB and on huge pages (bench/memlat.rs), then the same
# intact binary through the mount with its heap on huge pages (the default where the
# kernel's mode is `madvise`) and with INTACT_HUGE_PAGES=0, alternating: fio O_DIRECT
# random 4 KiB writes (every write reaches the daemon) into a 128 MiB file written whole,
# WRITES at a time, three times on the same file (its counter intervals fragment).
#
#   bench/hugepages.sh            RUNS=3 WRITES=8192 by default
#
# Prints per setting the MB/s of each of the three fio runs and the daemon's CPU time per
# write (its utime + stime from /proc), as ranges over RUNS mounts, and the daemon's RSS.
# Environment: BENCH_DIR (default /dev/shm/intact-hugepages: tmpfs, so that the daemon's
# CPU is measured), INTACT_BIN (default /work/target-rel/release/intact, then PATH).
# Needs root (FUSE), fusermount3, fio, rustc.
set -euo pipefail
RUNS=${RUNS:-3}
WRITES=${WRITES:-8192}
BENCH_DIR=${BENCH_DIR:-/dev/shm/intact-hugepages}
INTACT_BIN=${INTACT_BIN:-/work/target-rel/release/intact}
[ -x "$INTACT_BIN" ] || INTACT_BIN=$(command -v intact || true)
die() { echo "hugepages: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (FUSE mounts)"
for t in fusermount3 mountpoint fio rustc; do command -v $t >/dev/null || die "missing $t"; done
[ -n "$INTACT_BIN" ] || die "no intact binary: build one or set INTACT_BIN"
echo "kernel THP mode: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"

mkdir -p "$BENCH_DIR"
trap 'fusermount3 -u "$BENCH_DIR/mnt" 2>/dev/null || true; rm -rf "$BENCH_DIR"' EXIT
rustc -O "$(dirname "$0")/memlat.rs" -o "$BENCH_DIR/memlat" 2>/dev/null || die "rustc failed on memlat.rs"
env -u GLIBC_TUNABLES "$BENCH_DIR/memlat"
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "$BENCH_DIR/memlat" --maps-only

one_mount() { # HUGE(0|1) -> "MB/s MB/s MB/s|cpu cpu cpu|rss"
    local d=$BENCH_DIR i pid c0 c1 mbs="" cpu=""
    rm -rf "$d/cipher" "$d/state"; mkdir -p "$d/cipher" "$d/mnt"
    INTACT_PASSWORD=pw "$INTACT_BIN" --state "$d/state" init "$d/cipher" --kdf-memory 65536 >/dev/null
    INTACT_HUGE_PAGES=$1 INTACT_PASSWORD=pw "$INTACT_BIN" --state "$d/state" mount "$d/cipher" \
        "$d/mnt" --log "$d/mount.log" >/dev/null 2>"$d/mount.err" || { cat "$d/mount.err" >&2; die "mount failed"; }
    for ((i = 0; i < 300; i++)); do mountpoint -q "$d/mnt" && break; sleep 0.1; done
    mountpoint -q "$d/mnt" || die "intact did not mount"
    dd if=/dev/urandom of="$d/mnt/r.dat" bs=1M count=128 conv=fsync status=none
    pid=$(pgrep -f -- "$d/cipher" | head -1)
    for seed in 1 2 3; do
        c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
        mbs+=" $(fio --name=rw --filename="$d/mnt/r.dat" --size=128m --bs=4k --rw=randwrite \
            --ioengine=psync --direct=1 --io_size=$((WRITES * 4096)) --randseed=$seed \
            --output-format=json 2>/dev/null | python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["write"]["bw_bytes"] / 1e6))')"
        c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
        cpu+=" $(( (c1 - c0) * 1000000 / $(getconf CLK_TCK) / WRITES ))"
    done
    echo "$mbs|$cpu|$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$pid/status")"
    fusermount3 -u "$d/mnt"
    for ((i = 0; i < 600; i++)); do pgrep -f -- "$d/cipher" >/dev/null || break; sleep 0.1; done
}

declare -A OUT=()
for ((r = 0; r < RUNS; r++)); do
    for h in 1 0; do OUT[$h]+="$(one_mount $h);"; done
done
span() { printf '%s\n' "$@" | sort -g | sed -n '1p;$p' | uniq | paste -sd- | sed 's/-/–/'; }
printf '\nfio O_DIRECT random 4 KiB writes, %s a run, 3 runs a mount, %s mounts a setting\n' "$WRITES" "$RUNS"
echo "| heap | run 1 MB/s | run 2 MB/s | run 3 MB/s | run 1 µs CPU/write | run 2 | run 3 | daemon RSS MB |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for h in 1 0; do
    IFS=';' read -ra mounts <<<"${OUT[$h]}"
    row="| $([ $h = 1 ] && echo "huge pages" || echo "4 KiB pages (INTACT_HUGE_PAGES=0)") |"
    for k in 1 2 3; do row+=" $(span $(for m in "${mounts[@]}"; do echo "${m%%|*}" | awk -v k=$k '{print $k}'; done)) |"; done
    for k in 1 2 3; do row+=" $(span $(for m in "${mounts[@]}"; do echo "$m" | cut -d'|' -f2 | awk -v k=$k '{print $k}'; done)) |"; done
    row+=" $(span $(for m in "${mounts[@]}"; do echo "${m##*|}"; done)) |"
    echo "$row"
done

#!/usr/bin/env bash
# bench/fs.sh — the same file-system workloads, side by side, on a plain directory, bindfs,
# gocryptfs, cryfs, encfs, securefs and intact (one row per intact scheme).
#
#   bench/fs.sh [--quick] [--only SYS,SYS,...] [--out FILE] [--keep]
#
# Systems: plain bindfs gocryptfs cryfs encfs securefs intact-<scheme>... ("intact" selects
# every scheme). Needs root (drop_caches, FUSE): apt-get install -y bindfs gocryptfs cryfs
# encfs securefs fuse3 fio attr; and a release build of intact:
#   CARGO_TARGET_DIR=/work/target-rel cargo build --release -p intact
#
# Environment:
#   BENCH_DIR      backing directories, on a real disk (default /var/tmp/intact-bench)
#   BENCH_SHM      RAM-backed source data (default /dev/shm/intact-bench)
#   BENCH_TMPFS=1  allow BENCH_DIR on tmpfs: every system's backing in RAM, so the rows
#                  measure the daemons' CPU and syscalls without the disk's latency
#   BENCH_FRESH_FS each system's backing directory is a freshly made ext4 (mkfs.ext4
#                  defaults, so with a journal) on a loop device (direct I/O) over a sparse
#                  file in BENCH_DIR (default 1 on disk, 0 on tmpfs; 0 = BENCH_DIR itself).
#                  On a shared file system each system would meet what the ones before it
#                  left: this machine's root ext4 has no journal, and such an ext4 skips
#                  every inode deleted in the last minutes when it allocates one
#                  (recently_deleted(), fs/ext4/ialloc.c), so the system run after another
#                  one's cleanup spent a third of its CPU creating files in that scan
#                  (perf, 2026-11-29). BENCH_FS_GIB sizes the image (default 16).
#   INTACT_BIN     intact binary (default /work/target-rel/release/intact, then PATH)
#   INTACT_SCHEMES space-separated schemes (default: parsed from `intact init --help`)
#   INTACT_MOUNT_ARGS extra arguments to `intact mount` (e.g. "--threads 4")
#   WL_TIMEOUT     seconds before one workload is declared hung (default 900)
#
# Workloads (MB = 10^6 bytes; every timing is wall clock around the operation):
#   seq write   512 MiB of random data (from /dev/shm) in 1 MiB writes, fsync at the end
#   seq read    the same file after remount + drop_caches, 1 MiB reads (contents checked)
#   rand write  fio psync 4 KiB random writes over a 128 MiB file, a quarter of its blocks
#               (each once), fsync at the end inside the timed region; through the page cache
#   rand write O_DIRECT  the same on another file with O_DIRECT: every write reaches the daemon
#               (both files are then checked block by block, untimed: fio --verify_only)
#   rand read   fio psync 4 KiB random reads of the first, after remount + drop_caches, a
#               quarter of its blocks (each once: no read is served from the page cache)
#   create      2,000 files of 16 KiB (one process), then sync (below) — files/s
#   read back   list + read them after remount + drop_caches (contents checked) — files/s
#   tar -x      untar a ~60 MB source tree (/usr/include, then cargo registry sources),
#               then sync (below) — MB/s of tarball
#   "sync" after create and tar -x = syncfs of the mount (the kernel's dirty pages and
#   timestamps go to the daemon; FUSE sends no fsync for it), fsync of the directory through
#   the mount (FSYNCDIR: intact seals the whole volume, cryfs/gocryptfs sync what they
#   hold), then syncfs of the backing file system (the daemons that write through).
# The files stay in place until the end (no unlinks between workloads); then, untimed, they
# are removed through the mount and synced, and intact's mount log is checked for errors.
#   tar -c      tar -c of that tree to a pipe after remount + drop_caches (tree diffed
#               against the original afterwards) — MB/s of tar output
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BASE=${BENCH_DIR:-/var/tmp/intact-bench}
SHM=${BENCH_SHM:-/dev/shm/intact-bench}
PW=intact-bench-password
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
WL_TIMEOUT=${WL_TIMEOUT:-900}
MOUNT_TIMEOUT=60

QUICK=0
ONLY=""
OUT=""
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) QUICK=1 ;;
    --only) ONLY=$2; shift ;;
    --only=*) ONLY=${1#--only=} ;;
    --out) OUT=$2; shift ;;
    --out=*) OUT=${1#--out=} ;;
    --keep) KEEP=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fs.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$QUICK" = 1 ]; then
    SEQ_MIB=64 RAND_MIB=32 NFILES=200 FILE_KIB=16 TREE_MB=8
else
    SEQ_MIB=512 RAND_MIB=128 NFILES=2000 FILE_KIB=16 TREE_MB=60
fi

die() { echo "fs.sh: ERROR: $*" >&2; exit 1; }
log() { echo "[$(date +%T)] $*" >&2; }

[ "$(id -u)" = 0 ] || die "run as root (drop_caches and FUSE mounts)"
for t in fio fusermount3 mountpoint "$PY" tar dd cmp diff timeout pgrep; do
    command -v "$t" >/dev/null || die "$t not found (apt-get install -y fuse3 fio attr ...)"
done

if [ -z "${INTACT_BIN:-}" ]; then
    if [ -x /work/target-rel/release/intact ]; then INTACT_BIN=/work/target-rel/release/intact
    else INTACT_BIN=$(command -v intact || true); fi
fi

# The intact schemes: INTACT_SCHEMES, else what `intact init --help` lists (clap's
# "[possible values: ...]" if present, else the prose of --scheme), else the known three.
detect_schemes() {
    local h s
    h=$("$INTACT_BIN" init --help 2>&1 | tr '\n' ' ' | tr -s ' ') || return 1
    s=$(printf '%s' "$h" | grep -o 'scheme[^[]*\[possible values: [^]]*' | head -1 | sed 's/.*possible values: //')
    if [ -z "$s" ]; then
        s=$(printf '%s' "$h" | sed -n 's/.*Default scheme of new files: \([^.[]*\).*/\1/p' | sed 's/([^)]*)//g')
    fi
    s=$(printf '%s' "$s" | tr ',/' '  ' | xargs)
    for x in $s; do [[ "$x" =~ ^[a-z0-9-]+$ ]] || return 1; done
    [ -n "$s" ] && echo "$s"
}

ALL_PEERS="plain bindfs gocryptfs cryfs encfs securefs"
if [ -n "$ONLY" ]; then WANT=" ${ONLY//,/ } "; else WANT=" $ALL_PEERS intact "; fi
SYSTEMS=""
for p in $ALL_PEERS; do [[ "$WANT" == *" $p "* ]] && SYSTEMS+="$p "; done
NEED_INTACT=0
[[ "$WANT" == *" intact"* ]] && NEED_INTACT=1
if [ "$NEED_INTACT" = 1 ]; then
    [ -n "$INTACT_BIN" ] && [ -x "$INTACT_BIN" ] || die "intact binary not found (set INTACT_BIN or build: CARGO_TARGET_DIR=/work/target-rel cargo build --release -p intact)"
    if [ -z "${INTACT_SCHEMES:-}" ]; then
        INTACT_SCHEMES=$(detect_schemes) || INTACT_SCHEMES=""
        if [ -z "$INTACT_SCHEMES" ]; then
            INTACT_SCHEMES="mt-eint mt-eint-cbc aead"
            log "warning: could not parse the schemes from \`intact init --help\`; using $INTACT_SCHEMES"
        fi
    fi
    for s in $INTACT_SCHEMES; do
        [[ "$WANT" == *" intact "* || "$WANT" == *" intact-$s "* ]] && SYSTEMS+="intact-$s "
    done
fi
for w in $WANT; do
    [[ " $SYSTEMS intact " == *" $w "* ]] || die "unknown system $w (known: $ALL_PEERS intact intact-<scheme>; schemes: ${INTACT_SCHEMES:-?})"
done
[ -n "$SYSTEMS" ] || die "no system selected"
for s in $SYSTEMS; do
    case $s in plain | intact-*) ;; *) command -v "$s" >/dev/null || die "$s not installed (apt-get install -y $s)" ;; esac
done

# ---------------------------------------------------------------------------------------
# Mount bookkeeping and cleanup

MOUNTED=""     # mount points currently mounted by this script
FRESH_MOUNTS=""  # fresh ext4 file systems mounted by this script (BENCH_FRESH_FS)
FAILED=0

unmount_wait() { # MNT CIPHER: unmount, then wait until the daemon serving CIPHER has exited
    local mnt=$1 cipher=$2 i
    if mountpoint -q "$mnt"; then
        fusermount3 -u "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null ||
            { sleep 1; fusermount3 -u "$mnt" 2>/dev/null; } || fusermount3 -uz "$mnt" || umount -l "$mnt"
    fi
    for ((i = 0; i < MOUNT_TIMEOUT * 10; i++)); do
        if ! mountpoint -q "$mnt" && ! pgrep -f -- "$cipher" >/dev/null; then
            MOUNTED=${MOUNTED//" $mnt"/}
            return 0
        fi
        sleep 0.1
    done
    echo "fs.sh: ERROR: $mnt: daemon for $cipher still running ${MOUNT_TIMEOUT}s after unmount: $(pgrep -af -- "$cipher" | head -3)" >&2
    return 1
}

cleanup() {
    local m
    for m in $MOUNTED; do
        log "cleanup: unmounting $m"
        fusermount3 -u "$m" 2>/dev/null || umount "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || umount -l "$m"
    done
    MOUNTED=""
    for m in $FRESH_MOUNTS; do
        if [ "$KEEP" = 1 ]; then log "kept: $m (a loop-mounted ext4; $m.img)"; else fresh_fs_off "$m"; fi
    done
    if [ "$KEEP" = 0 ]; then rm -rf "$SHM"; fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# ---------------------------------------------------------------------------------------
# Per-system setup: init_<kind> creates the cipher directory, mount_<kind> mounts it.
# D is the system's directory: D/cipher (backing), D/mnt (mount point), D/*.log.

init_plain() { :; }
mount_plain() { :; }
init_bindfs() { :; }
mount_bindfs() { bindfs "$D/cipher" "$D/mnt"; }
init_gocryptfs() { gocryptfs -init -q -extpass "echo $PW" "$D/cipher"; }
mount_gocryptfs() { gocryptfs -q -extpass "echo $PW" "$D/cipher" "$D/mnt"; }
# cryfs creates the file system on first mount (defaults: xchacha20-poly1305, 16 KiB blocks).
# Its local state (which it uses to refuse a replaced file system) goes to D, not ~/.local.
init_cryfs() { :; }
mount_cryfs() {
    echo "$PW" | XDG_DATA_HOME=$D/cryfs-local CRYFS_FRONTEND=noninteractive CRYFS_NO_UPDATE_CHECK=1 \
        cryfs "$D/cipher" "$D/mnt"
}
# encfs creates the volume on first mount (--standard: AES-192, 1 KiB blocks, no block MACs).
init_encfs() { :; }
mount_encfs() {
    if [ -e "$D/cipher/.encfs6.xml" ]; then encfs --extpass="echo $PW" "$D/cipher" "$D/mnt"
    else encfs --standard --extpass="echo $PW" "$D/cipher" "$D/mnt"; fi
}
init_securefs() { securefs create --pass "$PW" "$D/cipher"; }
mount_securefs() { securefs mount -b --pass "$PW" --log "$D/securefs.log" "$D/cipher" "$D/mnt"; }
init_intact() {
    INTACT_PASSWORD=$PW "$INTACT_BIN" --state "$D/state" init "$D/cipher" --scheme "$SCHEME" --kdf-memory 65536
}
mount_intact() {
    # shellcheck disable=SC2086
    INTACT_PASSWORD=$PW "$INTACT_BIN" --state "$D/state" mount "$D/cipher" "$D/mnt" --log "$D/intact-mount.log" ${INTACT_MOUNT_ARGS:-}
}

kind_of() { case $1 in intact-*) echo intact ;; *) echo "$1" ;; esac; }

do_mount() { # SYS
    local k rc=0 i
    k=$(kind_of "$1")
    [ "$k" = plain ] && return 0
    "mount_$k" >>"$D/mount.out" 2>&1 || rc=$?
    for ((i = 0; i < MOUNT_TIMEOUT * 10; i++)); do
        mountpoint -q "$D/mnt" && break
        sleep 0.1
    done
    if ! mountpoint -q "$D/mnt"; then
        {
            echo "fs.sh: ERROR: $1 FAILED TO MOUNT at $D/mnt (mount command exit $rc)"
            echo "--- $D/mount.out (tail):"; tail -n 20 "$D/mount.out"
            for l in "$D"/*.log; do [ -f "$l" ] && { echo "--- $l (tail):"; tail -n 20 "$l"; }; done
        } >&2
        return 1
    fi
    [ "$rc" = 0 ] || log "warning: $1: mount command exited $rc but $D/mnt is mounted"
    MOUNTED+=" $D/mnt"
}

do_umount() { # SYS
    [ "$(kind_of "$1")" = plain ] && { sync; return 0; }
    unmount_wait "$D/mnt" "$D/cipher"
}

remount() { do_umount "$1" && do_mount "$1"; }

# ---------------------------------------------------------------------------------------
# Source data, in RAM so that only the file system under test touches the disk

RAND=$SHM/rand.bin
TREE_TAR=$SHM/tree.tar
TREE_REF=$SHM/tree

prepare_sources() {
    mkdir -p "$SHM"
    local need=$((SEQ_MIB << 20))
    if [ ! -f "$RAND" ] || [ "$(stat -c %s "$RAND")" != "$need" ]; then
        log "generating $SEQ_MIB MiB of random data in $RAND"
        head -c "$need" /dev/urandom >"$RAND.tmp" && mv "$RAND.tmp" "$RAND" || die "cannot write $RAND"
    fi
    ((NFILES * FILE_KIB * 1024 <= need && (RAND_MIB << 20) <= need)) || die "random source too small"
    if [ ! -f "$TREE_TAR" ] || [ ! -f "$SHM/tree.mb" ] || [ "$(cat "$SHM/tree.mb")" != "$TREE_MB" ]; then
        log "building a ~$TREE_MB MB source tarball in $TREE_TAR"
        # Regular files of /usr/include, then of the cargo registry sources, in path order,
        # until TREE_MB MB of contents.
        {
            find /usr/include -type f -printf '%s %P\n' | LC_ALL=C sort -k2 | sed 's|^\([0-9]*\) |\1 usr/include/|'
            for r in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/; do
                [ -d "$r" ] && find "$r" -type f -printf "%s %p\n" | LC_ALL=C sort -k2 | sed 's| /| |'
            done
        } | awk -v lim=$((TREE_MB * 1000000)) '{ s += $1; sub(/^[0-9]+ /, ""); print; if (s >= lim) exit }' \
            >"$SHM/tree.list"
        rm -rf "$TREE_REF" && mkdir -p "$TREE_REF" || die "cannot create $TREE_REF"
        tar -cf "$TREE_TAR" -C / --no-recursion -T "$SHM/tree.list" 2>"$SHM/tar.err" ||
            { cat "$SHM/tar.err" >&2; die "building $TREE_TAR failed"; }
        tar -xf "$TREE_TAR" -C "$TREE_REF" --no-same-owner || die "extracting $TREE_TAR failed"
        echo "$TREE_MB" >"$SHM/tree.mb"
    fi
    TREE_BYTES=$(stat -c %s "$TREE_TAR")
    TREE_FILES=$(wc -l <"$SHM/tree.list")
}

# ---------------------------------------------------------------------------------------
# Workloads. Each sets R (the throughput) and returns non-zero on failure. W is the
# directory under test (the mount point, or D/cipher for plain).

now() { date +%s.%N; }
mb() { awk -v b="$1" 'BEGIN { print b / 1e6 }'; }
rate() { awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN { printf "%.3f", n / (b - a) }'; }
T() { timeout -k 10 "$WL_TIMEOUT" "$@"; }

wl_seq_write() {
    drop_caches
    local t0 t1
    io_begin
    t0=$(now)
    T dd if="$RAND" of="$W/seq.bin" bs=1M conv=fsync status=none || return 1
    t1=$(now)
    io_end seq_write
    R=$(rate "$(mb $((SEQ_MIB << 20)))" "$t0" "$t1")
}

wl_seq_read() {
    remount "$SYS" || return 1
    drop_caches
    local t0 t1
    t0=$(now)
    T dd if="$W/seq.bin" of=/dev/null bs=1M status=none || return 1
    t1=$(now)
    R=$(rate "$(mb $((SEQ_MIB << 20)))" "$t0" "$t1")
    T cmp "$W/seq.bin" "$RAND" || { echo "fs.sh: ERROR: $SYS: seq.bin read back differs from what was written" >&2; return 1; }
}

# The random rows (issue 15: fair to every system). Each job issues a fixed number of 4 KiB
# operations (a quarter of the file's blocks; fio's random map visits no block twice), so
# no read is served from what an earlier read cached and no write is merged with one to
# the same block. Writes end with fsync inside the timed region, once through the page
# cache (which may merge neighbours before they reach the daemon) and once with O_DIRECT
# (each write reaches the daemon as issued), on two files. Every written block carries
# fio's crc32c header: after a remount, `fio --verify_only` (untimed) checks that every
# block reads back as written. Reads run after remount + drop_caches, with
# POSIX_FADV_RANDOM (fio's default), so every one reaches the file system.
RAND_OPS() { echo $(((RAND_MIB << 20) / 4096 / 4)); }
fio_job() { # NAME FILE RW DIRECT JSON [extra fio args]
    local name=$1 file=$2 rw=$3 direct=$4 json=$5
    shift 5
    T fio --name="$name" --filename="$file" --size="${RAND_MIB}m" --bs=4k --rw="$rw" \
        --ioengine=psync --direct="$direct" --io_size=$(($(RAND_OPS) * 4096)) \
        --verify=crc32c --do_verify=0 --verify_state_save=0 --randseed=42 \
        $([ "$rw" = randwrite ] && echo --end_fsync=1) \
        --output-format=json --output="$json" "$@" >>"$D/fio.err" 2>&1
}
fio_bytes() { # JSON DIR(read|write)
    "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["jobs"][0][sys.argv[2]]["io_bytes"])' "$1" "$2"
}

# The process that serves the mount (none for plain), and its bytes written so far
# (/proc/PID/io write_bytes: what it sent toward the backing disk, page cache included).
daemon_pid() { [ "$(kind_of "$SYS")" = plain ] || pgrep -n -f -- "$D/mnt" | head -n 1; }
daemon_written() { awk '/^write_bytes:/ { print $2 }' "/proc/$1/io" 2>/dev/null; }
declare -A NO_DIRECT=()  # systems that refuse O_DIRECT
declare -A WB=()    # WB[sys,workload] = MB the daemon wrote to the backing store
io_begin() { IO_PID=$(daemon_pid); IO0=$( [ -n "$IO_PID" ] && daemon_written "$IO_PID"); }
io_end() { # WORKLOAD
    local b
    [ -n "${IO_PID:-}" ] && [ -n "${IO0:-}" ] || return 0
    b=$(daemon_written "$IO_PID") || return 0
    [ -n "$b" ] && WB[$SYS,$1]=$(mb $((b - IO0)))
}

rand_write() { # WORKLOAD FILE DIRECT
    T dd if="$RAND" of="$2" bs=1M count="$RAND_MIB" conv=fsync status=none || return 1
    drop_caches
    local t0 t1 b
    io_begin
    t0=$(now)
    if ! fio_job "$1" "$2" randwrite "$3" "$D/fio-$1.json"; then
        # A system that refuses O_DIRECT (securefs: EINVAL) gets no number for that row.
        if [ "$3" = 1 ] && tail -n 5 "$D/fio.err" | grep -q "does not support O_DIRECT"; then
            R="no O_DIRECT"; NO_DIRECT[$SYS]=1; rm -f "$2"; return 0
        fi
        tail -n 20 "$D/fio.err" >&2; return 1
    fi
    t1=$(now)
    io_end "$1"
    b=$(fio_bytes "$D/fio-$1.json" write) || return 1
    R=$(rate "$(mb "$b")" "$t0" "$t1")
}
wl_rand_write() { rand_write rand_write "$W/rand.dat" 0; }
wl_rand_write_direct() { rand_write rand_write_direct "$W/rand-direct.dat" 1; }

wl_rand_read() {
    remount "$SYS" || return 1
    drop_caches
    local t0 t1 b f
    # Untimed: every block the two write jobs wrote reads back as written.
    for f in rand_write:rand.dat rand_write_direct:rand-direct.dat; do
        [ -n "${NO_DIRECT[$SYS]:-}" ] && [ "${f%%:*}" = rand_write_direct ] && continue
        fio_job "${f%%:*}" "$W/${f#*:}" randwrite 0 "$D/fio-verify-${f%%:*}.json" --verify_only --do_verify=1 ||
            { echo "fs.sh: ERROR: $SYS: ${f#*:} does not read back as fio wrote it:" >&2; tail -n 20 "$D/fio.err" >&2; return 1; }
        b=$(fio_bytes "$D/fio-verify-${f%%:*}.json" read) || return 1
        [ "$b" = $(($(RAND_OPS) * 4096)) ] ||
            { echo "fs.sh: ERROR: $SYS: fio verified $b bytes of ${f#*:}, not $(($(RAND_OPS) * 4096))" >&2; return 1; }
    done
    remount "$SYS" || return 1
    drop_caches
    io_begin
    t0=$(now)
    fio_job rand_read "$W/rand.dat" randread 0 "$D/fio-randread.json" || { tail -n 20 "$D/fio.err" >&2; return 1; }
    t1=$(now)
    io_end rand_read
    b=$(fio_bytes "$D/fio-randread.json" read) || return 1
    R=$(rate "$(mb "$b")" "$t0" "$t1")
}

wl_create() {
    mkdir "$W/small" || return 1
    drop_caches
    local s
    io_begin
    s=$(T "$PY" "$HERE/smallfiles.py" create "$W/small" "$NFILES" $((FILE_KIB * 1024)) "$RAND" "$D/cipher") || return 1
    io_end create
    R=$(awk -v n="$NFILES" -v s="$s" 'BEGIN { printf "%.3f", n / s }')
}

wl_readback() {
    remount "$SYS" || return 1
    drop_caches
    local s
    s=$(T "$PY" "$HERE/smallfiles.py" read "$W/small" "$NFILES" $((FILE_KIB * 1024)) "$RAND") || return 1
    R=$(awk -v n="$NFILES" -v s="$s" 'BEGIN { printf "%.3f", n / s }')
}

settle() { # DIR under the mount: see "sync" in the header
    T sync -f "$1" && T sync "$1" && T sync -f "$D/cipher"
}

wl_untar() {
    mkdir "$W/tree" || return 1
    drop_caches
    local t0 t1
    io_begin
    t0=$(now)
    T tar -xf "$TREE_TAR" -C "$W/tree" --no-same-owner || return 1
    settle "$W/tree" || return 1
    t1=$(now)
    io_end untar
    R=$(rate "$(mb "$TREE_BYTES")" "$t0" "$t1")
}

wl_tar() {
    remount "$SYS" || return 1
    drop_caches
    local t0 t1 n
    t0=$(now)
    n=$(T tar -cf - -C "$W" tree | wc -c) || return 1
    t1=$(now)
    R=$(rate "$(mb "$n")" "$t0" "$t1")
    T diff -r "$TREE_REF" "$W/tree" >"$D/tree.diff" 2>&1 ||
        { echo "fs.sh: ERROR: $SYS: the untarred tree differs from the original:" >&2; head -n 10 "$D/tree.diff" >&2; return 1; }
}

# Untimed: remove everything through the mount, sync, and (intact) look for errors in the
# mount log — integrity failures, EIO — over the whole run.
post_check() {
    if [ "$(kind_of "$1")" != plain ] && ! mountpoint -q "$D/mnt"; then return 0; fi
    if ! T rm -rf "${W:?}"/seq.bin "$W"/rand.dat "$W"/rand-direct.dat "$W"/small "$W"/tree || ! T sync -f "$W"; then
        echo "fs.sh: ERROR: $1: removing the files through the mount, or syncing after it, failed" >&2
        NOTES+="$1: rm -rf + sync -f through the mount failed."$'\n'
        FAILED=1
    fi
}
check_log() { # after the unmount
    local e l=$D/intact-mount.log
    [ "$(kind_of "$1")" = intact ] && [ -f "$l" ] || return 0
    e=$(grep -c ' ERROR ' "$l")
    [ "$e" = 0 ] && return 0
    echo "fs.sh: ERROR: $1: $e ERROR lines in $l; the first ones:" >&2
    grep -m 4 ' ERROR ' "$l" | cut -c1-300 >&2
    NOTES+="$1: $e ERROR lines in the mount log, e.g. \`$(grep -m 1 ' ERROR ' "$l" | sed 's/^[^ ]* *//' | cut -c1-200)\`."$'\n'
    FAILED=1
}
NOTES=""

WORKLOADS="seq_write seq_read rand_write rand_write_direct rand_read create readback untar tar"
declare -A HEAD=(
    [seq_write]="seq write MB/s" [seq_read]="seq read MB/s" [rand_write]="rand 4K write MB/s"
    [rand_write_direct]="rand 4K write O_DIRECT MB/s" [rand_read]="rand 4K read, cold MB/s" [create]="create files/s" [readback]="read back files/s"
    [untar]="tar -x MB/s" [tar]="tar -c MB/s"
)
declare -A RES=()   # RES[sys,workload] = number or an error word
declare -A LOAD=()  # 1-minute load average when the system's run started

run_system() {
    SYS=$1
    local k wl
    k=$(kind_of "$SYS")
    SCHEME=${SYS#intact-}
    D=$BASE/$SYS
    if [ -d "$D/mnt" ] && mountpoint -q "$D/mnt"; then unmount_wait "$D/mnt" "$D/cipher" || return 1; fi
    fresh_fs_off "$D"
    rm -rf "$D" && mkdir -p "$D" || die "cannot create $D"
    [ "$FRESH_FS" = 1 ] && { fresh_fs_on "$D" || die "cannot make a fresh ext4 at $D"; }
    mkdir -p "$D/cipher" "$D/mnt" || die "cannot create $D"
    if [ "$k" = plain ]; then W=$D/cipher; else W=$D/mnt; fi
    LOAD[$SYS]=$(cut -d' ' -f1 /proc/loadavg)
    log "== $SYS (load ${LOAD[$SYS]})"
    if ! "init_$k" >>"$D/mount.out" 2>&1; then
        echo "fs.sh: ERROR: $SYS: creating the volume failed:" >&2; tail -n 20 "$D/mount.out" >&2
        for wl in $WORKLOADS; do RES[$SYS,$wl]="INIT FAILED"; done
        FAILED=1; return 1
    fi
    if ! do_mount "$SYS"; then
        for wl in $WORKLOADS; do RES[$SYS,$wl]="MOUNT FAILED"; done
        FAILED=1; return 1
    fi
    local broken=""
    for wl in $WORKLOADS; do
        if [ -n "$broken" ]; then RES[$SYS,$wl]="—"; continue; fi
        R=""
        if "wl_$wl"; then
            RES[$SYS,$wl]=$R
            log "   $SYS ${HEAD[$wl]}: $R"
        else
            local rc=$?
            FAILED=1
            echo "fs.sh: ERROR: $SYS: workload $wl failed (exit $rc; logs in $D)" >&2
            RES[$SYS,$wl]="FAIL"
            # A failed (re)mount or a hung workload leaves the system unusable: skip the rest.
            if [ "$(kind_of "$SYS")" != plain ] && ! mountpoint -q "$D/mnt"; then broken="unmounted"
            elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then broken="timeout"; RES[$SYS,$wl]="TIMEOUT"; fi
        fi
    done
    post_check "$SYS"
    do_umount "$SYS" || FAILED=1
    check_log "$SYS"
    if [ "$KEEP" = 0 ] && ! mountpoint -q "$D/mnt"; then
        rm -rf "$D/cipher"
        if [ "$FRESH_FS" = 1 ]; then # keep the logs: the file system they are on goes away
            mkdir -p "$BASE/$SYS.logs" && find "$D" -maxdepth 1 -type f -exec cp {} "$BASE/$SYS.logs/" \;
            fresh_fs_off "$D"
        fi
    fi
}

# A fresh ext4 for one system (BENCH_FRESH_FS): an image file beside DIR, on a loop device
# with direct I/O (the host's page cache holds no second copy), mounted at DIR.
fresh_fs_on() { # DIR
    local img=$1.img dev
    rm -f "$img" && truncate -s "${BENCH_FS_GIB:-16}G" "$img" &&
        mkfs.ext4 -q -F "$img" &&
        dev=$(losetup --direct-io=on -f --show "$img") &&
        mount "$dev" "$1" && FRESH_MOUNTS+=" $1"
}
fresh_fs_off() { # DIR: unmount and detach DIR's fresh ext4, if it has one; remove the image
    local dev
    if mountpoint -q "$1" 2>/dev/null; then
        dev=$(findmnt -n -o SOURCE --target "$1")
        umount "$1" && { [[ $dev != /dev/loop* ]] || losetup -d "$dev"; }
    fi
    FRESH_MOUNTS=${FRESH_MOUNTS//" $1"/}
    rm -f "$1.img"
}

# ---------------------------------------------------------------------------------------

fmt() { # number -> rounded, or the error word as is
    if [[ "$1" =~ ^[0-9.]+$ ]]; then awk -v x="$1" 'BEGIN { if (x >= 100) printf "%.0f", x; else printf "%.1f", x }'
    else printf '%s' "$1"; fi
}
ratio() { # a b -> a/b, or nothing
    [[ "$1" =~ ^[0-9.]+$ && "${2:-}" =~ ^[0-9.]+$ ]] || return 0
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b }'
}

table() {
    local h="| system | load |" sep="|---|---|" s wl v cell g b
    for wl in $WORKLOADS; do h+=" ${HEAD[$wl]} |"; sep+="---|"; done
    echo "$h"; echo "$sep"
    for s in $SYSTEMS; do
        local row="| $s | ${LOAD[$s]:-} |"
        for wl in $WORKLOADS; do
            v=${RES[$s,$wl]:-}
            cell=$(fmt "$v")
            if [[ $s == intact-* ]]; then
                g=$(ratio "$v" "${RES[gocryptfs,$wl]:-}"); b=$(ratio "$v" "${RES[bindfs,$wl]:-}")
                if [ -n "$g$b" ]; then
                    cell+=" (${g:+${g}× gc}${g:+${b:+, }}${b:+${b}× bf})"
                fi
            fi
            row+=" $cell |"
        done
        echo "$row"
    done
}

# MB that each daemon wrote toward the backing disk during each writing workload.
written_table() {
    local wls="seq_write rand_write rand_write_direct create untar" h="| system |" sep="|---|" s wl
    declare -A name=([seq_write]="seq write" [rand_write]="rand 4K write" [rand_write_direct]="rand 4K write O_DIRECT" [create]="create" [untar]="tar -x")
    for wl in $wls; do h+=" ${name[$wl]} |"; sep+="---|"; done
    echo "$h"; echo "$sep"
    for s in $SYSTEMS; do
        local row="| $s |"
        for wl in $wls; do row+=" $(fmt "${WB[$s,$wl]:-—}") |"; done
        echo "$row"
    done
}

header() {
    local rev
    rev=$(git -C "$HERE/.." rev-parse --short HEAD 2>/dev/null || echo "?")
    git -C "$HERE/.." diff --quiet HEAD -- crates Cargo.toml Cargo.lock 2>/dev/null || rev+=" + uncommitted changes"
    local backing
    backing="backing dir $BASE ($(df -T "$BASE" | awk 'NR==2 {print $2}'))"
    [ "$FRESH_FS" = 1 ] && backing="each system on a fresh ext4 (mkfs.ext4 defaults, journal) on a loop device (direct I/O) over a file in $BASE ($(df -T "$BASE" | awk 'NR==2 {print $2}'))"
    echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -r), $(nproc) cores, $backing."
    echo "Sizes: seq ${SEQ_MIB} MiB; random: $(RAND_OPS) operations of 4 KiB over ${RAND_MIB} MiB per job; ${NFILES} x ${FILE_KIB} KiB files;"
    echo "tar of $TREE_FILES files, $(awk -v b="$TREE_BYTES" 'BEGIN{printf "%.1f", b/1e6}') MB. MB = 10^6 bytes."
    [ "$NEED_INTACT" = 1 ] && echo "intact: $INTACT_BIN (built $(date -u -r "$INTACT_BIN" '+%Y-%m-%d %H:%M UTC'), repo at $rev), schemes: $INTACT_SCHEMES; mount args: ${INTACT_MOUNT_ARGS:-defaults}."
    echo "load = 1-minute load average when the system's run started. intact rows: (ratio to gocryptfs, to bindfs)."
}

prepare_sources
mkdir -p "$BASE" || die "cannot create $BASE"
case $(df -T "$BASE" | awk 'NR==2 {print $2}') in
tmpfs | ramfs)
    [ "${BENCH_TMPFS:-0}" = 1 ] || die "$BASE is on tmpfs; set BENCH_DIR to a real disk (or BENCH_TMPFS=1 for a run on RAM backing)"
    FRESH_FS=${BENCH_FRESH_FS:-0} ;;
*) FRESH_FS=${BENCH_FRESH_FS:-1} ;;
esac
if [ "$FRESH_FS" = 1 ]; then
    command -v mkfs.ext4 >/dev/null && command -v losetup >/dev/null ||
        die "BENCH_FRESH_FS=1 needs mkfs.ext4 and losetup (e2fsprogs, mount); or set BENCH_FRESH_FS=0"
fi
log "systems: $SYSTEMS"
for s in $SYSTEMS; do run_system "$s"; done

REPORT=$(header; echo; table; echo
    echo "MB the daemon wrote toward the backing disk (/proc/PID/io write_bytes) during each writing workload"
    echo "(data written: seq $(mb $((SEQ_MIB << 20))) MB, random $(mb $(($(RAND_OPS) * 4096))) MB each, create $(mb $((NFILES * FILE_KIB * 1024))) MB, tar $(mb "$TREE_BYTES") MB):"
    echo; written_table; [ -z "$NOTES" ] || { echo; echo "Errors seen:"; printf '%s' "$NOTES" | sed 's/^/* /'; })
echo
echo "$REPORT"
if [ -n "$OUT" ]; then echo "$REPORT" >"$OUT"; log "table written to $OUT"; fi
if [ "$FAILED" != 0 ]; then
    echo "fs.sh: ERROR: some systems failed (see the messages above and $BASE/<system>/)" >&2
    exit 1
fi

#!/usr/bin/env bash
# Many small files (issue 18): N files of 1 KiB in N/1000 directories through the mount,
# gocryptfs beside intact in the same run. Per system and N it prints:
#   create      creating the N files and unmounting (durable: intact seals at unmount)
#   +1 fsync    one more create + write + fsync + close, median of 20 (on a mount of N files)
#   RSS         the daemon's resident memory after the cold listing and cold read below
#   ls -lR      cold (caches dropped, fresh mount) `ls -lR` of the whole tree
#   read all    cold read of every file, checked against what was written
#   allocated / apparent   the backing directory's bytes (du)
#   fsck, fsck RSS         `intact fsck` / `gocryptfs -fsck`: time and peak RSS
#
#   bench/scale.sh [N...]        (default: 10000 100000; 1000000 is the long mode, about
#                                 45 minutes for both systems on this machine)
#
#   bench/scale.sh dir [N]       one directory grown to N entries (default 1000000) through
#                                the mount. At every power of ten from 1,000, three samples
#                                each of OPS (default 1000) operations, per operation:
#     create    a new empty file (open O_CREAT|O_EXCL, close), the sample ended by an fsync
#               of the directory (durable)
#     lookup    a stat of a random existing name, the kernel's dentries and inodes dropped
#               first (echo 2 > drop_caches, then 2 s for the FORGETs this sends the
#               daemon: every stat reaches the daemon, the backing store's pages stay
#               cached, as in a directory in use)
#     unlink    of a random existing name (looked up before the timed region, as the name
#               of a file in use is), the sample ended by an fsync of the directory
#   and the ratio of each to the 1,000 row (worst over best, best over worst). Then the
#   daemon's RSS and the backing directory's allocated bytes.
# Environment: BENCH_DIR (default /var/tmp/intact-scale, on a real disk), INTACT_BIN,
# INTACT_SCHEME (default mt-eint), INTACT_ARGS (global options of intact's mount, e.g.
# "--meta-cache-bytes 536870912"), ONLY (e.g. ONLY=intact). Needs root (FUSE,
# drop_caches), fusermount3, python3, GNU time, and gocryptfs.
set -euo pipefail

MODE=files
if [ "${1:-}" = dir ]; then MODE=dir; shift; fi
SIZES=("$@")
if [ $MODE = dir ]; then
    [ ${#SIZES[@]} -gt 0 ] || SIZES=(1000000)
elif [ ${#SIZES[@]} -eq 0 ]; then
    SIZES=(10000 100000)
fi
OPS=${OPS:-1000}
BENCH_DIR=${BENCH_DIR:-/var/tmp/intact-scale}
INTACT_BIN=${INTACT_BIN:-/work/target-rel/release/intact}
[ -x "$INTACT_BIN" ] || INTACT_BIN=$(command -v intact || true)
INTACT_SCHEME=${INTACT_SCHEME:-mt-eint}
INTACT_ARGS=${INTACT_ARGS:-}
SYSTEMS=${ONLY:-gocryptfs intact}
SYSTEMS=${SYSTEMS//,/ }
PW=intact-bench-password
SIZE=1024
PER=1000

die() { echo "scale: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (FUSE mounts, drop_caches)"
for t in fusermount3 mountpoint python3 /usr/bin/time; do
    command -v $t >/dev/null || die "missing $t"
done
case " $SYSTEMS " in *" gocryptfs "*) command -v gocryptfs >/dev/null || die "missing gocryptfs" ;; esac
[ -n "$INTACT_BIN" ] || die "no intact binary: build one or set INTACT_BIN"

MOUNTED=""
cleanup() {
    local m
    for m in $MOUNTED; do fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || true; done
}
trap cleanup EXIT

do_mount() { # SYS DIR
    local s=$1 d=$2 i
    case $s in
        gocryptfs) gocryptfs -q -extpass "echo $PW" "$d/cipher" "$d/mnt" 2>/dev/null ;;
        intact) INTACT_PASSWORD=$PW "$INTACT_BIN" --state "$d/state" $INTACT_ARGS mount "$d/cipher" "$d/mnt" \
                    --log "$d/mount.log" >"$d/mount.out" 2>&1 || { cat "$d/mount.out" >&2; die "intact mount failed"; } ;;
    esac
    for ((i = 0; i < 300; i++)); do mountpoint -q "$d/mnt" && break; sleep 0.1; done
    mountpoint -q "$d/mnt" || die "$s did not mount"
    MOUNTED+=" $d/mnt"
}
do_umount() { # SYS DIR
    local s=$1 d=$2 i
    fusermount3 -u "$d/mnt" || { sleep 1; fusermount3 -u "$d/mnt"; }
    for ((i = 0; i < 6000; i++)); do pgrep -f -- "$d/cipher" >/dev/null || break; sleep 0.1; done
    pgrep -f -- "$d/cipher" >/dev/null && die "$s: daemon still running after unmount"
    MOUNTED=${MOUNTED//" $d/mnt"/}
}
new_volume() { # SYS DIR: an empty volume in DIR/cipher, and DIR/mnt
    local s=$1 d=$2
    rm -rf "$d"; mkdir -p "$d/cipher" "$d/mnt"
    case $s in
        gocryptfs) gocryptfs -init -q -extpass "echo $PW" "$d/cipher" 2>/dev/null ;;
        intact) INTACT_PASSWORD=$PW "$INTACT_BIN" --state "$d/state" init "$d/cipher" \
                    --scheme "$INTACT_SCHEME" --kdf-memory 65536 >/dev/null ;;
    esac
}
check_log() { # SYS DIR: no integrity failure or error in intact's mount log
    if [ "$1" = intact ] && grep -qiE "integrity failure|ERROR" "$2/mount.log"; then
        die "intact: errors in its mount log: $(grep -iE 'integrity failure|ERROR' "$2/mount.log" | head -3)"
    fi
}
daemon_rss_kib() { # DIR
    local pid
    pid=$(pgrep -f -- "$1/cipher" | head -1)
    awk '/^VmRSS/ { print $2 }' "/proc/$pid/status"
}
now() { date +%s.%N; }
secs() { printf '%.2f' "$(echo "$2 - $1" | bc)"; }

# The workloads, in Python (one process each: process start-up must not dominate).
PY=$BENCH_DIR/scale.py
mkdir -p "$BENCH_DIR"
cat >"$PY" <<'EOF'
import os, sys, time, statistics
op, root, n, size, per, src = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
def content(k):
    with open(src, "rb") as f:
        f.seek(k * size)
        return f.read(size)
def path(k):
    return os.path.join(root, "d%d" % (k // per), "f%07d" % k)
if op == "create":
    with open(src, "rb") as f:
        data = f.read(n * size)
    for d in range((n + per - 1) // per):
        os.mkdir(os.path.join(root, "d%d" % d))
    for k in range(n):
        fd = os.open(path(k), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, data[k * size:(k + 1) * size])
        os.close(fd)
elif op == "fsync":
    times = []
    for i in range(20):
        p = os.path.join(root, "d0", "extra%02d" % i)
        t0 = time.monotonic()
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"x" * size)
        os.fsync(fd)
        os.close(fd)
        times.append(time.monotonic() - t0)
    print("%.2f" % (statistics.median(times) * 1000))
elif op == "read":
    with open(src, "rb") as f:
        data = f.read(n * size)
    for k in range(n):
        with open(path(k), "rb") as f:
            if f.read() != data[k * size:(k + 1) * size]:
                sys.exit("scale: %s differs from what was written" % path(k))
EOF

if [ $MODE = dir ]; then
    DPY=$BENCH_DIR/scale_dir.py
    cat >"$DPY" <<'EOF'
import os, random, sys, time
root, target, ops, system = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
d = os.path.join(root, "d")
os.mkdir(d)
rng = random.Random(42)
live = []            # numbers of the names present
nxt = 0              # the next name's number
def name(i):
    return os.path.join(d, "entry-%010d" % i)
def fsync_dir():
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
def create(k):
    global nxt
    for _ in range(k):
        os.close(os.open(name(nxt), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        live.append(nxt)
        nxt += 1
def pick(k):
    return rng.sample(range(len(live)), k)
def drop_dentries():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")
    # The kernel's FORGETs for what it dropped reach the daemon now: not in the timing.
    time.sleep(2)
def us(t0, t1):
    return (t1 - t0) * 1e6 / ops
rows = []
n = 1000
while n <= target:
    create(n - len(live))
    fsync_dir()
    drop_dentries()
    c, l, u = [], [], []
    for _ in range(3):
        t0 = time.monotonic(); create(ops); fsync_dir(); c.append(us(t0, time.monotonic()))
        victims = [name(live[p]) for p in pick(ops)]
        drop_dentries()
        t0 = time.monotonic()
        for v in victims:
            os.stat(v)
        l.append(us(t0, time.monotonic()))
        pos = sorted(pick(ops), reverse=True)
        victims = [name(live[p]) for p in pos]
        for v in victims:
            os.stat(v)
        t0 = time.monotonic()
        for v in victims:
            os.unlink(v)
        fsync_dir()
        u.append(us(t0, time.monotonic()))
        for p in pos:
            live[p] = live[-1]
            live.pop()
    rows.append((n, c, l, u))
    print("%s: %d entries done" % (system, n), file=sys.stderr, flush=True)
    n *= 10
def show(v):
    return "%.1f-%.1f" % (min(v), max(v))
def ratio(v, b):
    return "%.2f-%.2f" % (min(v) / max(b), max(v) / min(b))
b = rows[0]
for n, c, l, u in rows:
    print("%-10s %9d %13s %13s %13s %11s %11s %11s" % (system, n, show(c), show(l), show(u),
          ratio(c, b[1]), ratio(l, b[2]), ratio(u, b[3])), flush=True)
EOF
    printf '%-10s %9s %13s %13s %13s %11s %11s %11s\n' system entries "create us/op" "lookup us/op" "unlink us/op" "create/10^3" "lookup/10^3" "unlink/10^3"
    for s in $SYSTEMS; do
        d=$BENCH_DIR/$s
        new_volume "$s" "$d"
        do_mount "$s" "$d"
        t0=$(now)
        python3 "$DPY" "$d/mnt" "${SIZES[0]}" "$OPS" "$s"
        rss=$(( $(daemon_rss_kib "$d") / 1024 ))
        do_umount "$s" "$d"
        check_log "$s" "$d"
        echo "$s: whole run $(secs "$t0" "$(now)") s, daemon RSS at the end $rss MB, store $(du -s -B1 "$d/cipher" | cut -f1) bytes allocated"
        rm -rf "$d"
    done
    [ -n "${KEEP:-}" ] || rm -rf "$BENCH_DIR"
    exit 0
fi

printf '%-10s %9s %9s %9s %9s %9s %9s %14s %14s %9s %9s\n' system N create "+1 fsync" RSS "ls -lR" "read all" allocated apparent fsck "fsck RSS"
printf '%-10s %9s %9s %9s %9s %9s %9s %14s %14s %9s %9s\n' "" files s ms MB s s bytes bytes s MB
for n in "${SIZES[@]}"; do
    SRC=$BENCH_DIR/src.bin
    head -c $((n * SIZE)) /dev/urandom >"$SRC"
    for s in $SYSTEMS; do
        d=$BENCH_DIR/$s
        new_volume "$s" "$d"
        do_mount "$s" "$d"
        t0=$(now)
        python3 "$PY" create "$d/mnt" "$n" $SIZE $PER "$SRC"
        do_umount "$s" "$d"
        sync
        create=$(secs "$t0" "$(now)")
        do_mount "$s" "$d"
        fsync_ms=$(python3 "$PY" fsync "$d/mnt" "$n" $SIZE $PER "$SRC")
        do_umount "$s" "$d"
        sync; echo 3 >/proc/sys/vm/drop_caches
        do_mount "$s" "$d"
        t0=$(now)
        ls -lR "$d/mnt" >/dev/null
        lsr=$(secs "$t0" "$(now)")
        do_umount "$s" "$d"
        sync; echo 3 >/proc/sys/vm/drop_caches
        do_mount "$s" "$d"
        t0=$(now)
        python3 "$PY" read "$d/mnt" "$n" $SIZE $PER "$SRC"
        readall=$(secs "$t0" "$(now)")
        rss=$(( $(daemon_rss_kib "$d") / 1024 ))
        do_umount "$s" "$d"
        alloc=$(du -s -B1 "$d/cipher" | cut -f1)
        app=$(du -s -b --apparent-size "$d/cipher" | cut -f1)
        check_log "$s" "$d"
        sync; echo 3 >/proc/sys/vm/drop_caches
        t0=$(now)
        case $s in
            gocryptfs) /usr/bin/time -f %M -o "$d/fsck.rss" gocryptfs -fsck -q -extpass "echo $PW" "$d/cipher" >/dev/null 2>&1 \
                           || die "gocryptfs -fsck failed" ;;
            intact) INTACT_PASSWORD=$PW /usr/bin/time -f %M -o "$d/fsck.rss" "$INTACT_BIN" --state "$d/state" \
                        --volume "$d/cipher" fsck >"$d/fsck.out" 2>&1 || { cat "$d/fsck.out" >&2; die "intact fsck failed"; } ;;
        esac
        fsck=$(secs "$t0" "$(now)")
        fsck_rss=$(( $(tail -1 "$d/fsck.rss") / 1024 ))
        printf '%-10s %9s %9s %9s %9s %9s %9s %14s %14s %9s %9s\n' "$s" "$n" "$create" "$fsync_ms" "$rss" "$lsr" "$readall" "$alloc" "$app" "$fsck" "$fsck_rss"
        rm -rf "$d"
    done
done
[ -n "${KEEP:-}" ] || rm -rf "$BENCH_DIR"

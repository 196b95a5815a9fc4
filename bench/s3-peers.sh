#!/usr/bin/env bash
# bench/s3-peers.sh — intact's mount of an S3 bucket beside the tools people use for this
# today, on the same Garage server in the same run (issue 9):
#
#   bench/s3-peers.sh [SEQ_MIB (512)] [FILES (2000)] [RUNS (3)] [DELAYS_MS ("0 50")]
#
# Systems, each mounted through FUSE on a fresh prefix of one bucket:
#   intact  `intact mount s3://...` (mt-eint: encryption, integrity, freshness), the default
#           options; a timed write ends with `intact sync MNT` (sealed: durable and
#           rollback-protected);
#   rclone  `rclone mount` of a crypt remote over the bucket (encryption and per-file
#           authentication, no freshness), `--vfs-cache-mode off` so that close(2) returns
#           once the object is uploaded (with a write cache, close returns before);
#   s3fs    `s3fs` (no encryption, no integrity); close(2) uploads.
# Workloads: a sequential write of one SEQ_MIB file (cp), then its read (cmp against the
# source), and FILES small files (1 to 16 KiB, cp -r) created, then read back (diff -r). Every
# read follows a remount and a drop of the page cache, so it comes from the bucket.
# Latency: each DELAYS_MS value other than 0 runs every system through bench/delay_proxy.py,
# which adds that many milliseconds to each request (the machine's kernel has no netem). With
# a delay, the small-file rows use SMALL_DELAYED files (default FILES / 4): a peer that sends
# each file alone pays the round trips one after another.
# Prints each run, then per delay the range over the runs and the ratios to rclone crypt.
# Needs root (FUSE, drop_caches), a release build of intact (INTACT_BIN, default
# target/release/intact), garage (cargo install), rclone, s3fs and fuse3 (apt).
set -euo pipefail
SEQ=${1:-512}
FILES=${2:-2000}
RUNS=${3:-3}
DELAYS=${4:-"0 50"}
SMALL_DELAYED=${SMALL_DELAYED:-$((FILES / 4))}
SYSTEMS=${SYSTEMS:-"intact rclone s3fs"}
cd "$(dirname "$0")/.."
I=${INTACT_BIN:-target/release/intact}
I=$(readlink -f "$I")
for t in garage rclone s3fs openssl fusermount3 python3 rsync; do
  command -v $t >/dev/null || { echo "bench/s3-peers.sh needs $t" >&2; exit 1; }
done
W=$(mktemp -d /var/tmp/intact-s3peers.XXXXXX)
MNT=$W/mnt
mkdir -p "$MNT"
G=""
P=""
cleanup() {
  fusermount3 -uz "$MNT" 2>/dev/null || true
  [ -n "$P" ] && kill "$P" 2>/dev/null
  [ -n "$G" ] && kill "$G" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
. bench/garage.sh
export INTACT_PASSWORD=bench
echo "$KEY:$SECRET" > "$W/passwd"
chmod 600 "$W/passwd"
export RCLONE_CONFIG_C_TYPE=crypt RCLONE_CONFIG_C_PASSWORD=$(rclone obscure bench) \
  RCLONE_CONFIG_C_PASSWORD2=$(rclone obscure bench-salt) \
  RCLONE_CONFIG_P_TYPE=s3 RCLONE_CONFIG_P_PROVIDER=Other RCLONE_CONFIG_P_REGION=garage \
  RCLONE_CONFIG_P_ACCESS_KEY_ID=$KEY RCLONE_CONFIG_P_SECRET_ACCESS_KEY=$SECRET

head -c $((SEQ << 20)) /dev/urandom > "$W/big"
python3 - "$W/small" "$FILES" <<'EOF'
import os, random, sys
d, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(9)
for i in range(n):
    sub = os.path.join(d, f"d{i // 100:02}")
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, f"f{i:05}"), "wb") as f:
        f.write(os.urandom(rng.randint(1024, 16384)))
EOF

now() { date +%s.%N; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
mounted() { grep -q " $MNT " /proc/mounts; }
wait_mounted() {
  for _ in $(seq 300); do mounted && return 0; sleep 0.1; done
  echo "$1 did not mount" >&2
  return 1
}

# mount SYS TAG PORT: mounts a fresh or existing prefix TAG of SYS at $MNT through PORT.
mount_sys() {
  local sys=$1 tag=$2 port=$3
  case $sys in
    intact)
      local url="s3://bench/intact-$tag?endpoint=http://127.0.0.1:$port&region=garage"
      if [ ! -d "$W/state-$tag" ]; then
        "$I" --state "$W/state-$tag" init "$url" --kdf-memory 1024 --kdf-passes 1 >/dev/null
      fi
      "$I" --state "$W/state-$tag" mount "$url" "$MNT" --log "$W/intact-$tag.log" 2>/dev/null
      ;;
    rclone)
      RCLONE_CONFIG_P_ENDPOINT=http://127.0.0.1:$port RCLONE_CONFIG_C_REMOTE="P:bench/rclone-$tag" \
        rclone mount C: "$MNT" --vfs-cache-mode off --daemon --log-file "$W/rclone-$tag.log"
      ;;
    s3fs)
      s3fs "bench:/s3fs-$tag" "$MNT" -o "url=http://127.0.0.1:$port,use_path_request_style" \
        -o "passwd_file=$W/passwd,endpoint=garage,logfile=$W/s3fs-$tag.log"
      ;;
  esac
  wait_mounted "$sys"
}

# The end of a timed write: intact seals (durable); the peers' close(2) already uploaded.
settle() {
  if [ "$1" = intact ]; then "$I" sync "$MNT" >/dev/null; fi
}

unmount_sys() {
  if [ "$1" = intact ]; then "$I" --state "$W/state-$2" umount "$MNT" >/dev/null
  else fusermount3 -u "$MNT"; fi
  for _ in $(seq 300); do mounted || return 0; sleep 0.1; done
  echo "$1 did not unmount" >&2
  return 1
}

: > "$W/results"
for delay in $DELAYS; do
  port=$S3
  files=$FILES
  if [ "$delay" != 0 ]; then
    port=$(port)
    python3 bench/delay_proxy.py "$port" "$S3" "$delay" > "$W/proxy.out" 2>&1 &
    P=$!
    for _ in $(seq 100); do grep -q ready "$W/proxy.out" 2>/dev/null && break; sleep 0.1; done
    files=$SMALL_DELAYED
  fi
  rm -rf "$W/src-small"
  mkdir "$W/src-small"
  # The first $files of the small files, whole directories of 100 and the rest.
  # awk reads all its input (head would end the pipe early: SIGPIPE under pipefail)
  (cd "$W/small" && find . -type f | sort | awk -v n="$files" 'NR <= n') > "$W/list"
  rsync -a --files-from="$W/list" "$W/small/" "$W/src-small/"
  for run in $(seq "$RUNS"); do
    for sys in $SYSTEMS; do
      tag=$delay-$run-$sys
      mount_sys "$sys" "$tag" "$port"
      drop
      t0=$(now); cp "$W/big" "$MNT/big"; settle "$sys"; t1=$(now)
      t2=$(now); cp -r "$W/src-small" "$MNT/small"; settle "$sys"; t3=$(now)
      unmount_sys "$sys" "$tag"
      mount_sys "$sys" "$tag" "$port"
      drop
      t4=$(now); cmp "$W/big" "$MNT/big"; t5=$(now)
      t6=$(now); diff -r "$W/src-small" "$MNT/small"; t7=$(now)
      unmount_sys "$sys" "$tag"
      echo "$delay $sys $run $files $t0 $t1 $t2 $t3 $t4 $t5 $t6 $t7" | tee -a "$W/results"
    done
  done
  if [ -n "$P" ]; then kill "$P"; wait "$P" 2>/dev/null || true; P=""; fi
done

python3 - "$SEQ" "$W/results" <<'EOF'
import sys
seq = int(sys.argv[1])
rows = {}
for line in open(sys.argv[2]):
    d, s, run, files, *t = line.split()
    t = [float(x) for x in t]
    r = (seq / (t[1] - t[0]), int(files) / (t[3] - t[2]), seq / (t[5] - t[4]), int(files) / (t[7] - t[6]))
    rows.setdefault(int(d), {}).setdefault(s, []).append((r, int(files)))
names = {"intact": "intact mount (mt-eint, sealed)", "rclone": "rclone mount, crypt remote",
         "s3fs": "s3fs (no encryption)"}
cols = ["seq write MiB/s", "small create files/s", "seq read MiB/s", "small read files/s"]
for d in sorted(rows):
    files = next(iter(rows[d].values()))[0][1]
    print(f"\n### {'no added latency' if d == 0 else f'{d} ms added to each request'}"
          f" ({seq} MiB; {files} files of 1-16 KiB; {len(next(iter(rows[d].values())))} runs; range over runs)\n")
    print("| system | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for s in ("intact", "rclone", "s3fs"):
        if s not in rows[d]:
            continue
        cells = []
        for k in range(4):
            v = [r[0][k] for r in rows[d][s]]
            cell = f"{min(v):.1f}–{max(v):.1f}"
            if s != "rclone" and "rclone" in rows[d]:
                b = [r[0][k] for r in rows[d]["rclone"]]
                cell += f" ({min(v) / max(b):.2f}–{max(v) / min(b):.2f}×)"
            cells.append(cell)
        print(f"| {names[s]} | " + " | ".join(cells) + " |")
print("\n(×: worst over best and best over worst against rclone crypt, same delay)")
EOF

#!/usr/bin/env bash
# The long fsx run (CI runs 100,000 + 10,000 operations per scheme through
# `cargo test --test fuse fsx_every_scheme`): N operations per scheme (default 1,000,000)
# with the page cache flushing, then N/10 with msync/fsync sealing, each on a fresh mount,
# then fsck. Release build. Usage: scripts/fsx.sh [N] [SCHEME...]
set -euo pipefail
cd "$(dirname "$0")/.."
ops=${1:-1000000}; shift || true
schemes=("$@")
[ ${#schemes[@]} -gt 0 ] || schemes=(aead mt-eint mt-eint-cbc none mac-tree rand-eint comp-eint comp-eint-zstd)
command -v fsx >/dev/null || cargo install --locked fsx --version "=0.3.2"
command -v fusermount3 >/dev/null || { echo "install fuse3"; exit 1; }
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} cargo build --release -p intact
bin=${CARGO_TARGET_DIR:-$PWD/target}/release/intact
work=$(mktemp -d /var/tmp/intact-fsx.XXXXXX)
trap 'fusermount3 -u "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
export INTACT_PASSWORD=fsx
cat > "$work/plain.toml" <<CFG
flen = 1048576
nomsyncafterwrite = true
[opsize]
max = 65536
[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 2
posix_fallocate = 1
CFG
sed -e 's/nomsyncafterwrite = true/nomsyncafterwrite = false/' "$work/plain.toml" > "$work/seal.toml"
printf 'fsync = 1\nfdatasync = 1\n' >> "$work/seal.toml"
for s in "${schemes[@]}"; do
  rm -rf "$work/c" "$work/s"; mkdir -p "$work/mnt"
  "$bin" --state "$work/s" init "$work/c" --scheme "$s" --kdf-memory 1024 --kdf-passes 1 >/dev/null
  "$bin" --state "$work/s" mount "$work/c" "$work/mnt" 2>/dev/null
  start=$(date +%s)
  (cd "$work/mnt" && fsx -f "$work/plain.toml" -N "$ops" -S 1 -P "$work" fsx.a | tail -1)
  (cd "$work/mnt" && fsx -f "$work/seal.toml" -N $((ops / 10)) -S 2 -P "$work" fsx.b | tail -1)
  fusermount3 -u "$work/mnt"; sleep 1
  "$bin" --state "$work/s" --volume "$work/c" fsck >/dev/null
  echo "$s: $ops + $((ops / 10)) operations OK, fsck clean ($(( $(date +%s) - start )) s)"
done

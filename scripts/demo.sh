#!/usr/bin/env bash
# The main job on the embedded default (a local directory): build intact, create a volume,
# store files, read them back, check every block, and show a tampering being caught.
# Usage: scripts/demo.sh [WORKDIR]   (default: ./demo; INTACT_PASSWORD defaults to "demo")
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-demo}
# etcd's client (the anchor in etcd) is generated from its protocol files at build time.
if ! command -v protoc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq protobuf-compiler >/dev/null || { apt-get update -qq && apt-get install -y -qq protobuf-compiler >/dev/null; }
  else
    echo "protoc is missing: install protobuf-compiler (apt-get install protobuf-compiler)"; exit 1
  fi
fi
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target} cargo build --release -p intact
bin=${CARGO_TARGET_DIR:-$PWD/target}/release/intact
export INTACT_PASSWORD=${INTACT_PASSWORD:-demo}
export INTACT_VOLUME=$work/cipher INTACT_STATE=$work/state
rm -rf "$work" && mkdir -p "$work"

echo "== init a volume in $INTACT_VOLUME (anchor in $INTACT_STATE)"
"$bin" init "$INTACT_VOLUME"
echo "== put files"
"$bin" mkdir -p /docs
for f in README.md docs/*.md; do "$bin" put "$f" "/docs/$(basename "$f")"; done
head -c $((32 << 20)) /dev/urandom > "$work/random.bin"
"$bin" put "$work/random.bin" /random.bin
"$bin" ls -l / && "$bin" ls -l /docs
echo "== get it back and compare"
"$bin" get /random.bin "$work/random.out" && cmp "$work/random.bin" "$work/random.out" && echo "identical"
echo "== fsck (every block of every file)"
"$bin" fsck
"$bin" info
echo "== tamper: flip one byte of the largest object in the cipher directory"
obj=$(find "$INTACT_VOLUME/f" -name '*.d' -printf '%s %p\n' | sort -n | tail -1 | cut -d' ' -f2)
printf '\x5a' | dd of="$obj" bs=1 seek=12345 conv=notrunc status=none
set +e
"$bin" get /random.bin "$work/tampered.out"; echo "get exit code: $?"
"$bin" fsck; echo "fsck exit code: $?"
set -e

echo "== mount it (FUSE) and use it as a directory"
if ! command -v fusermount3 >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -qq fuse3 >/dev/null
  else
    echo "fusermount3 is missing: install fuse3 (apt-get install fuse3) to try the mount"; exit 0
  fi
fi
"$bin" fsck --remove-orphans >/dev/null 2>&1 || true
# Start again from a clean volume (the one above was tampered with on purpose).
rm -rf "$INTACT_VOLUME" "$INTACT_STATE" && "$bin" init "$INTACT_VOLUME" >/dev/null
mkdir -p "$work/mnt"
"$bin" mount "$INTACT_VOLUME" "$work/mnt"
trap 'fusermount3 -u "$work/mnt" 2>/dev/null || true' EXIT
cp -a docs "$work/mnt/"
mkdir "$work/mnt/data" && cp "$work/random.bin" "$work/mnt/data/"
setfattr -n user.intact.scheme -v mt-eint-cbc "$work/mnt/data/random.bin" 2>/dev/null || true
"$bin" sync "$work/mnt"       # seals: the anchor's epoch advances (plain sync -f cannot: FUSE forwards no syncfs)
diff -r docs "$work/mnt/docs" && cmp "$work/random.bin" "$work/mnt/data/random.bin" && echo "mounted copy identical"
ls -l "$work/mnt" "$work/mnt/data"
"$bin" umount "$work/mnt"; trap - EXIT   # returns once the daemon sealed and exited
"$bin" fsck && "$bin" stat && "$bin" info

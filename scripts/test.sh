#!/usr/bin/env bash
# The whole test suite (the README's test command; .ci/run calls it after fmt and clippy).
# Installs what the tests need first, from apt: fuse3 (the mount tests), stress-ng and
# rsync (the stress and copy tests), zstd and python3 (zlib: the compression round trips
# against the reference tools), qemu-utils, libnbd-bin (nbdcopy, nbdfuse) and fio (the
# block disk's real NBD clients), gocryptfs and securefs (the peers `intact bench attacks`
# attacks), etcd-server (the anchor in etcd), protobuf-compiler (etcd's client is built
# from its protocol files) and openssl (`bench contiu`'s OpenSSL column); fsx and garage
# (the S3 server) with cargo install. Then no test may skip:
# INTACT_REQUIRE_ALL=1 turns a missing tool into a failure.
# Usage: scripts/test.sh [cargo test arguments] (with arguments, only the cargo test run)
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v stress-ng >/dev/null || need+=(stress-ng)
command -v rsync >/dev/null || need+=(rsync)
command -v zstd >/dev/null || need+=(zstd)
command -v python3 >/dev/null || need+=(python3)
command -v qemu-io >/dev/null || need+=(qemu-utils)
command -v nbdcopy >/dev/null || need+=(libnbd-bin)
command -v fio >/dev/null || need+=(fio)
command -v gocryptfs >/dev/null || need+=(gocryptfs)
command -v securefs >/dev/null || need+=(securefs)
command -v etcd >/dev/null || need+=(etcd-server)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "installing ${need[*]} (apt)" >&2
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Garage, the S3 server of tests/s3.rs (a distributed object store; its build takes about
# 13 minutes on two cores, once: cargo keeps the binary in ~/.cargo/bin).
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! command -v garage >/dev/null; then
  echo "installing garage (cargo install, about 13 minutes)" >&2
  cargo install --locked garage --version "=2.5.0" --no-default-features \
    --features bundled-libs,lmdb >/dev/null 2>&1 \
    || cargo install --locked garage --version "=2.5.0"
fi
if ! command -v fsx >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/fsx" ]; then
  echo "installing fsx (cargo install)" >&2
  cargo install --locked fsx --version "=0.3.2" >/dev/null 2>&1 || cargo install fsx
fi
export INTACT_REQUIRE_ALL=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?
# The attack, crash-at-every-write, property and small-file suites again with an inode-record
# budget of one (issue 18): every idle record is dropped at the end of each request and read
# back, authenticated, at its next use, so eviction and reload run on every path they take.
if [ $# -eq 0 ]; then
  echo "== again with INTACT_TEST_RECORDS=1" | tee -a "$log"
  # `--workspace`, not `-p`: cargo unifies features over the packages it builds, and a
  # `-p` run rebuilt every dependency with another feature set (8 minutes, then 4 more for
  # the S3 run below; a CI run went past its 90 minutes).
  INTACT_TEST_RECORDS=1 cargo test --workspace --test attacks --test crash \
    --test crash_garbage --test model --test small_files --test threads \
    2>&1 | tee -a "$log" || status=$?
  # The mount tests that do not edit the cipher directory's files (and a follower mount beside
  # a writer's), on volumes in a bucket
  # of a Garage server each test starts (issue 9; tests/fuse.rs, INTACT_FUSE_STORE).
  echo "== the mount tests on S3 (INTACT_FUSE_STORE=s3)" | tee -a "$log"
  INTACT_FUSE_STORE=s3 cargo test --workspace --test fuse -- --exact \
    tree_copy_diff_and_remount tar_extract_and_create_round_trip concurrent_writers \
    open_files_survive_unlink_and_rename requests_on_unlinked_inodes_are_not_integrity_failures \
    readdir_while_entries_are_unlinked_is_no_alarm \
    readdir_across_unlink_create_and_reuse_returns_no_other_file \
    unlinked_open_file_is_reclaimed_after_a_crash append_truncate_and_sparse \
    copies_off_the_mount_carry_no_unset_scheme_attribute xattr_limit_of_the_mount_is_enospc \
    fallocate_modes xattrs_links_modes_and_times scheme_per_file_through_xattr \
    fsync_seals_and_unmount_seals close_survives_a_crash_of_the_daemon \
    sync_f_and_sync_leave_a_crash_state_with_no_alarm files_open_for_writing_are_listed_page_by_page \
    special_files_and_directory_link_counts read_only_mount_and_second_writer \
    direct_io_mount_serves_every_read_from_the_engine \
    sigkill_under_load_loses_no_fsynced_file_and_raises_no_alarm \
    bulk_writes_beside_small_requests_read_back a_follower_mount_reads_what_the_writer_seals_while_it_writes \
    set_id_bits_are_cleared_as_on_ext4 \
    2>&1 | tee -a "$log" || status=$?
fi
# One closing line for the whole suite (cargo's last line is a doc-test binary's).
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$status"

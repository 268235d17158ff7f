#!/usr/bin/env bash
# Runs pjdfstest against a shoal mount of a fresh 3-node dev cluster, then tears it down.
#   tests/pjdfstest/on-dev-cluster.sh BIN_DIR      (BIN_DIR holds the built shoal, shoal-agent)
# Exit status: that of tests/pjdfstest/run.sh (0: nothing failed outside excluded.txt).
# Needs root (pjdfstest switches users; the mount uses allow_other) and /dev/fuse.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "${1:?usage: $0 BIN_DIR}" && pwd)
shoal=$bin/shoal
dir=$(mktemp -d /tmp/shoal-pjdfstest.XXXXXX)
# mktemp makes it 0700; pjdfstest's other users must be able to reach the mount below it.
chmod 755 "$dir"
mnt=$dir/mnt
out=${PJDFSTEST_OUT:-/var/tmp/shoal-pjdfstest}

cleanup() {
  if mountpoint -q "$mnt"; then umount "$mnt" 2>/dev/null || umount -l "$mnt" || true; fi
  [ -n "${mount_pid:-}" ] && kill "$mount_pid" 2>/dev/null || true
  "$shoal" dev-cluster down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

"$here/install.sh" >/dev/null
"$shoal" dev-cluster up --nodes 3 --dir "$dir" --base-ip 127.0.95.1 --gossip-port 7946 >/dev/null
mkdir -p "$mnt"
"$shoal" mount "$mnt" --socket "$dir/node1/agent.sock" --allow-other >"$dir/mount.log" 2>&1 &
mount_pid=$!
for _ in $(seq 100); do
  if grep -q " $mnt fuse" /proc/mounts; then break; fi
  sleep 0.1
done
grep -q " $mnt fuse" /proc/mounts || { echo "the mount did not come up:"; cat "$dir/mount.log"; exit 1; }
"$here/run.sh" --strict --secondary-fs /dev/shm --out "$out" "$mnt"

#!/usr/bin/env bash
# Metadata benchmark side by side on a shoal mount and a local directory: create / stat /
# delete N empty files with T worker processes (files split evenly; one subdirectory each unless --one-dir),
# timed per phase; prints a markdown table of ops/s, the ratio shoal/local and p50/p95/p99
# latency per operation.
#
#   tests/bench/metadata.sh [options] MOUNT_DIR LOCAL_DIR
#
#   --files N        files in all (default 10000)
#   --threads T      worker processes (default 4)
#   --one-dir        all workers in one directory (default: one subdirectory each)
#   --drop-caches    sync and drop the kernel caches between phases (root)
#   --out FILE.json  summary (default /var/tmp/shoal-bench/metadata.json); table in FILE.md
#
# The work is done by metadata.py beside this script (Python 3 standard library only).
# Exit status: 0 with the table on stdout; 1 on a failure; 2 on a usage error.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if ! command -v python3 >/dev/null; then
  echo "metadata.sh: python3 is needed (apt-get install -y python3)" >&2
  exit 1
fi
exec python3 "$here/metadata.py" "$@"

#!/usr/bin/env bash
# Installs Garage (a real S3-compatible object store, in Rust) at a pinned version into a
# cache outside the checkout, unless it is already there, and prints the binary's path on
# stdout (everything else goes to stderr). The tiering tests start it on 127.0.0.1.
#
#   tests/s3/install-garage.sh      -> /var/tmp/shoal-tools/garage-2.5.0/bin/garage
#
# Environment:
#   SHOAL_TOOLS_DIR   cache folder (default /var/tmp/shoal-tools)
#   GARAGE_VERSION    crate version (default: the pinned one below; change it here, not in CI)
#
# A cold build takes about 6 minutes on 2 cores (331 s measured at stop 50); later runs find it in the cache.
# Exit status: 0 and the path on stdout, 1 on any failure, 2 on a usage error.
set -euo pipefail

GARAGE_VERSION="${GARAGE_VERSION:-2.5.0}"
TOOLS_DIR="${SHOAL_TOOLS_DIR:-/var/tmp/shoal-tools}"

if [ $# -ne 0 ]; then
  echo "usage: $0   (no arguments; see the header for SHOAL_TOOLS_DIR, GARAGE_VERSION)" >&2
  exit 2
fi

root="$TOOLS_DIR/garage-$GARAGE_VERSION"
bin="$root/bin/garage"

installed() {
  [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -qE "(v|:)$GARAGE_VERSION( |$)"
}

mkdir -p "$TOOLS_DIR"
# One installer at a time (parallel CI jobs on one machine share the cache).
exec 9>"$TOOLS_DIR/.garage.lock"
flock 9

if installed; then
  echo "$bin"
  exit 0
fi

command -v cargo >/dev/null || { echo "install-garage.sh: cargo not found on PATH" >&2; exit 1; }

echo "== cargo install garage $GARAGE_VERSION into $root (about 6 min cold)" >&2
start=$(date +%s)
stage="$root.partial"
rm -rf "$stage"
# Build outside the shoal target dir (.ci/run exports CARGO_TARGET_DIR for the workspace).
# The embedded metadata engine (lmdb, bundled) is all the tests need. Optimized at level 1
# and without debug info: the tests move a few MiB through it, and a cold CI run builds it
# (640 s here at level 1 on 2 busy cores).
CARGO_TARGET_DIR="$TOOLS_DIR/build-garage" \
CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=0 \
  cargo install garage --version "=$GARAGE_VERSION" --locked --root "$stage" \
    --no-default-features --features bundled-libs,lmdb >&2
rm -rf "$root"
mv "$stage" "$root"
rm -rf "$TOOLS_DIR/build-garage"
installed || { echo "install-garage.sh: $bin does not report version $GARAGE_VERSION" >&2; exit 1; }
echo "== garage $GARAGE_VERSION installed in $(( $(date +%s) - start )) s" >&2
echo "$bin"

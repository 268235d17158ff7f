#!/usr/bin/env bash
# Installs the pjdfstest POSIX test suite (the Rust rewrite, crate `pjdfstest`) at a pinned
# version into a cache outside the checkout, unless it is already there, and prints the
# binary's path on stdout (everything else goes to stderr).
#
#   tests/pjdfstest/install.sh            -> /var/tmp/shoal-tools/pjdfstest-0.2.2/bin/pjdfstest
#
# Environment:
#   SHOAL_TOOLS_DIR      cache folder (default /var/tmp/shoal-tools)
#   PJDFSTEST_VERSION    crate version (default: the pinned one below; change it here, not in CI)
#
# Needs cargo; on Linux the crate links libacl, so libacl1-dev is installed with apt when it is
# missing (root only; otherwise the script says what to install and fails).
# Exit status: 0 and the path on stdout, 1 on any failure, 2 on a usage error.
set -euo pipefail

PJDFSTEST_VERSION="${PJDFSTEST_VERSION:-0.2.2}"
TOOLS_DIR="${SHOAL_TOOLS_DIR:-/var/tmp/shoal-tools}"

if [ $# -ne 0 ]; then
  echo "usage: $0   (no arguments; see the header for SHOAL_TOOLS_DIR, PJDFSTEST_VERSION)" >&2
  exit 2
fi

root="$TOOLS_DIR/pjdfstest-$PJDFSTEST_VERSION"
bin="$root/bin/pjdfstest"

installed() {
  [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "pjdfstest $PJDFSTEST_VERSION" ]
}

mkdir -p "$TOOLS_DIR"
# One installer at a time (parallel CI jobs on one machine share the cache).
exec 9>"$TOOLS_DIR/.pjdfstest.lock"
flock 9

if installed; then
  echo "$bin"
  exit 0
fi

command -v cargo >/dev/null || { echo "install.sh: cargo not found on PATH" >&2; exit 1; }

# The crate's `exacl` dependency links against libacl: the linker needs libacl.so (-dev).
if [ "$(uname -s)" = Linux ] && ! dpkg-query -W -f='${Status}' libacl1-dev 2>/dev/null | grep -q 'ok installed'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== apt-get install libacl1-dev (pjdfstest links libacl)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends libacl1-dev >&2 \
      || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends libacl1-dev >&2; }
  else
    echo "install.sh: libacl1-dev is missing; install it (apt-get install libacl1-dev) as root" >&2
    exit 1
  fi
fi

echo "== cargo install pjdfstest $PJDFSTEST_VERSION into $root" >&2
start=$(date +%s)
stage="$root.partial"
rm -rf "$stage"
# Build outside the shoal target dir (.ci/run exports CARGO_TARGET_DIR for the workspace).
CARGO_TARGET_DIR="$TOOLS_DIR/build-pjdfstest" \
  cargo install pjdfstest --version "=$PJDFSTEST_VERSION" --locked --root "$stage" >&2
rm -rf "$root"
mv "$stage" "$root"
rm -rf "$TOOLS_DIR/build-pjdfstest"
installed || { echo "install.sh: $bin does not report version $PJDFSTEST_VERSION" >&2; exit 1; }
echo "== pjdfstest $PJDFSTEST_VERSION installed in $(( $(date +%s) - start )) s" >&2
echo "$bin"

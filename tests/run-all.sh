#!/usr/bin/env bash
# The whole shoal test suite, as CI runs it (.ci/run calls this script).
#   formatting -> lints -> build -> Garage (S3) -> unit, contract, multi-node, mount and
#   tiering tests (and the fuzz corpora replayed) -> a short run of every fuzz target ->
#   pjdfstest on a mount -> Ansible lab -> the reservation on a cgroup v2 VM
# Set CARGO_TARGET_DIR to keep build outputs between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== placement stays pure (no I/O crate among its normal dependencies)"
if cargo tree -p shoal-placement -e normal --prefix none --locked \
    | grep -Eiw '^(tokio|mio|libc|nix|rustix|io-uring|redb|socket2|quinn|rand|getrandom)'; then
  echo "shoal-placement must not depend on the crates above"; exit 1
fi
echo "== test tools (root only): nftables for the partition tests, strace for the durability test"
missing=""
command -v nft >/dev/null || missing="$missing nftables"
command -v strace >/dev/null || missing="$missing strace"
if [ "$(id -u)" = 0 ] && [ -n "$missing" ]; then
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null; }
fi
echo "== cargo build (the multi-node tests run the built binaries)"
cargo build --workspace --locked
echo "== Garage, the S3 server of the tiering tests (built once into the tools cache)"
SHOAL_GARAGE="$(tests/s3/install-garage.sh)"
export SHOAL_GARAGE
echo "== cargo test"
cargo test --workspace --locked
echo "== fuzz targets: a few seconds of each (cargo-fuzz built once into the tools cache)"
tests/fuzz/run.sh --seconds 5
echo "== pjdfstest (POSIX conformance) on a shoal mount (root only)"
if [ "$(id -u)" = 0 ]; then
  tests/pjdfstest/on-dev-cluster.sh "${CARGO_TARGET_DIR:-target}/debug"
else
  echo "SKIPPED: pjdfstest needs root (it switches users; the mount uses allow_other)"
fi
echo "== the Ansible rollout on three systemd-nspawn nodes (root only)"
if [ "$(id -u)" = 0 ]; then
  ansible/tests/run.sh "${CARGO_TARGET_DIR:-target}/debug"
else
  echo "SKIPPED: the Ansible lab needs root (systemd-nspawn, network namespaces)"
fi
echo "== the reservation on a real cgroup v2 kernel: site.yml on a QEMU VM with systemd (root only)"
if [ "$(id -u)" = 0 ]; then
  ansible/tests/v2.sh "${CARGO_TARGET_DIR:-target}/debug"
else
  echo "SKIPPED: the cgroup v2 VM needs root (apt, its disk image, the cgroup writes inside it)"
fi

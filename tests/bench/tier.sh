#!/usr/bin/env bash
# Cold-tier benchmark, one run, side by side: a file's read throughput through a mount while
# it is hot (NVMe stripes), after `shoal tier release` (every read from the bucket), and
# after `shoal tier prefetch` (hot again); with the upload (release) and prefetch rates.
# The bucket is a real S3 server (Garage, from tests/s3/install-garage.sh) on this machine.
#
#   tests/bench/tier.sh [--size 512MiB] [--bin DIR]
#
#   --size N    the file's size, with a unit (default 512MiB)
#   --bin DIR   where shoal and shoal-agent are (default target/release; build them first)
#
# Needs root (mounts; caches are dropped between phases). Prints a markdown table.
# Exit status: 0 with the table on stdout; 1 on a failure; 2 on a usage error.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
size=512MiB
bin="$here/target/release"
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    *) echo "usage: $0 [--size 512MiB] [--bin DIR]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "tier.sh: needs root (mounts)" >&2; exit 1; }
mib=$(numfmt --from=iec-i "${size%B}" | awk '{printf "%d", $1 / 1048576}')
garage="$("$here/tests/s3/install-garage.sh")"
work=$(mktemp -d /var/tmp/shoal-bench-tier.XXXXXX)
ip=127.0.95.250
key=GK0123456789abcdef01234567
secret=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
cleanup() {
  "$bin/shoal" dev-cluster down --dir "$work/c" >/dev/null 2>&1 || true
  [ -n "${gpid:-}" ] && kill "$gpid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/garage.toml" <<CONF
metadata_dir = "$work/g/meta"
data_dir = "$work/g/data"
db_engine = "lmdb"
replication_factor = 1
rpc_bind_addr = "$ip:3901"
rpc_public_addr = "$ip:3901"
rpc_secret = "$secret"
[s3_api]
s3_region = "garage"
api_bind_addr = "$ip:3900"
root_domain = ".s3.garage.localhost"
CONF
printf 'access_key_id = "%s"\nsecret_access_key = "%s"\n' "$key" "$secret" > "$work/creds.toml"
g() { "$garage" -c "$work/garage.toml" "$@"; }
"$garage" -c "$work/garage.toml" server > "$work/garage.log" 2>&1 &
gpid=$!
for _ in $(seq 50); do g status >/dev/null 2>&1 && break; sleep 0.2; done
id=$(g node id -q | cut -d@ -f1)
g layout assign -z dc1 -c 10G "$id" >/dev/null
g layout apply --version 1 >/dev/null
g key import --yes -n bench "$key" "$secret" >/dev/null
g bucket create shoal >/dev/null
g bucket allow --read --write --owner shoal --key bench >/dev/null

"$bin/shoal" dev-cluster up --nodes 4 --dir "$work/c" --base-ip 127.0.95.1 --mount \
  --agent-bin "$bin/shoal-agent" --tiering s3 --s3-endpoint "http://$ip:3900" \
  --s3-region garage --s3-credentials-file "$work/creds.toml" \
  --set tiering.cold_after='"off"' >/dev/null
sock() { echo "$work/c/node$1/agent.sock"; }
mnt() { echo "$work/c/node$1/mnt"; }
rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.1f", b / 1048576 / s }'; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b - a) / 1e9 }'; }
read_rate() { # node -> MiB/s of reading the file through that node's mount
  sync; echo 3 > /proc/sys/vm/drop_caches
  local t0 t1; t0=$(date +%s%N)
  dd if="$(mnt "$1")/data" of=/dev/null bs=4M status=none
  t1=$(date +%s%N)
  rate $((mib * 1048576)) "$(secs "$t0" "$t1")"
}
gets() { curl -s "127.0.95.$1:9464/metrics" | awk '/^shoal_tier_get_requests_total/ { print $2 }'; }

head -c $((mib * 1048576)) /dev/urandom > "$work/src"
cp "$work/src" "$(mnt 1)/data"
hot=$(read_rate 2)
t0=$(date +%s%N)
"$bin/shoal" tier release "$(mnt 1)/data" --socket "$(sock 1)" >/dev/null
t1=$(date +%s%N)
release=$(rate $((mib * 1048576)) "$(secs "$t0" "$t1")")
cold=$(read_rate 3)
cmp "$work/src" "$(mnt 3)/data"
t0=$(date +%s%N)
"$bin/shoal" tier prefetch --wait "$(mnt 4)/data" --socket "$(sock 4)" >/dev/null
t1=$(date +%s%N)
prefetch=$(rate $((mib * 1048576)) "$(secs "$t0" "$t1")")
before=$(gets 2)
warm=$(read_rate 2)
after=$(gets 2)
cmp "$work/src" "$(mnt 2)/data"

echo "| ${mib} MiB file, 4 nodes 2+1, Garage on loopback | MiB/s | vs hot |"
echo "|---|---:|---:|"
echo "| read, hot (NVMe stripes) | $hot | 1.00 |"
echo "| release (read, pack, upload, verify, commit) | $release | $(awk -v a="$release" -v b="$hot" 'BEGIN { printf "%.2f", a / b }') |"
echo "| read, cold (ranged GETs from the bucket) | $cold | $(awk -v a="$cold" -v b="$hot" 'BEGIN { printf "%.2f", a / b }') |"
echo "| prefetch --wait (recall, encode, write, commit) | $prefetch | $(awk -v a="$prefetch" -v b="$hot" 'BEGIN { printf "%.2f", a / b }') |"
echo "| read after prefetch | $warm | $(awk -v a="$warm" -v b="$hot" 'BEGIN { printf "%.2f", a / b }') |"
echo
echo "GETs from the bucket during the read after prefetch: $((${after%.*} - ${before%.*}))"

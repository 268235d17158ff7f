#!/usr/bin/env bash
# CPU time and context switches per operation, per shoal process, on a fresh 6-node 4+2 dev
# cluster with mounts: the steadier figure on a noisy machine, where throughput moves with
# whatever else the host runs. Compare builds by alternating runs of this script.
#
#   tests/bench/cpu-per-op.sh [options]
#
#   --bin DIR      where shoal and shoal-agent are (default: target/release, or
#                  $CARGO_TARGET_DIR/release when set)
#   --op OP        create: N empty files made one at a time in one directory (open with
#                  O_CREAT|O_EXCL, close), through node 1's mount (default);
#                  delete: N empty files made first (not measured), then unlinked one at a time;
#                  randread: 4K random reads, libaio, queue depth 16, O_DIRECT, for 15 s, on a
#                  1 GiB file written through node 1's mount just before (caches dropped);
#                  seqread: that file read once from start to end in 1 MiB reads (caches
#                  dropped first); one operation is one MiB
#   --count N      creates or deletes (default 1000)
#   --dir DIR      the cluster's directory, wiped first (default /var/tmp/shoal-cpu-per-op)
#
# Prints, per process (nodeN agent, nodeN mount), the user+system CPU time per operation
# from /proc/PID/stat and the voluntary+involuntary context switches of all its threads,
# then the totals, and the CPU steal of the machine during the run (ticks: above about 100
# the figures are disturbed). The cluster runs on 127.0.95.1-6. Root (FUSE, dropping caches).
# Exit status: 0 with the table on stdout; 1 a step failed; 2 usage.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

bin="${CARGO_TARGET_DIR:-$repo/target}/release"
op=create
count=1000
dir=/var/tmp/shoal-cpu-per-op

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}
die() { echo "cpu-per-op.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --bin|--op|--count|--dir)
      [ $# -ge 2 ] || usage
      opt="${1#--}"; val="$2"; shift 2
      case "$opt" in
        bin) bin="$val" ;; op) op="$val" ;; count) count="$val" ;; dir) dir="$val" ;;
      esac ;;
    -h|--help) usage ;;
    *) echo "cpu-per-op.sh: unknown argument $1" >&2; usage ;;
  esac
done
case "$op" in create|delete|randread|seqread) ;; *) echo "cpu-per-op.sh: --op is create, delete, randread or seqread" >&2; usage ;; esac
[[ "$count" =~ ^[1-9][0-9]*$ ]] || { echo "cpu-per-op.sh: --count must be a positive number" >&2; usage; }
[ "$(id -u)" = 0 ] || die "run as root (FUSE mounts, dropping caches)"
for b in shoal shoal-agent; do
  [ -x "$bin/$b" ] || die "$bin/$b is missing: cargo build --release -p shoal-agent -p shoal-client, or --bin DIR"
done
if [ "$op" = randread ] && ! command -v fio >/dev/null; then
  die "fio is missing: apt-get install -y fio"
fi

trap '"$bin/shoal" dev-cluster down --dir "$dir" >/dev/null 2>&1 || true' EXIT
"$bin/shoal" dev-cluster down --dir "$dir" >/dev/null 2>&1 || true
rm -rf "$dir"
"$bin/shoal" dev-cluster up --nodes 6 --ec 4+2 --mount --dir "$dir" --base-ip 127.0.95.1 \
  >"$dir.up.log" 2>&1 || die "dev-cluster up failed (output in $dir.up.log)"
mnt="$dir/node1/mnt"

# One line per shoal process of this cluster: name, CPU ticks, context switches.
snapshot() {
  local pid name ticks switches status
  for pid in $(pgrep -f -- "$dir/node[0-9]"); do
    name=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -o 'node[0-9]' | head -1) || continue
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
      shoal-agent) name="$name-agent" ;; shoal) name="$name-mount" ;; *) continue ;;
    esac
    ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null) || continue
    switches=0
    for status in /proc/"$pid"/task/*/status; do
      switches=$((switches + $(awk '/^(non)?voluntary_ctxt_switches/ {n += $2} END {print n + 0}' "$status" 2>/dev/null || echo 0)))
    done
    echo "$name $ticks $switches"
  done | sort
}
steal() { awk '/^cpu / {print $9}' /proc/stat; }
# make_files DIR N: N empty files f0..f(N-1) in DIR (not measured).
make_files() {
  python3 - "$1" "$2" <<'PY'
import os, sys
for i in range(int(sys.argv[2])):
    os.close(os.open(f"{sys.argv[1]}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
PY
}

case "$op" in
  create)
    mkdir -p "$mnt/warm" "$mnt/measured"
    make_files "$mnt/warm" 200
    before=$(snapshot); s0=$(steal)
    rate=$(python3 - "$mnt/measured" "$count" <<'PY'
import os, sys, time
t = time.monotonic()
for i in range(int(sys.argv[2])):
    os.close(os.open(f"{sys.argv[1]}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
print(f"{int(sys.argv[2]) / (time.monotonic() - t):.0f} creates/s")
PY
)
    after=$(snapshot); s1=$(steal); ops=$count ;;
  delete)
    mkdir -p "$mnt/measured"
    make_files "$mnt/measured" "$count"
    before=$(snapshot); s0=$(steal)
    rate=$(python3 - "$mnt/measured" "$count" <<'PY'
import os, sys, time
t = time.monotonic()
for i in range(int(sys.argv[2])):
    os.unlink(f"{sys.argv[1]}/f{i}")
print(f"{int(sys.argv[2]) / (time.monotonic() - t):.0f} deletes/s")
PY
)
    after=$(snapshot); s1=$(steal); ops=$count ;;
  randread)
    dd if=/dev/urandom of="$mnt/randread" bs=1M count=1024 conv=fsync status=none
    sync; echo 3 >/proc/sys/vm/drop_caches
    before=$(snapshot); s0=$(steal)
    fio --name=randread --filename="$mnt/randread" --rw=randread --bs=4k --ioengine=libaio \
      --iodepth=16 --direct=1 --runtime=15 --time_based --output-format=json >"$dir.fio.json" \
      || die "fio failed (output in $dir.fio.json)"
    after=$(snapshot); s1=$(steal)
    read -r ops rate < <(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['jobs'][0]['read']; print(r['total_ios'], f\"{r['iops']:.0f} IOPS\")" "$dir.fio.json") ;;
  seqread)
    dd if=/dev/urandom of="$mnt/seqread" bs=1M count=1024 conv=fsync status=none
    sync; echo 3 >/proc/sys/vm/drop_caches
    before=$(snapshot); s0=$(steal)
    t0=$(date +%s%N)
    dd if="$mnt/seqread" of=/dev/null bs=1M status=none || die "reading the file failed"
    t1=$(date +%s%N)
    after=$(snapshot); s1=$(steal)
    ops=1024; rate="$((1024 * 1000000000 / (t1 - t0))) MiB/s" ;;
esac

tick_us=$((1000000 / $(getconf CLK_TCK)))
echo "$op: $rate; $ops operations; CPU steal during the run: $((s1 - s0)) ticks"
printf '%-14s %12s %18s\n' process "CPU µs/op" "switches/op"
join <(echo "$before") <(echo "$after") | awk -v n="$ops" -v us="$tick_us" '
  { cpu = ($4 - $2) * us / n; cs = ($5 - $3) / n; if (cs < 0) cs = 0  # threads that ended
    tc += cpu; ts += cs
    printf "%-14s %12.1f %18.1f\n", $1, cpu, cs }
  END { printf "%-14s %12.1f %18.1f\n", "total", tc, ts }'

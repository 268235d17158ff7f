#!/usr/bin/env bash
# fio side by side on a shoal mount and a local directory; prints a markdown table.
#
#   tests/bench/fio.sh [options] MOUNT_DIR LOCAL_DIR
#
#   MOUNT_DIR        a directory on the shoal mount (any directory works: the column is just
#                    labelled "shoal")
#   LOCAL_DIR        a directory on a local filesystem, the reference
#   --size SIZE      data set of each test, split evenly over its jobs (default 1G; fio units:
#                    K, M, G are powers of 2 here, e.g. 512M)
#   --runtime SECS   upper bound for each test on each directory (default 20); a test stops
#                    when its data set is done or this runs out, whichever comes first
#   --out FILE.json  summary (default /var/tmp/shoal-bench/fio.json); the table goes to
#                    FILE.md and every raw fio JSON output to FILE-raw/
#   --direct 0|1     O_DIRECT (default 0: page cache, which a FUSE mount may not bypass)
#
# Tests, each run on LOCAL_DIR then MOUNT_DIR before the next (psync, fallocate=none):
#   seq write 1M, 1 job and 4 jobs    a fresh file per job, end_fsync=1 (time includes fsync)
#   seq read 1M, 1 job and 4 jobs     the files just written, page cache dropped first
#   rand read 4K, 1 job and 4 jobs    the same files, every 4K block read once, in random order
#   rand read 4K qd16                 the 1-job file, libaio with 16 in flight and O_DIRECT
# Caches are dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before each read test where
# that is allowed (root); otherwise the table says they were not. Files are removed at the end.
# Needs fio (installed with apt-get when missing, as root) and python3.
#
# Exit status: 0 with the table on stdout; 1 when fio or a setup step fails; 2 on a usage error.
set -euo pipefail

size=1G
runtime=20
out=/var/tmp/shoal-bench/fio.json
direct=0

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}
die() { echo "fio.sh: $*" >&2; exit 1; }

args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --size) [ $# -ge 2 ] || usage; size="$2"; shift 2 ;;
    --runtime) [ $# -ge 2 ] || usage; runtime="$2"; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out="$2"; shift 2 ;;
    --direct) [ $# -ge 2 ] || usage; direct="$2"; shift 2 ;;
    -h|--help) usage ;;
    --) shift; args+=("$@"); break ;;
    -*) echo "fio.sh: unknown option $1" >&2; usage ;;
    *) args+=("$1"); shift ;;
  esac
done
[ ${#args[@]} -eq 2 ] || usage
mount_dir="${args[0]}"; local_dir="${args[1]}"
for d in "$mount_dir" "$local_dir"; do
  if [ ! -d "$d" ] || [ ! -w "$d" ]; then echo "fio.sh: $d is not a writable directory" >&2; exit 2; fi
done
case "$runtime" in ''|*[!0-9]*|0) echo "fio.sh: --runtime takes whole seconds > 0" >&2; exit 2 ;; esac
case "$direct" in 0|1) ;; *) echo "fio.sh: --direct takes 0 or 1" >&2; exit 2 ;; esac
case "$out" in *.json) ;; *) echo "fio.sh: --out must name a .json file" >&2; exit 2 ;; esac
size_bytes="$(python3 -c '
import re, sys
m = re.fullmatch(r"(\d+)\s*([KMGT]?)(i?B)?", sys.argv[1], re.I)
if not m: sys.exit(1)
print(int(m[1]) * 1024 ** " KMGT".index((m[2] or " ").upper()))' "$size")" \
  || { echo "fio.sh: --size $size: use a number with K, M, G or T (e.g. 1G)" >&2; exit 2; }
[ "$size_bytes" -ge $((4 * 1024 * 1024)) ] || { echo "fio.sh: --size must be at least 4M" >&2; exit 2; }
# Per job: a whole number of MiB, so that every job does the same 1M-aligned work.
size1=$(( size_bytes / 1048576 * 1048576 ))
size4=$(( size_bytes / 4 / 1048576 * 1048576 ))

if ! command -v fio >/dev/null; then
  [ "$(id -u)" = 0 ] || die "fio is missing; install it as root: apt-get install -y fio"
  echo "== apt-get install fio" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q fio >&2 || { apt-get update -q >&2 && apt-get install -y -q fio >&2; }
fi
command -v python3 >/dev/null || die "python3 is needed to read fio's JSON output"

# Both data sets live at once (the 1-job file and the 4-job files), with some room to spare.
for d in "$mount_dir" "$local_dir"; do
  avail=$(( $(df -Pk "$d" | awk 'NR == 2 { print $4 }') * 1024 ))
  [ "$avail" -ge $(( size1 + 4 * size4 + 64 * 1048576 )) ] \
    || die "$d has $((avail / 1048576)) MiB free; --size $size needs $(( (size1 + 4 * size4) / 1048576 + 64 )) MiB"
done

raw="${out%.json}-raw"
mkdir -p "$(dirname "$out")" "$raw"
rm -f "$raw"/*.json

dropped=yes
drop_caches() {
  sync
  if ! { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null; then dropped=no; fi
}

cleanup() {
  rm -f "$mount_dir"/shoal-fio.seq1.* "$mount_dir"/shoal-fio.seq4.* \
        "$local_dir"/shoal-fio.seq1.* "$local_dir"/shoal-fio.seq4.* 2>/dev/null || true
}
trap cleanup EXIT
cleanup

# run_fio TEST LABEL DIR RW BS JOBS SIZE_PER_JOB FILESET ENGINE DEPTH DIRECT
# (DIRECT "-": the --direct option)
run_fio() {
  local test="$1" label="$2" dir="$3" rw="$4" bs="$5" jobs="$6" per_job="$7" fileset="$8"
  local engine="$9" depth="${10}" odirect="${11}"
  [ "$odirect" = - ] && odirect="$direct"
  local extra=()
  case "$rw" in
    write) extra+=(--end_fsync=1) ;;
    *) drop_caches ;;
  esac
  echo "== $test on $label ($dir)" >&2
  fio --name="$test" --directory="$dir" --filename_format="shoal-fio.$fileset.\$jobnum" \
    --rw="$rw" --bs="$bs" --numjobs="$jobs" --size="$per_job" --ioengine="$engine" \
    --iodepth="$depth" --direct="$odirect" --fallocate=none --runtime="$runtime" --group_reporting \
    ${extra[@]+"${extra[@]}"} --output-format=json --output="$raw/$label-$test.json" \
    || die "fio failed: $test on $dir (output in $raw/$label-$test.json)"
}

# name rw bs jobs size-per-job fileset engine iodepth direct
tests=(
  "seq-write-1M-1job write 1M 1 $size1 seq1 psync 1 -"
  "seq-read-1M-1job read 1M 1 $size1 seq1 psync 1 -"
  "seq-write-1M-4jobs write 1M 4 $size4 seq4 psync 1 -"
  "seq-read-1M-4jobs read 1M 4 $size4 seq4 psync 1 -"
  "rand-read-4K-1job randread 4K 1 $size1 seq1 psync 1 -"
  "rand-read-4K-4jobs randread 4K 4 $size4 seq4 psync 1 -"
  "rand-read-4K-qd16 randread 4K 1 $size1 seq1 libaio 16 1"
)
for t in "${tests[@]}"; do
  read -r name rw bs jobs per_job fileset engine depth odirect <<<"$t"
  for side in "local $local_dir" "shoal $mount_dir"; do
    run_fio "$name" ${side%% *} "${side#* }" "$rw" "$bs" "$jobs" "$per_job" "$fileset" \
      "$engine" "$depth" "$odirect"
  done
done

python3 - "$raw" "$out" "$size" "$runtime" "$direct" "$dropped" "$mount_dir" "$local_dir" \
  "${tests[@]%% *}" <<'EOF'
import json, os, sys

raw, out, size, runtime, direct, dropped, mount_dir, local_dir = sys.argv[1:9]
names = sys.argv[9:]

def result(label, name):
    with open(os.path.join(raw, f"{label}-{name}.json")) as f:
        text = f.read()
    # fio may print notes before the JSON document.
    job = json.loads(text[text.index("{"):])["jobs"][0]
    side = job["write"] if "write" in name else job["read"]
    clat = side.get("clat_ns", {}).get("percentile", {})
    return {
        "mib_s": side["bw_bytes"] / 1048576,
        "iops": side["iops"],
        "bytes": side["io_bytes"],
        "runtime_ms": side["runtime"],
        "clat_p99_us": clat.get("99.000000", 0) / 1000,
        "error": job.get("error", 0),
    }

rows, summary = [], {
    "size": size, "runtime_s": int(runtime), "direct": int(direct),
    "caches_dropped": dropped == "yes", "shoal_dir": mount_dir, "local_dir": local_dir,
    "tests": {},
}
for name in names:
    loc, sho = result("local", name), result("shoal", name)
    key, unit = ("iops", "IOPS") if name.startswith("rand") else ("mib_s", "MiB/s")
    ratio = sho[key] / loc[key] if loc[key] else float("nan")
    summary["tests"][name] = {"unit": unit, "local": loc, "shoal": sho, "ratio": ratio}
    # A test that ran into --runtime did not get through its data set: mark it.
    capped = lambda r: "*" if r["runtime_ms"] >= int(runtime) * 1000 - 100 else ""
    rows.append(f"| {name} | {unit} | {loc[key]:,.0f}{capped(loc)} | {sho[key]:,.0f}{capped(sho)} | {ratio:.2f} |")

table = "\n".join([
    f"fio: --size {size} per test, --runtime {runtime}s cap, direct={direct}, psync; "
    f"caches dropped before reads: {dropped}",
    f"local = {local_dir}, shoal = {mount_dir}",
    "",
    "| test | unit | local | shoal | shoal/local |",
    "|---|---|---:|---:|---:|",
    *rows,
])
if "*" in "".join(rows):
    table += "\n\n\\* stopped by --runtime before the whole data set was done"
with open(out, "w") as f:
    json.dump(summary, f, indent=2)
with open(out[: -len(".json")] + ".md", "w") as f:
    f.write(table + "\n")
print(table)
EOF
echo "fio.sh: summary in $out, table in ${out%.json}.md, raw fio output in $raw/" >&2

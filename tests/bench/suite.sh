#!/usr/bin/env bash
# The whole mount benchmark in one command: a fresh 6-node 4+2 dev cluster with mounts (node 1's
# mount measured), a local directory and, with --moosefs, a MooseFS 3 reference cluster (master +
# 3 chunkservers, goal 2) on the same machine, side by side in one run (one system up at a
# time). Prints one table:
# fio (seq 1M write with end_fsync and read, 1 and 4 jobs; 4K random read, libaio qd16, O_DIRECT)
# metadata (create / stat / delete of N empty files in one directory, T workers, with
# p50/p99 per operation), a small-file tree (`cp -a` of /usr/share/doc and `rm -rf` of the
# copy, seconds) and, for shoal, two nodes' mounts creating at once in one directory and each
# in its own.
#
#   tests/bench/suite.sh [options]
#
#   --bin DIR        where shoal and shoal-agent are (default: target/release, or
#                    $CARGO_TARGET_DIR/release when set)
#   --dir DIR        the cluster's directory, wiped first (default /var/tmp/shoal-suite)
#   --local DIR      the local reference directory (default /var/tmp/shoal-suite-local)
#   --size SIZE      fio data set per test (default 1G)
#   --runtime SECS   fio cap per test and directory (default 20)
#   --files N        metadata files (default 10000)
#   --threads T      metadata workers (default 4)
#   --tree DIR       the tree `cp -a` copies and `rm -rf` removes (default /usr/share/doc)
#   --two-files N    files each of two mounts creates in the two-node rows (default 1000)
#   --moosefs        also measure MooseFS (Debian packages, installed when missing; root)
#   --bulk MODE      how shard payloads travel between shoal's agents: secure (TLS, the
#                    default) or crc (authenticated and checksummed, not encrypted; MooseFS
#                    does not encrypt its traffic either)
#   --keep           leave the clusters running at the end
#   --out DIR        results: suite.md, suite.json and each part's files (default
#                    /var/tmp/shoal-bench/suite)
#
# The cluster runs on 127.0.96.1-6 with the embedded defaults (but --bulk). Root (fio drops caches, FUSE).
# Exit status: 0 with the table on stdout; 1 a step failed; 2 usage.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

bin="${CARGO_TARGET_DIR:-$repo/target}/release"
dir=/var/tmp/shoal-suite
local_dir=/var/tmp/shoal-suite-local
size=1G
runtime=20
files=10000
threads=4
tree_source=/usr/share/doc
two_files=1000
moosefs=no
bulk=secure
keep=no
out=/var/tmp/shoal-bench/suite

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}
die() { echo "suite.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --bin|--dir|--local|--size|--runtime|--files|--threads|--out|--bulk|--tree|--two-files)
      [ $# -ge 2 ] || usage
      opt="${1#--}"; val="$2"; shift 2
      case "$opt" in
        bin) bin="$val" ;; dir) dir="$val" ;; local) local_dir="$val" ;; size) size="$val" ;;
        runtime) runtime="$val" ;; files) files="$val" ;; threads) threads="$val" ;; out) out="$val" ;;
        bulk) bulk="$val" ;; tree) tree_source="$val" ;; two-files) two_files="$val" ;;
      esac ;;
    --moosefs) moosefs=yes; shift ;;
    --keep) keep=yes; shift ;;
    -h|--help) usage ;;
    *) echo "suite.sh: unknown argument $1" >&2; usage ;;
  esac
done
case "$bulk" in secure|crc) ;; *) echo "suite.sh: --bulk is secure or crc" >&2; usage ;; esac
[ "$(id -u)" = 0 ] || die "run as root (FUSE mounts, dropping caches)"
for b in shoal shoal-agent; do
  [ -x "$bin/$b" ] || die "$bin/$b is missing: cargo build --release -p shoal-agent -p shoal-client, or --bin DIR"
done

mfs_dir="$dir-moosefs"
mfs_mnt="$dir-moosefs-mnt"
cleanup() {
  [ "$keep" = yes ] && return 0
  "$bin/shoal" dev-cluster down --dir "$dir" >/dev/null 2>&1 || true
  [ "$moosefs" = yes ] && "$here/moosefs.sh" down "$mfs_dir" "$mfs_mnt" >/dev/null 2>&1 || true
  return 0
}
trap cleanup EXIT

"$bin/shoal" dev-cluster down --dir "$dir" >/dev/null 2>&1 || true
rm -rf "$dir" "$local_dir"
mkdir -p "$local_dir" "$out"
echo "== dev cluster: 6 nodes, 4+2, mounts (127.0.96.1-6), bulk lane $bulk" >&2
"$bin/shoal" dev-cluster up --nodes 6 --ec 4+2 --mount --dir "$dir" --base-ip 127.0.96.1 \
  --gossip-port 7846 --rpc-port 7847 --bulk-port 7848 --metrics-port 9364 --bulk "$bulk" >"$out/cluster.log" 2>&1 \
  || die "dev-cluster up failed (see $out/cluster.log)"
mnt="$dir/node1/mnt"

# The node leading the metadata group: node 1's mount answers creates and stats faster
# when its own agent leads (no forwarding hop, leases read locally), so the table says.
leader_name() {
  local name tries=0
  while :; do
    name="$(leader_once)"
    if [ "$name" != unknown ] || [ $((tries += 1)) -ge 60 ]; then
      echo "$name"
      return
    fi
    sleep 0.5
  done
}
leader_once() {
  SHOAL_SOCKET="$dir/node1/agent.sock" "$bin/shoal" status 2>/dev/null | awk '
    /^[0-9a-f]+\*? / { id = $1; sub(/\*$/, "", id); name[id] = $2 }
    /^metadata: leader / { l = $3; sub(/,$/, "", l) }
    END { print (l in name) ? name[l] : "unknown" }'
}

# measure NAME PATH: fio and the metadata benchmark on PATH, each beside the local directory.
measure() {
  local name="$1" path="$2"
  mkdir -p "$path/suite"
  echo "== fio: $name beside local" >&2
  "$here/fio.sh" --size "$size" --runtime "$runtime" --out "$out/fio-$name.json" \
    "$path/suite" "$local_dir" >/dev/null
  echo "== metadata: $name beside local" >&2
  "$here/metadata.sh" --one-dir --files "$files" --threads "$threads" \
    --out "$out/metadata-$name.json" "$path/suite" "$local_dir" >/dev/null
  echo "== tree: cp -a $tree_source and rm -rf, $name beside local" >&2
  "$here/tree.sh" --source "$tree_source" --name "$name" --out "$out/tree-$name.json" \
    "$path/suite" "$local_dir" >/dev/null
}

# One system runs at a time: on a small machine the idle one's processes would take CPU
# from the one measured.
leader_before="$(leader_name)"
measure shoal "$mnt"
echo "$leader_before $(leader_name)" >"$out/leader.txt"
echo "== two mounts: nodes 1 and 2 creating in one directory, then each in its own" >&2
python3 "$here/two_mounts.py" --files "$two_files" --out "$out/two-mounts-shoal.json" \
  "$mnt" "$dir/node2/mnt" >/dev/null
if [ "$moosefs" = yes ]; then
  [ "$keep" = yes ] || "$bin/shoal" dev-cluster down --dir "$dir" >/dev/null 2>&1 || true
  "$here/moosefs.sh" up "$mfs_dir" "$mfs_mnt" || die "MooseFS did not start"
  measure moosefs "$mfs_mnt"
fi

python3 - "$out" "$moosefs" "$size" "$files" "$threads" "$bulk" <<'PY'
import json, os, sys

out, moosefs, size, files, threads, bulk = sys.argv[1:7]
names = ["shoal"] + (["moosefs"] if moosefs == "yes" else [])
fio = {n: json.load(open(os.path.join(out, f"fio-{n}.json")))["tests"] for n in names}
meta = {n: json.load(open(os.path.join(out, f"metadata-{n}.json")))["results"] for n in names}

rows = [
    ("seq write 1M, 1 job (MiB/s)", "fio", "seq-write-1M-1job", "mib_s"),
    ("seq write 1M, 4 jobs (MiB/s)", "fio", "seq-write-1M-4jobs", "mib_s"),
    ("seq read 1M, 1 job (MiB/s)", "fio", "seq-read-1M-1job", "mib_s"),
    ("seq read 1M, 4 jobs (MiB/s)", "fio", "seq-read-1M-4jobs", "mib_s"),
    ("4K random read qd16 (IOPS)", "fio", "rand-read-4K-qd16", "iops"),
    ("create (ops/s)", "meta", "create", "ops_per_s"),
    ("stat (ops/s)", "meta", "stat", "ops_per_s"),
    ("delete (ops/s)", "meta", "delete", "ops_per_s"),
]

def leader_line():
    try:
        first, last = open(os.path.join(out, "leader.txt")).read().split()
    except (OSError, ValueError):
        return "shoal's metadata leader: not recorded"
    when = first if first == last else f"{first} at the start, {last} at the end"
    return f"shoal's metadata leader: {when} (node 1's own agent leading makes creates and stats faster)"

def value(name, kind, test, key, side):
    if kind == "fio":
        return fio[name][test][side][key]
    return meta[name][side][test][key]

head = "| workload | local | " + ("MooseFS 3 | " if len(names) > 1 else "") + "shoal | shoal/local |"
head += " shoal/MooseFS |" if len(names) > 1 else ""
lines = [
    f"suite: 6-node 4+2 dev cluster, node 1's mount; fio {size} per test; metadata {files} files "
    f"in one directory, {threads} workers; shoal's bulk lane {bulk} (local measured beside each "
    "system; first run shown)",
    "",
    leader_line(),
    "",
    head,
    "|---|" + "---:|" * (head.count("|") - 2),
]
summary = {"bulk": bulk, "rows": {}}
for label, kind, test, key in rows:
    local = value("shoal", kind, test, key, "local")
    shoal = value("shoal", kind, test, key, "shoal")
    cells = [f"{local:,.0f}"]
    entry = {"local": local, "shoal": shoal}
    if len(names) > 1:
        mfs = value("moosefs", kind, test, key, "shoal")
        cells.append(f"{mfs:,.0f}")
        entry["moosefs"] = mfs
    cells += [f"{shoal:,.0f}", f"{shoal / local:.2f}" if local else "-"]
    if len(names) > 1:
        cells.append(f"{shoal / entry['moosefs']:.2f}" if entry["moosefs"] else "-")
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
    summary["rows"][label] = entry
lines += ["", "metadata latency, µs (p50 / p99):", "", "| op | local | "
          + ("MooseFS 3 | " if len(names) > 1 else "") + "shoal |", "|---|" + "---:|" * (len(names) + 1)]
for op in ("create", "stat", "delete"):
    cell = lambda r: f"{r['p50_us']:,.0f} / {r['p99_us']:,.0f}"
    cells = [cell(meta["shoal"]["local"][op])] + [cell(meta[n]["shoal"][op]) for n in names[::-1]]
    lines.append(f"| {op} | " + " | ".join(cells) + " |")
tree = {n: json.load(open(os.path.join(out, f"tree-{n}.json"))) for n in names}
first = tree["shoal"]
lines += ["", f"small-file tree: `cp -a {first['source']}` ({first['entries']:,} entries, "
          f"{first['bytes'] / 2**20:.0f} MiB) and `rm -rf` of the copy, seconds (lower is better):", "",
          "| step | local | " + ("MooseFS 3 | " if len(names) > 1 else "") + "shoal | shoal/local |"
          + (" shoal/MooseFS |" if len(names) > 1 else ""),
          "|---|" + "---:|" * (len(names) + 2 + (len(names) > 1))]
summary["tree"] = {}
for step, key in (("cp -a", "cp_s"), ("rm -rf", "rm_s")):
    local = first["results"]["local"][key]
    shoal = first["results"]["shoal"][key]
    cells = [f"{local:.2f}"]
    entry = {"local": local, "shoal": shoal}
    if len(names) > 1:
        entry["moosefs"] = tree["moosefs"]["results"]["moosefs"][key]
        cells.append(f"{entry['moosefs']:.2f}")
    cells += [f"{shoal:.2f}", f"{shoal / local:.1f}x" if local else "-"]
    if len(names) > 1:
        cells.append(f"{shoal / entry['moosefs']:.1f}x" if entry["moosefs"] else "-")
    lines.append(f"| {step} | " + " | ".join(cells) + " |")
    summary["tree"][step] = entry
two = json.load(open(os.path.join(out, "two-mounts-shoal.json")))
lines += ["", f"two nodes creating: {two['files_per_mount']:,} empty files per mount (shoal, nodes 1 "
          "and 2), creates/s of all mounts together:", "", "| case | creates/s |", "|---|---:|"]
for label, rate in two["creates_per_s"].items():
    lines.append(f"| {label} | {rate:,.0f} |")
summary["two_mounts"] = two["creates_per_s"]
table = "\n".join(lines)
with open(os.path.join(out, "suite.json"), "w") as f:
    json.dump(summary, f, indent=2)
with open(os.path.join(out, "suite.md"), "w") as f:
    f.write(table + "\n")
print(table)
PY
echo "suite.sh: table in $out/suite.md, every part's output in $out/" >&2

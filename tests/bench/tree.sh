#!/usr/bin/env bash
# Small-file tree benchmark side by side: `cp -a SOURCE` into a directory and `rm -rf` of the
# copy, on a shoal mount and on a local directory, each timed (wall clock, one run). The source
# is read once before (its pages cached), so both sides copy from memory.
#
#   tests/bench/tree.sh [options] MOUNT_DIR LOCAL_DIR
#
#   --source DIR     the tree to copy (default /usr/share/doc)
#   --name NAME      what MOUNT_DIR is, in the table (default shoal)
#   --out FILE.json  summary (default /var/tmp/shoal-bench/tree.json)
#
# Exit status: 0 with a table on stdout; 1 a step failed; 2 usage.
set -euo pipefail
source_dir=/usr/share/doc
name=shoal
out=/var/tmp/shoal-bench/tree.json

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --source|--name|--out)
      [ $# -ge 2 ] || usage
      case "$1" in --source) source_dir="$2" ;; --name) name="$2" ;; --out) out="$2" ;; esac
      shift 2 ;;
    -h|--help) usage ;;
    -*) echo "tree.sh: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || usage
mount_dir="$1"
local_dir="$2"
[ -d "$source_dir" ] || { echo "tree.sh: no directory $source_dir" >&2; exit 1; }
for d in "$mount_dir" "$local_dir"; do
  [ -d "$d" ] || { echo "tree.sh: no directory $d" >&2; exit 1; }
done
mkdir -p "$(dirname "$out")"

entries=$(find "$source_dir" | wc -l)
bytes=$(du -sb "$source_dir" | cut -f1)
# Read the source once so that neither side pays for the first read of it.
find "$source_dir" -type f -exec cat {} + >/dev/null 2>&1 || true

# seconds CMD...: the command's wall-clock time in seconds (fails when the command fails).
seconds() {
  local start end
  start=$EPOCHREALTIME
  "$@"
  end=$EPOCHREALTIME
  awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f\n", e - s }'
}

results=()
for side in local "$name"; do
  if [ "$side" = local ]; then base="$local_dir"; else base="$mount_dir"; fi
  target="$base/tree-bench"
  rm -rf "$target"
  cp_s=$(seconds cp -a "$source_dir" "$target") || { echo "tree.sh: cp -a into $base failed" >&2; exit 1; }
  copied=$(find "$target" | wc -l)
  [ "$copied" = "$entries" ] || { echo "tree.sh: $base has $copied entries of $entries" >&2; exit 1; }
  rm_s=$(seconds rm -rf "$target") || { echo "tree.sh: rm -rf in $base failed" >&2; exit 1; }
  results+=("$side" "$cp_s" "$rm_s")
done

python3 - "$out" "$source_dir" "$entries" "$bytes" "${results[@]}" <<'PY'
import json, sys
out, source, entries, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rest = sys.argv[5:]
sides = {rest[i]: {"cp_s": float(rest[i + 1]), "rm_s": float(rest[i + 2])} for i in range(0, len(rest), 3)}
json.dump({"source": source, "entries": entries, "bytes": size, "results": sides}, open(out, "w"), indent=2)
names = list(sides)
print(f"tree: cp -a {source} ({entries} entries, {size / 2**20:.0f} MiB) and rm -rf of the copy, seconds")
print()
print("| step | " + " | ".join(names) + f" | {names[-1]}/local |")
print("|---|" + "---:|" * (len(names) + 1))
for step, key in (("cp -a", "cp_s"), ("rm -rf", "rm_s")):
    vals = [sides[n][key] for n in names]
    ratio = vals[-1] / vals[0] if vals[0] else float("inf")
    print(f"| {step} | " + " | ".join(f"{v:.2f}" for v in vals) + f" | {ratio:.1f}x |")
PY

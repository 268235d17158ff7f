#!/usr/bin/env bash
# Runs the pjdfstest POSIX conformance suite on a directory (a shoal mount, or any local
# directory for a baseline) and fails when a test fails that excluded.txt does not list.
#
#   tests/pjdfstest/run.sh [options] DIR [PATTERN...]
#
#   DIR                 where the tests run (pjdfstest makes and removes a temporary folder in it)
#   PATTERN...          only the tests whose name contains one of these (all tests by default)
#   --secondary-fs D    a directory on another filesystem, for the EXDEV tests of rename and
#                       link (e.g. /dev/shm); without it those two tests are skipped
#   --out D             where the log, the config used and the results go
#                       (default /var/tmp/shoal-pjdfstest; its previous files are replaced)
#   --config F          pjdfstest config (default tests/pjdfstest/pjdfstest.toml)
#   --excluded F        exclusion list (default tests/pjdfstest/excluded.txt)
#   --timeout S         stop pjdfstest after S seconds and fail (default 900)
#   --strict            also fail when an excluded test passes (the list is stale)
#
# Run it as root: most tests need root, and it creates the dummy users/groups the config
# names (useradd/groupadd) when they are missing. As another user it runs what it can.
# pjdfstest is installed on first use by install.sh (cached under /var/tmp/shoal-tools);
# PJDFSTEST=/path/to/pjdfstest uses that binary instead.
#
# Exit status: 0 when every test passed, was skipped, or failed while listed in excluded.txt;
# 1 when any other test failed, pjdfstest did not finish, or setup failed; 2 on a usage error.
# The last line is `pjdfstest: N passed, N failed, N skipped`, where `failed` counts only the
# failures that are not excluded (excluded ones are counted on the line above it).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
config="$here/pjdfstest.toml"
excluded="$here/excluded.txt"
out=/var/tmp/shoal-pjdfstest
secondary=""
timeout_s=900
strict=0

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}
die() { echo "run.sh: $*" >&2; exit 1; }

args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --secondary-fs) [ $# -ge 2 ] || usage; secondary="$2"; shift 2 ;;
    --out) [ $# -ge 2 ] || usage; out="$2"; shift 2 ;;
    --config) [ $# -ge 2 ] || usage; config="$2"; shift 2 ;;
    --excluded) [ $# -ge 2 ] || usage; excluded="$2"; shift 2 ;;
    --timeout) [ $# -ge 2 ] || usage; timeout_s="$2"; shift 2 ;;
    --strict) strict=1; shift ;;
    -h|--help) usage ;;
    --) shift; args+=("$@"); break ;;
    -*) echo "run.sh: unknown option $1" >&2; usage ;;
    *) args+=("$1"); shift ;;
  esac
done
[ ${#args[@]} -ge 1 ] || usage
dir="${args[0]}"
patterns=("${args[@]:1}")
case "$timeout_s" in ''|*[!0-9]*) echo "run.sh: --timeout takes whole seconds" >&2; exit 2 ;; esac
[ -d "$dir" ] || { echo "run.sh: $dir is not a directory" >&2; exit 2; }
[ -z "$secondary" ] || [ -d "$secondary" ] || { echo "run.sh: $secondary is not a directory" >&2; exit 2; }
[ -f "$config" ] || { echo "run.sh: no config file $config" >&2; exit 2; }
[ -f "$excluded" ] || { echo "run.sh: no exclusion list $excluded" >&2; exit 2; }
dir="$(cd "$dir" && pwd)"
[ -z "$secondary" ] || secondary="$(cd "$secondary" && pwd)"
if [ -n "$secondary" ] && [ "$(stat -c %d "$dir")" = "$(stat -c %d "$secondary")" ]; then
  echo "run.sh: --secondary-fs $secondary is on the same filesystem as $dir (the EXDEV tests need another one)" >&2
  exit 2
fi
if grep -q '^[[:space:]]*expected_failures' "$config"; then
  echo "run.sh: $config sets expected_failures; list them in $excluded instead" >&2; exit 2
fi

# --- the exclusion list: `name  # reason`, comments and blank lines ignored
excluded_names=()
lineno=0
while IFS= read -r line || [ -n "$line" ]; do
  lineno=$((lineno + 1))
  name="${line%%#*}"
  name="$(echo "$name" | tr -d '[:space:]')"
  [ -n "$name" ] || continue
  reason="${line#*#}"
  if [ "$reason" = "$line" ] || [ -z "$(echo "$reason" | tr -d '[:space:]')" ]; then
    echo "run.sh: $excluded:$lineno: '$name' has no '# reason'" >&2; exit 2
  fi
  excluded_names+=("$name")
done < "$excluded"

# --- the binary
if [ -n "${PJDFSTEST:-}" ]; then
  bin="$PJDFSTEST"
  [ -x "$bin" ] || die "PJDFSTEST=$bin is not executable"
else
  bin="$("$here/install.sh")" || die "installing pjdfstest failed"
fi

# --- the dummy users and groups named in the config's [dummy_auth] entries
mapfile -t pairs < <(awk '
  /^\[/ { in_auth = ($0 ~ /^\[dummy_auth\]/) }
  in_auth {
    s = $0; sub(/#.*/, "", s)
    while (match(s, /\[[[:space:]]*"[^"]+"[[:space:]]*,[[:space:]]*"[^"]+"[[:space:]]*\]/)) {
      p = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
      gsub(/[][" \t]/, "", p); sub(/,/, " ", p); print p
    }
  }' "$config")
[ ${#pairs[@]} -eq 2 ] || die "$config: [dummy_auth] entries must name exactly two [\"user\", \"group\"] pairs"
for pair in "${pairs[@]}"; do
  user="${pair% *}"; group="${pair#* }"
  if ! getent group "$group" >/dev/null; then
    [ "$(id -u)" = 0 ] || die "group $group is missing (run as root to create it)"
    echo "== groupadd $group" >&2
    groupadd --system "$group"
  fi
  gid="$(getent group "$group" | cut -d: -f3)"
  if ! getent passwd "$user" >/dev/null; then
    [ "$(id -u)" = 0 ] || die "user $user is missing (run as root to create it)"
    echo "== useradd $user (primary group $group)" >&2
    useradd --system --gid "$group" --no-create-home --home-dir / \
      --shell /usr/sbin/nologin --comment "pjdfstest dummy user" "$user"
  fi
  ugid="$(getent passwd "$user" | cut -d: -f4)"
  [ "$ugid" = "$gid" ] || die "user $user's primary group is gid $ugid, not $group ($gid); pjdfstest needs them to match: change [dummy_auth] in $config"
done
[ "$(id -u)" = 0 ] || echo "run.sh: not root: the tests that need root are skipped" >&2

# --- the config pjdfstest gets: ours, with excluded.txt as [settings] expected_failures
mkdir -p "$out"
rm -f "$out/pjdfstest.toml" "$out/pjdfstest.log" "$out/results.tsv"
list=""
for name in ${excluded_names[@]+"${excluded_names[@]}"}; do
  list="$list\"$name\", "
done
efline="expected_failures = [${list%, }]"
if grep -q '^\[settings\]' "$config"; then
  awk -v line="$efline" '{ print } /^\[settings\]/ { print line }' "$config" > "$out/pjdfstest.toml"
else
  { cat "$config"; printf '\n[settings]\n%s\n' "$efline"; } > "$out/pjdfstest.toml"
fi

# --- run
cmd=("$bin" -c "$out/pjdfstest.toml" -p "$dir")
[ -z "$secondary" ] || cmd+=(-s "$secondary")
cmd+=(${patterns[@]+"${patterns[@]}"})
echo "== pjdfstest $("$bin" --version | awk '{print $2}') on $dir (log: $out/pjdfstest.log)" >&2
echo "   ${cmd[*]}" >&2
start=$(date +%s)
set +e
# From / so that no relative path leans on the caller's directory; no colours in the log.
(cd / && NO_COLOR=1 CLICOLOR=0 timeout --kill-after=30 "$timeout_s" "${cmd[@]}") > "$out/pjdfstest.log" 2>&1
rc=$?
set -e
secs=$(( $(date +%s) - start ))

# --- results: one line a test, `name  ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY`
sed -nE 's/^([A-Za-z0-9_:]+) +(ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY)$/\1\t\2/p' \
  "$out/pjdfstest.log" > "$out/results.tsv"
count() { awk -F'\t' -v s="$1" '$2 == s' "$out/results.tsv" | wc -l; }
passed=$(count ok); failed=$(count FAILED); skipped=$(count skipped)
xfail=$(count 'failed as expected'); xpass=$(count 'PASSED UNEXPECTEDLY')
total=$(wc -l < "$out/results.tsv")

if [ "$failed" -gt 0 ]; then
  echo "-- failed (not in excluded.txt):"
  awk -F'\t' '$2 == "FAILED" { print "   " $1 }' "$out/results.tsv"
  echo "   the reasons are in $out/pjdfstest.log, under each name"
fi
if [ "$xpass" -gt 0 ]; then
  echo "-- passed although excluded.txt lists them (drop them from the list once a mount confirms):"
  awk -F'\t' '$2 == "PASSED UNEXPECTEDLY" { print "   " $1 }' "$out/results.tsv"
fi
for name in ${excluded_names[@]+"${excluded_names[@]}"}; do
  if [ ${#patterns[@]} -eq 0 ] && ! awk -F'\t' -v n="$name" '$1 == n { f = 1 } END { exit !f }' "$out/results.tsv"; then
    echo "-- warning: excluded.txt names $name, which pjdfstest did not run (misspelt, or gone in this version)"
  fi
done

status=0
summary_line="$(grep -E '^Summary: ' "$out/pjdfstest.log" | tail -n 1 || true)"
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "-- pjdfstest did not finish within ${timeout_s}s (rc $rc): the last test started is the one after the last result in the log"
  status=1
elif [ -z "$summary_line" ]; then
  echo "-- pjdfstest ended (rc $rc) without its summary; the end of $out/pjdfstest.log:"
  tail -n 20 "$out/pjdfstest.log" | sed 's/^/   /'
  status=1
elif [ "$total" -eq 0 ]; then
  echo "-- pjdfstest ran no test (patterns: ${patterns[*]:-none})"
  status=1
fi
[ "$failed" -eq 0 ] || status=1
[ "$strict" = 0 ] || [ "$xpass" -eq 0 ] || status=1

echo "pjdfstest said: ${summary_line:-nothing} (rc $rc, ${secs}s)"
echo "excluded (excluded.txt): $xfail failed as listed, $xpass passed anyway; $total tests in all"
echo "pjdfstest: $((passed + xpass)) passed, $failed failed, $skipped skipped"
exit "$status"

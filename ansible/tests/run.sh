#!/bin/bash
# ansible/tests/run.sh [BIN_DIR] - the whole check of the Ansible rollout (issue 6).
#
# Run as root from anywhere, on a machine like CI's (no systemd as PID 1 needed):
#   ansible/tests/run.sh target/debug      # BIN_DIR: relative to the repo root, or absolute
# BIN_DIR holds the built `shoal-agent` and `shoal` (default target/debug, or $SHOAL_BIN_DIR).
#
# 1. static: ansible-lint (production profile) and --syntax-check of every playbook; the
#    config template still renders the committed tests/rendered-agent.toml;
# 2. the lab (lab/lab.sh, 3 systemd-nspawn nodes in 3 failure domains):
#    converge site.yml -> every agent alive and seeing every other; hardened unit; the lab's
#    reservation ([resources], best-effort) reached every agent, which runs unconfined and
#    says so in `shoal status --json` and its journal; re-run -> changed=0; change one variable -> only the config changes, agents restart one
#    at a time (generation +1 each) with never more than one node out; invalid variables ->
#    the play stops before touching any node; a config the agent refuses never replaces the
#    good one; with resources.enforcement = "required" an agent that cannot confine itself
#    refuses to start (a scratch agent on node1, beside the running one); rolling_upgrade.yml replaces the binary node by node; a batch
#    of two voters (node1 and node2 put in one failure domain) stops at ok-to-stop, asked
#    for both together; with one agent down a rolling restart stops at the gate after the
#    first failure domain; drain.yml;
# 3. the lab is torn down, also on failure (trap).
# Prints every check; exits non-zero on the first failure. The Python venv with ansible-core
# and ansible-lint is kept in $SHOAL_ANSIBLE_VENV (default /var/tmp/shoal-ansible-venv) and
# reused while it matches tests/requirements.txt; the nodes' base rootfs is kept by lab.sh.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ANS=$REPO/ansible
LAB=$ANS/lab/lab.sh
N=3
BIN_DIR=${1:-${SHOAL_BIN_DIR:-target/debug}}
case $BIN_DIR in /*) ;; *) BIN_DIR=$REPO/$BIN_DIR;; esac
# shellcheck source=venv.sh
. "$ANS/tests/venv.sh"     # VENV, shoal_ansible_venv
export STATE=${STATE:-$REPO/.lab}   # shared with lab.sh: ssh key, CA, logs (git-ignored)
OUT=$STATE/test                     # this run's logs and scratch files
START=$SECONDS
PASS=0
LAST_LOG=

say() { echo "[$(date +%T) +$((SECONDS - START))s] $*"; }
ok() { PASS=$((PASS + 1)); echo "  ok: $*"; }
fail() {
  echo "  FAIL: $*" >&2
  if [ -n "$LAST_LOG" ] && [ -f "$LAST_LOG" ]; then
    echo "  --- last 40 lines of $LAST_LOG" >&2; tail -40 "$LAST_LOG" >&2
  fi
  exit 1
}
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }

cleanup() {
  local rc=$?
  [ -n "${POLLER:-}" ] && kill "$POLLER" 2>/dev/null
  if [ -n "${LAB_UP:-}" ]; then say "tearing the lab down"; "$LAB" down $N || true; fi
  echo
  if [ $rc -eq 0 ]; then echo "ansible: $PASS passed, 0 failed"; else echo "ansible: $PASS passed, 1 failed"; fi
  say "done (rc=$rc)"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" = 0 ] || fail "run as root (the lab creates namespaces, mounts and cgroups)"
for b in shoal-agent shoal; do
  [ -x "$BIN_DIR/$b" ] || fail "$BIN_DIR/$b is missing: build first (cargo build --workspace)"
done
rm -rf "$OUT"; mkdir -p "$OUT"
# The plays install this snapshot, so a rebuild in BIN_DIR during the run changes nothing.
mkdir -p "$OUT/bin"; cp "$BIN_DIR/shoal-agent" "$BIN_DIR/shoal" "$OUT/bin/"
BIN=$OUT/bin

# ---------------------------------------------------------------------------------------
say "Python venv with ansible-core and ansible-lint ($VENV)"
shoal_ansible_venv
ansible-playbook --version | sed -n 1p   # (sed reads it all: no broken pipe)

# Everything Ansible writes goes to the lab's state folder, and the output is plain.
export ANSIBLE_HOME=$STATE/ansible-home ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
export ANSIBLE_PRIVATE_KEY_FILE=$STATE/id_ed25519 ANSIBLE_HOST_KEY_CHECKING=False
# Node host keys are new at every `lab.sh up`: remember none of them.
export ANSIBLE_SSH_COMMON_ARGS="-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
cd "$ANS"   # ansible.cfg is read from here

# ---------------------------------------------------------------------------------------
say "static checks"
LAST_LOG=$OUT/lint.log
check "ansible-lint --profile production" \
  timeout 300 ansible-lint --offline --project-dir . --profile production --nocolor >"$LAST_LOG" 2>&1
for pb in site.yml rolling_upgrade.yml drain.yml; do
  LAST_LOG=$OUT/syntax-$pb.log
  check "ansible-playbook --syntax-check $pb" \
    timeout 120 ansible-playbook -i inventory.example --syntax-check "$pb" >"$LAST_LOG" 2>&1
done
LAST_LOG=$OUT/render.log
timeout 120 ansible-playbook tests/render-sample.yml -e "shoal_sample_out=$OUT/rendered-agent.toml" \
  >"$LAST_LOG" 2>&1 || fail "rendering the sample config"
check "the template renders tests/rendered-agent.toml (the file the Rust test checks)" \
  diff -u tests/rendered-agent.toml "$OUT/rendered-agent.toml"

# ---------------------------------------------------------------------------------------
say "lab: $N systemd nodes"
"$LAB" down $N       # leftovers of a killed run (/run is on disk here); safe when clean
LAB_UP=1
timeout 600 "$LAB" base
timeout 120 "$LAB" up $N
rm -rf "$STATE/ca"   # a new lab is a new cluster

# play LOGNAME PLAYBOOK [ARGS...]: ansible-playbook inside the lab's network namespace, with
# the lab inventory (or $INV).
play() {
  LAST_LOG=$OUT/$1; shift
  timeout 300 "$LAB" ctl ansible-playbook -i "${INV:-lab/inventory.yml}" \
    -e "shoal_build_dir=$BIN" -e "shoal_ca_dir=$STATE/ca" "$@" >"$LAST_LOG" 2>&1
}
on() { local i=$1; shift; timeout 30 "$LAB" exec "$i" "$@"; }   # run a command in node I
status() { "$VENV/bin/python" "$ANS/tests/lab_status.py" "$@"; }   # see that file

# Every node's own view lists exactly the lab's nodes, all alive.
views_all_alive() {
  local i
  for i in $(seq 1 $N); do
    on "$i" shoal status --json 2>/dev/null | status all-alive "$i" $N || return 1
  done
}
wait_all_alive() {  # up to 20 s
  for _ in $(seq 1 40); do views_all_alive && return 0; sleep 0.5; done
  return 1
}
# "node1=G node2=G ..." from each node's own entry.
generations() {
  local i
  for i in $(seq 1 $N); do
    printf 'node%s=%s ' "$i" "$(on "$i" shoal status --json | status generation)"
  done
}
# What the play manages on every node: checksums of the small files; inode, size and mtime
# of the binaries (the copy module writes a changed file anew; hashing 60 MB costs time).
snapshot() {
  local i
  for i in $(seq 1 $N); do
    on "$i" sh -c 'cd / && sha256sum etc/shoal/agent.toml etc/shoal/tls/* \
      etc/systemd/system/shoal-agent.service &&
      stat -c "%n %i %s %Y" usr/local/bin/shoal-agent usr/local/bin/shoal' | sed "s/^/node$i /"
  done
}
# changed=N of every host in the PLAY RECAP of a log, e.g. "node1=0 node2=0 node3=0".
recap_changed() {
  sed -n 's/^\(node[0-9]*\) *: .*changed=\([0-9]*\).*/\1=\2/p' "$1" | sort | tr '\n' ' ' | sed 's/ $//'
}
# "TASK NAME|HOST" for every changed result in a log (handlers included).
changed_tasks() {
  awk '/^(TASK|RUNNING HANDLER) \[/ { t = $0; sub(/^[A-Z ]+\[([a-z_]+ : )?/, "", t); sub(/\] \**$/, "", t) }
       /^changed: \[/ { h = $2; gsub(/[\[\]]/, "", h); print t "|" h }' "$1" | sort -u
}
# Background poller: every ~0.3 s, every node's `shoal status --json` (or "none"), one line
# per answer: "EPOCH OBSERVER JSON". Bounded to 5 minutes.
poll_start() {
  rm -f "$OUT/poll.stop"
  ( end=$((SECONDS + 300))
    while [ $SECONDS -lt $end ] && [ ! -f "$OUT/poll.stop" ]; do
      for i in $(seq 1 $N); do
        js=$(on "$i" shoal status --json 2>/dev/null | tr -d '\n') || js=none
        echo "$(date +%s.%N) node$i ${js:-none}"
      done
      sleep 0.3
    done ) >"$OUT/$1" 2>&1 &
  POLLER=$!
}
poll_stop() { touch "$OUT/poll.stop"; wait "$POLLER" || true; POLLER=; }
# From a poll log: never more than one node out in any polling round (lab_status.py).
rolling_ok() { status rolling "$OUT/$1" $N; }
# From the nodes' journals since epoch $1: the agents' restart windows (Stopping -> Started),
# in node order, do not overlap.
restarts_serial() {
  local i
  for i in $(seq 1 $N); do
    on "$i" journalctl -u shoal-agent -o short-unix --no-pager --since "@$1" |
      awk -v n="node$i" '/Stopping shoal-agent/ && !s { s = $1 } /Started shoal-agent/ { e = $1 }
                         END { print n, s, e }'
  done | status windows
}

# ---------------------------------------------------------------------------------------
say "converge: site.yml on a fresh cluster"
play converge.log site.yml || fail "site.yml did not converge"
ok "site.yml converged ($(recap_changed "$LAST_LOG"))"
check "every agent is alive and sees every other (shoal status --json on each node)" wait_all_alive
GEN0=$(generations)
check "every agent started exactly once (generation 1 everywhere: $GEN0)" \
  test "$GEN0" = "$(for i in $(seq 1 $N); do printf 'node%s=1 ' "$i"; done)"
unit_ok() {
  local i props
  for i in $(seq 1 $N); do
    [ "$(on "$i" systemctl is-enabled shoal-agent)" = enabled ] || return 1
    props=$(on "$i" systemctl show shoal-agent -p Delegate -p ProtectSystem -p NoNewPrivileges \
      -p PrivateTmp -p Restart -p ActiveState)
    for p in Delegate=yes ProtectSystem=strict NoNewPrivileges=yes PrivateTmp=yes \
      Restart=on-failure ActiveState=active; do
      grep -qx "$p" <<<"$props" || { echo "    node$i: $p missing in: $props"; return 1; }
    done
    # No capability in the running agent but CAP_SYS_NICE (bit 23; see the unit).
    on "$i" sh -c 'grep -q "^CapEff:[[:space:]]*0000000000800000$" /proc/$(systemctl show -p MainPID --value shoal-agent)/status' ||
      return 1
  done
}
check "unit enabled, active, hardened (Delegate, ProtectSystem=strict, NoNewPrivileges, PrivateTmp, no capability but CAP_SYS_NICE)" unit_ok
# The lab's reservation (lab/group_vars/shoal_nodes.yml: 0.5 cores, 256MiB, best-effort) in
# every agent; the nodes' cgroup controllers are read-only, so none of them is confined.
LAB_MEMORY_BYTES=$((256 << 20)) LAB_CORES=0.5
resources_best_effort() {
  local i
  for i in $(seq 1 $N); do
    on "$i" grep -qx 'enforcement = "best-effort"' /etc/shoal/agent.toml ||
      { echo "    node$i: no best-effort [resources] in /etc/shoal/agent.toml"; return 1; }
    on "$i" shoal status --json | status best-effort "$i" $LAB_MEMORY_BYTES $LAB_CORES || return 1
  done
}
check "every agent has the lab's reservation, NOT enforced, with a note why (shoal status --json: resources)" \
  resources_best_effort
best_effort_logged() {
  local i
  for i in $(seq 1 $N); do
    # awk reads everything (grep -q would end the pipe early: SIGPIPE under pipefail).
    on "$i" journalctl -u shoal-agent -o cat --no-pager |
      awk '/ WARN / && index($0, "resource reservation NOT enforced (enforcement = best-effort)") { f = 1 }
           END { exit !f }' ||
      { echo "    node$i: no best-effort warning in the agent's journal"; return 1; }
  done
}
check "every agent's journal has the WARN \"resource reservation NOT enforced (enforcement = best-effort)\"" \
  best_effort_logged
CA0=$(sha256sum "$STATE/ca/ca.pem" "$STATE/ca/ca.key" "$STATE/ca/cluster.key")
no_ca_key() {
  local i
  for i in $(seq 1 $N); do ! on "$i" test -e /etc/shoal/tls/ca.key || return 1; done
}
check "the CA key stays on the control node (not in any node's /etc/shoal/tls)" no_ca_key

# ---------------------------------------------------------------------------------------
say "idempotence: site.yml again"
SNAP0=$(snapshot)
play idempotent.log site.yml || fail "second site.yml run failed"
check "second run reports changed=0 on every node ($(recap_changed "$LAST_LOG"))" \
  test "$(recap_changed "$LAST_LOG")" = "node1=0 node2=0 node3=0"
check "second run restarted nothing (generations unchanged)" test "$(generations)" = "$GEN0"
check "second run left every managed file as it was (checksums)" test "$(snapshot)" = "$SNAP0"

# ---------------------------------------------------------------------------------------
say "one variable changed (shoal_log_level=debug): rolling restart, one failure domain at a time"
SINCE=$(date +%s)
poll_start poll-restart.log
play var-change.log site.yml -e shoal_log_level=debug || { poll_stop; fail "site.yml with a changed variable failed"; }
poll_stop
expected=$(for i in $(seq 1 $N); do echo "Render /etc/shoal/agent.toml|node$i"; echo "Restart shoal-agent|node$i"; done | sort)
check "only the config changed and each agent was restarted once" \
  test "$(changed_tasks "$LAST_LOG")" = "$expected"
# The order in the log: a restart, then the gate, per failure domain (before the final check).
order=$(awk '/^PLAY \[Check every node sees every other/ { exit }
             /^RUNNING HANDLER \[shoal_agent : Restart/ { r = 1; next }
             r && /^changed: \[/ { printf "restart:%s ", $2; r = 0 }
             /^TASK \[shoal_agent : Poll/ { printf "gate " }' "$LAST_LOG")
check "restarts were serial, each followed by the all-alive gate ($order)" \
  test "$order" = "restart:[node1] gate restart:[node2] gate restart:[node3] gate "
GEN1=$(generations)
check "every generation went up by exactly one ($GEN0-> $GEN1)" \
  test "$GEN1" = "$(for i in $(seq 1 $N); do printf 'node%s=2 ' "$i"; done)"
check "the agents' restarts did not overlap (systemd journals)" restarts_serial "$SINCE"
check "the cluster stayed available: never more than one node out (polled from every node)" \
  rolling_ok poll-restart.log
new_config() {
  local i
  for i in $(seq 1 $N); do on "$i" grep -qx 'level = "debug"' /etc/shoal/agent.toml || return 1; done
}
check "every node has the new config (level = \"debug\")" new_config
check "every agent is alive and sees every other afterwards" wait_all_alive

# ---------------------------------------------------------------------------------------
say "invalid variables: the play stops before touching any node"
SNAP1=$(snapshot)
# Each case also asks for a config change (shoal_log_level=warn) that a run getting past the
# checks would make, so an unchanged node proves the run stopped early.
invalid_case() {  # NAME EXPECTED-MESSAGE EXTRA-ARGS...
  local name=$1 msg=$2; shift 2
  if play "invalid-$name.log" site.yml -e shoal_log_level=warn "$@"; then
    fail "$name: the play succeeded"
  fi
  check "$name: fails with \"$msg\"" grep -qF "$msg" "$LAST_LOG"
  check "$name: stopped in the checks (no CA or node task ran, changed=0: $(recap_changed "$LAST_LOG"))" \
    sh -c "! grep -q '^PLAY \[Cluster CA' '$LAST_LOG' && ! grep -q '^changed:' '$LAST_LOG'"
  check "$name: every node's files unchanged (checksums)" test "$(snapshot)" = "$SNAP1"
}
# A host without a failure domain: the lab inventory minus node2's domain (with its group_vars).
mkdir -p "$OUT/inv-nodomain"
cp -r lab/group_vars "$OUT/inv-nodomain/"
grep -v 'shoal_failure_domain: rack-b' lab/inventory.yml > "$OUT/inv-nodomain/hosts.yml"
INV=$OUT/inv-nodomain/hosts.yml invalid_case no-failure-domain "node2: shoal_failure_domain is not set"
# A data dir that does not exist on node3 (a second inventory source overrides host variables).
printf 'all:\n  hosts:\n    node3:\n      shoal_data_dir: /srv/nvme1/shoal\n' > "$OUT/inv-nodatadir.yml"
invalid_case missing-data-dir "node3: shoal_data_dir /srv/nvme1/shoal does not exist" -i "$OUT/inv-nodatadir.yml"
# A reservation larger than node1's memory.
printf 'all:\n  hosts:\n    node1:\n      shoal_reserved_memory: 64T\n' > "$OUT/inv-bigmem.yml"
invalid_case reservation-too-big "node1: shoal_reserved_memory is 64T, but this node has" -i "$OUT/inv-bigmem.yml"
# CPU reserved both ways, or not at all while memory is reserved; more cores than a node has.
invalid_case both-cpu-reservations \
  "node1: shoal_reserved_cpus and shoal_reserved_cpu_cores are both set" -e shoal_reserved_cpus=0
invalid_case no-cpu-reservation \
  "node1: shoal_reserved_memory is set but neither shoal_reserved_cpus nor shoal_reserved_cpu_cores is" \
  -e shoal_reserved_cpu_cores=
invalid_case cpu-quota-too-big "node1: shoal_reserved_cpu_cores is 64, but this node has" \
  -e shoal_reserved_cpu_cores=64
invalid_case cpuset-not-on-node "node1: shoal_reserved_cpus is 0-63, but this node has" \
  -e shoal_reserved_cpus=0-63 -e shoal_reserved_cpu_cores=
check "the checks did not restart any agent" test "$(generations)" = "$GEN1"

say "a value only the agent can refuse: its --check-config keeps the good config"
if play bad-render.log site.yml -e 'shoal_log_level=info,['; then fail "the play accepted an invalid log filter"; fi
check "the template task failed on the first node with the agent's message (log.level)" \
  grep -qF "log.level" "$LAST_LOG"
check "every node's files unchanged (checksums)" test "$(snapshot)" = "$SNAP1"
check "no agent restarted (generations $GEN1)" test "$(generations)" = "$GEN1"

# ---------------------------------------------------------------------------------------
say "resources.enforcement = required where cgroups are read-only: the agent refuses to start"
# The template's validate (--check-config) does not try the cgroup, so only a real start
# shows the refusal. Not through the play (that would replace node1's good config and leave
# its agent failing): a scratch agent on node1, under systemd with Delegate=yes like the real
# unit, with node1's rendered config changed to enforcement = "required" and everything it
# could share with the running agent moved aside (data dir, ports, seeds, socket, metrics,
# cgroup), so that it could not join the cluster even if it started. Its name and node id are
# node1's: they come from node1's certificate (a config naming another node is refused).
RT=/var/tmp/shoal-required-test
LAST_LOG=$OUT/required.toml
on 1 cat /etc/shoal/agent.toml | sed \
  -e 's/^enforcement = "best-effort"$/enforcement = "required"/' \
  -e '/^name = "node1"$/d' \
  -e "s|^data_dir = .*|data_dir = \"$RT/data\"|" \
  -e 's/^gossip_port = .*/gossip_port = 17946/' -e 's/^rpc_port = .*/rpc_port = 17947/' \
  -e 's/^bulk_port = .*/bulk_port = 17948/' -e 's/^seeds = .*/seeds = ["10.77.0.11:17946"]/' \
  -e 's|^socket = .*|socket = "/run/shoal-required-test/agent.sock"|' \
  -e '/^\[metrics\]/,/^\[/{/^addr = /d}' -e 's/^cgroup = .*/cgroup = "shoal-required-test"/' \
  >"$LAST_LOG"
scratch_config_ok() {
  local line
  for line in 'enforcement = "required"' "data_dir = \"$RT/data\"" \
    'gossip_port = 17946' 'rpc_port = 17947' 'bulk_port = 17948' 'seeds = ["10.77.0.11:17946"]' \
    'socket = "/run/shoal-required-test/agent.sock"' 'cgroup = "shoal-required-test"' \
    'cpu_cores = 0.5' 'memory = "256MiB"'; do
    grep -qxF "$line" "$LAST_LOG" || { echo "    missing: $line"; return 1; }
  done
  ! grep -q '9464' "$LAST_LOG" && ! grep -q '^name = ' "$LAST_LOG"
}
check "scratch config: node1's [resources] with enforcement = \"required\", nothing but its identity shared with the running agent" \
  scratch_config_ok
on 1 sh -c "rm -rf $RT && mkdir -p $RT/data && cat > $RT/agent.toml" <"$LAST_LOG"
LAST_LOG=$OUT/required-check-config.log
scratch_check_config() { on 1 shoal-agent --check-config --config "$RT/agent.toml" >"$LAST_LOG" 2>&1; }
check "shoal-agent --check-config accepts it (the reservation fits the node; the cgroup is not tried)" \
  scratch_check_config
LAST_LOG=$OUT/required-start.log
# RuntimeMaxSec bounds it should it start after all; --wait returns the agent's exit status.
rc=0
on 1 systemd-run --quiet --pipe --wait --collect --unit=shoal-required-test -p Delegate=yes \
  -p RuntimeMaxSec=15 shoal-agent --config "$RT/agent.toml" </dev/null >"$LAST_LOG" 2>&1 || rc=$?
on 1 sh -c 'systemctl stop shoal-required-test 2>/dev/null; systemctl reset-failed shoal-required-test 2>/dev/null; true'
sed 's/^/    /' "$LAST_LOG"
check "the scratch agent exited non-zero (rc=$rc)" test "$rc" -ne 0
check "... saying \"cannot enforce the reservation here\" and pointing at \"best-effort\"" \
  sh -c "grep -qF 'cannot enforce the reservation here' '$LAST_LOG' && grep -qF 'best-effort' '$LAST_LOG'"
on 1 rm -rf "$RT"
check "node1 keeps its good config (enforcement = \"best-effort\")" \
  on 1 grep -qx 'enforcement = "best-effort"' /etc/shoal/agent.toml
check "every node's files unchanged (checksums)" test "$(snapshot)" = "$SNAP1"
check "no agent restarted (generations $GEN1)" test "$(generations)" = "$GEN1"
check "the cluster stayed available: every agent alive, seeing exactly node1..node$N" wait_all_alive

# ---------------------------------------------------------------------------------------
VERSION=$("$BIN/shoal-agent" --version | awk '{print $2}')
say "rolling_upgrade.yml -e shoal_version=$VERSION+lab (a rebuilt shoal-agent, node by node)"
# A "release" whose shoal-agent differs from the installed one: the same program with bytes
# appended (ignored by the loader), so the upgrade really replaces the file and restarts.
REL=$OUT/releases/$VERSION+lab
mkdir -p "$REL"
cp "$BIN/shoal" "$REL/shoal"
cp "$BIN/shoal-agent" "$REL/shoal-agent"; printf '\nshoal-lab-upgrade\n' >> "$REL/shoal-agent"
NEW_SUM=$(sha256sum < "$REL/shoal-agent" | cut -d' ' -f1)
SINCE=$(date +%s)
poll_start poll-upgrade.log
play upgrade.log rolling_upgrade.yml -e "shoal_version=$VERSION+lab" -e "shoal_release_dir=$OUT/releases" ||
  { poll_stop; fail "rolling_upgrade.yml failed"; }
poll_stop
expected=$(for i in $(seq 1 $N); do echo "Install shoal-agent|node$i"; echo "Restart shoal-agent|node$i"; done | sort)
check "only shoal-agent was replaced and each agent restarted once" \
  test "$(changed_tasks "$LAST_LOG")" = "$expected"
runs_new_binary() {
  local i out
  for i in $(seq 1 $N); do
    out=$(on "$i" sha256sum /usr/local/bin/shoal-agent) || return 1
    grep -q "^$NEW_SUM " <<<"$out" || return 1
  done
}
check "every node has the new binary" runs_new_binary
GEN2=$(generations)
check "every generation went up by exactly one ($GEN1-> $GEN2)" \
  test "$GEN2" = "$(for i in $(seq 1 $N); do printf 'node%s=3 ' "$i"; done)"
check "the agents' restarts did not overlap (systemd journals)" restarts_serial "$SINCE"
check "the cluster stayed available during the upgrade: never more than one node out" \
  rolling_ok poll-upgrade.log
check "every agent is alive and sees every other afterwards" wait_all_alive

# ---------------------------------------------------------------------------------------
say "a batch is one stop: node1 and node2 in one failure domain (two of three voters) are not restarted together"
# --limit with one domain for both makes node1 and node2 one batch, and a new log level
# changes both configs: both agents would restart at once. Each asks its agent
# `shoal ok-to-stop node1 node2`, which says no (one voter of three would be left).
for i in 1 2; do on "$i" cp -p /etc/shoal/agent.toml /etc/shoal/agent.toml.lab; done
SNAP_BATCH=$(snapshot)
GEN_BATCH=$(generations)
# The release installed by the upgrade above stays (only the configs change).
if play batch-blocks.log site.yml --limit node1,node2 -e shoal_failure_domain=rack-a \
    -e "shoal_version=$VERSION+lab" -e "shoal_release_dir=$OUT/releases" \
    -e shoal_log_level=error -e shoal_gate_retries=3; then
  fail "node1 and node2 were restarted together, leaving one of three voters"
fi
check "the play stopped at ok-to-stop on both hosts of the batch" \
  sh -c "grep -qF 'node1: NOT ok to stop' '$LAST_LOG' && grep -qF 'node2: NOT ok to stop' '$LAST_LOG'"
check "the one call named both nodes and the two voters they hold" \
  sh -c "grep -qE 'NOT ok to stop node1 \\([0-9a-f]{16} in rack-a\\), node2 \\([0-9a-f]{16} in rack-b\\) together' '$LAST_LOG' &&
         grep -qF 'stopping voters node1, node2 together' '$LAST_LOG'"
check "no agent restarted (generations $GEN_BATCH)" test "$(generations)" = "$GEN_BATCH"
for i in 1 2; do on "$i" mv /etc/shoal/agent.toml.lab /etc/shoal/agent.toml; done
check "node1's and node2's configs put back as they run" test "$(snapshot)" = "$SNAP_BATCH"
check "every agent is alive and sees every other" wait_all_alive

# ---------------------------------------------------------------------------------------
say "the gate holds: with node3's agent stopped, a rolling restart stops before restarting node1"
on 3 systemctl stop shoal-agent
SNAP2=$(snapshot)
GEN_BEFORE=$(on 1 shoal status --json | status generation)
if play gate-blocks.log site.yml -e shoal_log_level=warn -e shoal_gate_retries=3; then
  fail "the rolling restart went on with node3 down"
fi
check "the play stopped at ok-to-stop for node1 (stopping it would leave 1 of 3 voters)" \
  grep -qF "node1: NOT ok to stop" "$LAST_LOG"
check "node1's agent was not restarted (generation $GEN_BEFORE)" \
  test "$(on 1 shoal status --json | status generation)" = "$GEN_BEFORE"
only_node1_changed() {  # node1 has the new config; node2 and node3 kept theirs
  on 1 grep -qx 'level = "warn"' /etc/shoal/agent.toml &&
    test "$(snapshot | grep -v '^node1 ')" = "$(grep -v '^node1 ' <<<"$SNAP2")"
}
check "only the first failure domain (node1) was changed; node2 and node3 untouched" only_node1_changed

# ---------------------------------------------------------------------------------------
say "drain.yml -e node=node2"
if "$BIN/shoal" drain --help >/dev/null 2>&1; then
  on 3 systemctl start shoal-agent
  check "every agent is alive again before the drain" wait_all_alive
  play drain.log drain.yml -e node=node2 || fail "drain.yml failed"
  check "drain.yml waited until node2 was drained" grep -qE "node2: 100%.*drained" "$LAST_LOG"
  drained_everywhere() {
    # Read the whole answer before grep: `cmd | grep -q` under pipefail fails at random
    # when grep exits at its first match while cmd is still writing (EPIPE).
    local i out
    for i in 1 3; do
      out=$(on "$i" shoal drain status node2 --json) || return 1
      grep -q '"state": "drained"' <<<"$out" || return 1
    done
  }
  check "node1 and node3 see node2 drained" drained_everywhere
  on 1 shoal undrain node2 >/dev/null || fail "undrain node2"
  ok "shoal undrain returned node2 to active"
else
  if play drain.log drain.yml -e node=node2; then fail "drain.yml succeeded without a drain CLI"; fi
  check "without \`shoal drain\`, drain.yml stops with \"drain is not available in this shoal version\"" \
    grep -qF "node2: drain is not available in this shoal version" "$LAST_LOG"
fi

check "the cluster CA was never regenerated" test "$(sha256sum "$STATE/ca/ca.pem" "$STATE/ca/ca.key" "$STATE/ca/cluster.key")" = "$CA0"
LAST_LOG=
say "all Ansible checks passed"

#!/bin/bash
# ansible/tests/v2.sh [BIN_DIR] - shoal's resource reservation on a real cgroup v2 kernel
# (issue 17): a VM of the lab (lab/vm.sh: Debian's kernel, systemd 252, QEMU TCG) becomes a
# shoal node through site.yml and the role's unit (Delegate=yes, enforcement = "required").
#
# Run as root from anywhere:  ansible/tests/v2.sh target/debug
# BIN_DIR holds the built `shoal-agent` and `shoal` (default target/debug, or $SHOAL_BIN_DIR);
# the resource-guard contract test is built with cargo (CARGO_TARGET_DIR is honoured).
#
# 1. the CgroupFs contract suite (tests/cgroup_v2.rs: file-level checks, a mount joining and
#    staying for the next agent, a crashed agent's group replaced, a live agent's group
#    refused) as root in a delegated unit of the VM;
# 2. site.yml converges the VM (one node, lab/v2/) and a second run reports changed=0;
# 3. the agent's status shows the reservation enforced, and the kernel agrees: cpuset.cpus and
#    memory.max of shoal-agent.service/shoal as configured, the agent in cgroup.procs;
# 4. `shoal mount` (its own unit) joins the reservation;
# 5. memory pressure: 192 MiB written through the mount into a 160 MiB reservation while a
#    process outside it holds 640 MiB: memory.current never above memory.max, memory.events
#    shows the limit at work (max > 0) and no OOM kill, the agent is the same process, the
#    outside process kept its memory, the file is whole;
# 6. kill -9 of the agent (the mount stays): systemd restarts it (ExecStopPost turned the
#    controllers off), the new agent replaces the stale group and takes the mount over;
# 7. a clean restart: the mount stays in the group and is confined by the next agent;
# the VM is powered off at the end, also on failure (trap).
# The kernel, initramfs and disk image are cached by vm.sh (/var/tmp/shoal-tools/v2vm).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ANS=$REPO/ansible
VM=$ANS/lab/vm.sh
BIN_DIR=${1:-${SHOAL_BIN_DIR:-target/debug}}
case $BIN_DIR in /*) ;; *) BIN_DIR=$REPO/$BIN_DIR;; esac
# shellcheck source=venv.sh
. "$ANS/tests/venv.sh"     # VENV, shoal_ansible_venv
export STATE=${STATE:-$REPO/.lab}   # shared with vm.sh: console log, pid file (git-ignored)
OUT=$STATE/v2-test                  # this run's logs, binaries and the CA
PORT=${SHOAL_VM_SSH_PORT:-47022}
KEY=${SHOAL_VM_CACHE:-/var/tmp/shoal-tools/v2vm}/id_ed25519
G=/sys/fs/cgroup/system.slice/shoal-agent.service   # the unit's cgroup in the VM
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
  if [ -n "${VM_UP:-}" ]; then
    if [ $rc -ne 0 ]; then
      say "the VM's agent journal (last 30 lines)"
      timeout 30 "$VM" ssh journalctl -u shoal-agent --no-pager -n 30 2>&1 | cut -c1-300 || true
    fi
    if [ -n "${SHOAL_VM_KEEP:-}" ]; then
      say "SHOAL_VM_KEEP is set: the VM stays up (ansible/lab/vm.sh ssh ...; vm.sh down)"
    else
      say "powering the VM off"; "$VM" down || true
    fi
  fi
  echo
  if [ $rc -eq 0 ]; then echo "cgroup-v2: $PASS passed, 0 failed"; else echo "cgroup-v2: $PASS passed, 1 failed"; fi
  say "done (rc=$rc)"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" = 0 ] || fail "run as root (apt, the VM's disk image, the Ansible CA)"
for b in shoal-agent shoal; do
  [ -x "$BIN_DIR/$b" ] || fail "$BIN_DIR/$b is missing: build first (cargo build --workspace)"
done
rm -rf "$OUT"; mkdir -p "$OUT/bin" "$OUT/share"
# Debug builds carry ~150 MB of symbols: the VM gets (and Ansible copies) stripped copies.
for b in shoal-agent shoal; do strip -o "$OUT/bin/$b" "$BIN_DIR/$b"; done
BIN=$OUT/bin

say "the contract test binary (cargo test --no-run)"
LAST_LOG=$OUT/cargo.log
CONTRACT=$(cd "$REPO" && cargo test -p shoal-resource-guard --test cgroup_v2 --no-run --locked \
  --message-format=json 2>"$LAST_LOG" | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "cgroup_v2":
        print(m["executable"])')
[ -x "$CONTRACT" ] || fail "no cgroup_v2 test binary"
strip -o "$OUT/share/cgroup_v2" "$CONTRACT"

say "Python venv with ansible-core ($VENV)"
shoal_ansible_venv
export ANSIBLE_HOME=$STATE/ansible-home ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
export ANSIBLE_HOST_KEY_CHECKING=False
export ANSIBLE_SSH_COMMON_ARGS="-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
cd "$ANS"   # ansible.cfg is read from here

# ---------------------------------------------------------------------------------------
say "the VM: kernel, initramfs and disk image (cached), then boot"
"$VM" down   # a VM left by a killed run; safe when none is running
VM_UP=1
LAST_LOG=$OUT/vm-build.log
timeout 900 "$VM" build >"$LAST_LOG" 2>&1 || fail "vm.sh build"
LAST_LOG=$OUT/vm-up.log
timeout 300 "$VM" up "$OUT/share" >"$LAST_LOG" 2>&1 || fail "vm.sh up"
sed 's/^/    /' "$LAST_LOG"
LAST_LOG=
on() { timeout "${ON_TIMEOUT:-120}" "$VM" ssh "$@"; }
check "the VM runs cgroup v2 with cpuset, cpu and memory ($(on uname -r), $(on systemctl --version | sed -n '1s/ (.*//p'))" \
  on 'grep -qw cgroup2 /proc/mounts && c=$(cat /sys/fs/cgroup/cgroup.controllers) &&
      for x in cpuset cpu memory; do echo " $c " | grep -q " $x " || exit 1; done'

# ---------------------------------------------------------------------------------------
say "the resource-guard contract suite on the real cgroup v2 kernel"
LAST_LOG=$OUT/contract.log
on systemd-run --quiet --pipe --wait --collect -p Delegate=yes -E SHOAL_TEST_CGROUP_V2=1 \
  /mnt/host/cgroup_v2 --nocapture >"$LAST_LOG" 2>&1 || fail "contract suite on cgroup v2"
check "real_cgroup_v2_keeps_the_contract passed, as root in a Delegate=yes unit" \
  grep -q '^test real_cgroup_v2_keeps_the_contract ... ok$' "$LAST_LOG"

# ---------------------------------------------------------------------------------------
say "site.yml on the VM (enforcement = \"required\")"
play() {
  LAST_LOG=$OUT/$1; shift
  timeout 600 ansible-playbook -i lab/v2/inventory.yml -e "ansible_port=$PORT" \
    -e "ansible_ssh_private_key_file=$KEY" -e "shoal_build_dir=$BIN" -e "shoal_ca_dir=$OUT/ca" \
    "$@" >"$LAST_LOG" 2>&1
}
recap() { sed -n 's/^\(v2node\) *: .*changed=\([0-9]*\).*failed=\([0-9]*\).*/changed=\2 failed=\3/p' "$1"; }
play converge.log site.yml || fail "site.yml did not converge"
ok "site.yml converged ($(recap "$LAST_LOG"))"
check "agent.toml says enforcement = \"required\"" on grep -qx "'enforcement = \"required\"'" /etc/shoal/agent.toml
play idempotent.log site.yml || fail "the second site.yml run failed"
check "a second run reports changed=0 ($(recap "$LAST_LOG"))" test "$(recap "$LAST_LOG")" = "changed=0 failed=0"
LAST_LOG=

# ---------------------------------------------------------------------------------------
say "the reservation, as the agent reports it and as the kernel has it"
MEM=$((160 << 20))
main_pid() { on systemctl show -p MainPID --value shoal-agent; }
AGENT=$(main_pid)
status_enforced() {  # the agent's own view: shoal status --json
  on shoal status --json | python3 -c '
import json, sys
r = json.load(sys.stdin)["resources"]
print("    resources:", json.dumps(r))
sys.exit(not (r["enforced"] and r["note"] is None and r["cpus"] == "1" and r["memory_limit_bytes"] == int(sys.argv[1])
              and r["cgroup"] == "/sys/fs/cgroup/system.slice/shoal-agent.service/shoal"))' "$MEM"
}
check "shoal status: enforced, cpus 1, memory 160 MiB, cgroup .../shoal-agent.service/shoal" status_enforced
unit_props() {
  local p; p=$(on systemctl show shoal-agent -p Delegate -p ActiveState -p NRestarts)
  echo "    $p" | tr '\n' ' '; echo
  grep -qx Delegate=yes <<<"$p" && grep -qx ActiveState=active <<<"$p"
}
check "the unit is active with Delegate=yes" unit_props
kernel_has() {  # PIDS...: the group's files in the VM hold the reservation, and these pids
  local got pid
  got=$(on "echo cpus=\$(cat $G/shoal/cpuset.cpus) max=\$(cat $G/shoal/memory.max) subtree=\$(cat $G/cgroup.subtree_control | tr ' ' ,) procs=\$(cat $G/shoal/cgroup.procs | sort -n | tr '\n' ,) parent=\$(cat $G/cgroup.procs | tr '\n' ,)")
  echo "    $got"
  case $got in "cpus=1 max=$MEM subtree=cpuset,cpu,memory "*" parent=") ;; *) return 1;; esac
  for pid in "$@"; do case $got in *"procs="*"$pid,"*) ;; *) return 1;; esac; done
}
check "kernel: cpuset.cpus 1, memory.max $MEM in .../shoal, the agent ($AGENT) in it, none in the unit's own cgroup" \
  kernel_has "$AGENT"

# ---------------------------------------------------------------------------------------
say "shoal mount (a unit of its own) joins the reservation"
on 'mkdir -p /mnt/shoal && systemd-run --quiet --unit=shoal-mount-test shoal mount /mnt/shoal &&
    for i in $(seq 1 100); do mountpoint -q /mnt/shoal && exit 0; sleep 0.2; done; exit 1' ||
  fail "shoal mount /mnt/shoal did not mount"
MOUNT=$(on systemctl show -p MainPID --value shoal-mount-test)
in_group() {  # PIDS...: each one in the reservation within 10 s
  local pid missing
  for _ in $(seq 1 20); do
    missing=
    for pid in "$@"; do on grep -qx "$pid" "$G/shoal/cgroup.procs" || missing=1; done
    [ -z "$missing" ] && return 0
    sleep 0.5
  done
  return 1
}
check "the mount ($MOUNT) is in the agent's group" in_group "$AGENT" "$MOUNT"

# ---------------------------------------------------------------------------------------
say "memory pressure: 192 MiB through the mount into the 160 MiB reservation, 640 MiB held outside it"
LAST_LOG=$OUT/pressure.log
ON_TIMEOUT=900 on "G=$G/shoal
    echo 0 > /tmp/pressure.done
    # Outside the reservation (in this ssh session's cgroup): take 640 MiB and hold it while
    # sampling the reservation's memory.current every 0.2 s, until the write is done.
    python3 -c '
import sys, time
g = sys.argv[1]
b = bytearray(640 << 20)
for i in range(0, len(b), 4096): b[i] = 1
print(\"outside: 640 MiB touched\", flush=True)
top = n = 0
while open(\"/tmp/pressure.done\").read().strip() != \"1\":
    top = max(top, int(open(g + \"/memory.current\").read())); n += 1
    time.sleep(0.2)
print(f\"max sample: {top} of {n} samples\")
print(\"outside: still holding\", sum(b[::4096]) == len(b) // 4096)
' \$G > /tmp/outside.log 2>&1 & P=\$!
    t0=\$(date +%s)
    head -c $((192 << 20)) /dev/urandom | tee /mnt/shoal/pressure | sha256sum > /tmp/written.sum
    echo \"write: \$(( \$(date +%s) - t0 )) s\"
    echo 1 > /tmp/pressure.done; wait \$P; echo \"outside rc=\$?\"; cat /tmp/outside.log
    echo \"memory.max: \$(cat \$G/memory.max) memory.peak: \$(cat \$G/memory.peak)\"
    cat \$G/memory.events
    grep -E '^(anon|file|file_mapped|pgmajfault) ' \$G/memory.stat | tr '\\n' ' '; echo
    echo \"memory.pressure: \$(sed -n 1p \$G/memory.pressure)\"
    echo \"kernel OOM kills: \$(journalctl -k --no-pager | grep -c 'Out of memory' || true)\"" >"$LAST_LOG" 2>&1 || fail "the write load"
sed 's/^/    /' "$LAST_LOG"
field() { sed -n "s/^$1 \([0-9][0-9]*\)$/\1/p" "$LAST_LOG" | sed -n 1p; }
check "memory.current never above memory.max (sampled every 0.2 s)" \
  test "$(sed -n 's/^max sample: \([0-9]*\) .*/\1/p' "$LAST_LOG")" -le "$MEM"
check "memory.peak within memory.max" \
  test "$(sed -n 's/.* memory.peak: \([0-9]*\)$/\1/p' "$LAST_LOG")" -le "$MEM"
check "memory.events: the limit did the work (max $(field max) > 0)" test "$(field max)" -gt 0
check "memory.events: no OOM kill in the reservation (oom $(field oom), oom_kill $(field oom_kill))" \
  test "$(field oom_kill)" = 0 -a "$(field oom)" = 0
check "no OOM kill anywhere in the VM (kernel log)" grep -qx 'kernel OOM kills: 0' "$LAST_LOG"
check "the process outside the reservation kept its 640 MiB throughout" \
  sh -c "grep -qx 'outside rc=0' '$LAST_LOG' && grep -qx 'outside: still holding True' '$LAST_LOG'"
check "the agent is the same process, never restarted ($AGENT)" \
  test "$(main_pid) $(on systemctl show -p NRestarts --value shoal-agent)" = "$AGENT 0"
whole() { on 'cd /mnt/shoal && sha256sum < pressure | cmp -s - /tmp/written.sum'; }
check "the file reads back whole through the mount (sha256)" whole
LAST_LOG=

# ---------------------------------------------------------------------------------------
say "kill -9 of the agent with the mount in its group"
on 'echo before-the-crash > /mnt/shoal/marker' || fail "write through the mount"
on systemctl kill --kill-who=main -s KILL shoal-agent
restarted() {  # OLD_PID: a new main process, active, within 60 s
  local pid
  for _ in $(seq 1 60); do
    pid=$(main_pid)
    if [ "$pid" != 0 ] && [ "$pid" != "$1" ] && [ "$(on systemctl is-active shoal-agent)" = active ] &&
      on shoal status --json >/dev/null 2>&1; then
      AGENT=$pid; return 0
    fi
    sleep 1
  done
  return 1
}
check "systemd restarted the agent (no 219/CGROUP: ExecStopPost turned the controllers off)" restarted "$AGENT"
check "the new agent ($AGENT) replaced the stale group and took the mount ($MOUNT) over" \
  on "journalctl -u shoal-agent -o cat --no-pager | grep -q 'replaced a stale cgroup.*taken_over=\\[$MOUNT\\]'"
check "shoal status: enforced again" status_enforced
check "kernel: the reservation in force, the new agent and the mount in it" kernel_has "$AGENT" "$MOUNT"
check "the mount serves a file written before the crash" on grep -qx before-the-crash /mnt/shoal/marker

# ---------------------------------------------------------------------------------------
say "a clean restart of the agent with the mount in its group"
OLD=$AGENT
on systemctl restart shoal-agent
check "the agent restarted" restarted "$OLD"
check "the old agent left its group to the mount" \
  on "journalctl -u shoal-agent -o cat --no-pager | grep -q 'left the agent.s cgroup; it stays for the processes still in it'"
check "the next agent took the mount over, the reservation in force" kernel_has "$AGENT" "$MOUNT"
check "shoal status: enforced" status_enforced
on systemctl stop shoal-mount-test || true
say "all cgroup v2 checks passed"

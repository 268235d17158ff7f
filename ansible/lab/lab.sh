#!/bin/bash
# lab.sh - N systemd-nspawn "GPU nodes" for testing the shoal Ansible roles on one machine.
#
# Each node boots real systemd as PID 1 with its own hostname, machine-id, ssh host keys,
# network namespace and address, and a directory /srv/nvme0 standing in for its NVMe. The
# nodes sit on a private bridge that lives in a network namespace of its own together with
# the Ansible controller (`lab.sh ctl CMD`). Nothing is added to the machine's own network
# namespace and the lab has no route out. Works on a host WITHOUT systemd as PID 1 and with a
# hybrid cgroup v1/v2 layout. Recipe and pitfalls: shared/ANSIBLE-LAB.md.
#
#   lab.sh deps          install systemd-nspawn and mmdebstrap with apt if missing
#   lab.sh base          bootstrap the shared read-only node rootfs (cached; fast when present)
#   lab.sh up N          boot nodes 1..N and wait until each one's systemd is up
#   lab.sh ctl CMD...    run CMD on this machine inside the lab network namespace (Ansible)
#   lab.sh exec I CMD... run CMD inside node I
#   lab.sh down N        stop nodes 1..N and remove the namespaces (safe when nothing is up)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MACHINES=${MACHINES:-/var/lib/machines}
BASE=${BASE:-$MACHINES/shoal-lab-base}   # shared rootfs, lower layer of every node
OV=${OV:-$MACHINES/shoal-lab-ov}         # per-node overlay upper/work dirs
STATE=${STATE:-$REPO/.lab}               # ssh key, pid files, console logs (git-ignored)
RUN=$STATE/run
KEY=$STATE/id_ed25519
LAB=shoal-lab                            # netns holding bridge br0 and the controller
# Private /24 that exists only inside the namespaces this script creates: the lab's own test
# hosts, unreachable from (and unable to reach) any real network.
NET=${NET:-10.77.0}
SUITE=${SUITE:-bookworm}
# The node rootfs needs: systemd as init, dbus (hostnamectl/facts), python3 (Ansible
# modules), sshd (Ansible's transport), iproute2 (facts about addresses).
PKGS=systemd,systemd-sysv,dbus,python3,openssh-server,iproute2
MIRROR=${MIRROR:-$(sed -n 's/^URIs: //p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | sed -n 1p)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

log() { echo "[lab $(date +%T)] $*" >&2; }

deps() {
  local missing=
  command -v systemd-nspawn >/dev/null || missing+=" systemd-container"
  command -v mmdebstrap >/dev/null || missing+=" mmdebstrap"
  command -v ssh-keygen >/dev/null || missing+=" openssh-client"   # keys; Ansible's transport
  command -v pgrep >/dev/null || missing+=" procps"
  if [ -n "$missing" ]; then
    log "installing$missing"
    apt-get update -qq
    # shellcheck disable=SC2086  # one word per package
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
}

base() {
  deps
  # Marker written last: a bootstrap killed half-way is redone, a finished one is reused.
  if [ ! -f "$BASE/.shoal-lab-base-ok" ]; then
    rm -rf "$BASE"
    log "bootstrapping $SUITE into $BASE from $MIRROR"
    mmdebstrap --quiet --variant=minbase --include=$PKGS "$SUITE" "$BASE" "$MIRROR"
    # Per-node identity lives in each node's overlay, not in the shared rootfs.
    : > "$BASE/etc/machine-id"
    # dbus copies the id here on first boot; Ansible's ansible_machine_id reads this file.
    ln -sfn /etc/machine-id "$BASE/var/lib/dbus/machine-id"
    rm -f "$BASE"/etc/ssh/ssh_host_*
    rm -f "$BASE"/var/cache/apt/archives/*.deb
    touch "$BASE/.shoal-lab-base-ok"
  fi
  mkdir -p "$STATE"
  [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C shoal-lab-controller -f "$KEY"
  # The controller's key may be new even when the rootfs is cached.
  install -d -m 700 "$BASE/root/.ssh"
  install -m 600 "$KEY.pub" "$BASE/root/.ssh/authorized_keys"
}

net_up() {  # $1 = number of nodes
  ip netns add $LAB
  ip -n $LAB link set lo up
  ip -n $LAB link add br0 type bridge
  ip -n $LAB addr add $NET.1/24 dev br0
  ip -n $LAB link set br0 up
  for i in $(seq 1 "$1"); do
    ip netns add shoal-node$i
    ip -n $LAB link add vnode$i type veth peer name eth0 netns shoal-node$i
    ip -n $LAB link set vnode$i master br0 up
    ip -n shoal-node$i link set lo up
    ip -n shoal-node$i addr add $NET.$((10 + i))/24 dev eth0
    ip -n shoal-node$i link set eth0 up
    # Dead-end default route (the lab netns has no uplink and does not forward) so that
    # ansible_default_ipv4 is filled in as on a real node.
    ip -n shoal-node$i route add default via $NET.1
  done
}

net_down() {  # $1 = number of nodes
  for i in $(seq 1 "$1"); do ip netns del shoal-node$i 2>/dev/null || true; done
  ip netns del $LAB 2>/dev/null || true
}

# `nspawn --keep-unit --register=no` (needed: no systemd/D-Bus on the host) leaves the
# container in *our* cgroup. Give every node its own child cgroup in every hierarchy, or all
# guests share one tree and their systemds kill each other's services.
enter_cgroup() {  # $1 = cgroup name
  local lines line _x ctrls path dir cg
  mapfile -t lines < /proc/self/cgroup      # read once: we move while iterating
  for line in "${lines[@]}"; do
    IFS=: read -r _x ctrls path <<<"$line"
    if [ -z "$ctrls" ]; then dir=/sys/fs/cgroup/unified; else dir=/sys/fs/cgroup/${ctrls#name=}; fi
    [ -d "$dir" ] || continue
    cg=$dir${path%/}/$1
    mkdir -p "$cg"
    if [ -f "$cg/cpuset.cpus" ] && [ -z "$(cat "$cg/cpuset.cpus")" ]; then
      cat "$dir${path%/}/cpuset.cpus" > "$cg/cpuset.cpus"
      cat "$dir${path%/}/cpuset.mems" > "$cg/cpuset.mems"
    fi
    echo $BASHPID > "$cg/cgroup.procs"
  done
}

node_up() {  # $1 = index, $2 = number of nodes; boots the node in the background
  local i=$1 n=node$1 root=$MACHINES/shoal-node$1 up=$OV/node$1/upper j
  mkdir -p "$up/etc/ssh" "$OV/$n/work" "$root" "$RUN"
  echo $n > "$up/etc/hostname"
  { printf '127.0.0.1\tlocalhost\n%s.1\tcontroller\n' $NET
    for j in $(seq 1 "$2"); do printf '%s.%d\tnode%d\n' $NET $((10 + j)) $j; done
  } > "$up/etc/hosts"
  echo 'nameserver 127.0.0.1' > "$up/etc/resolv.conf"   # hermetic: no real DNS, fail fast
  [ -s "$up/etc/machine-id" ] || systemd-id128 new > "$up/etc/machine-id"
  [ -f "$up/etc/ssh/ssh_host_ed25519_key" ] || ssh-keygen -q -A -f "$up"
  # Stand-in for the node's NVMe: the agent's data dir must exist before the play runs
  # (the play refuses to create it on the root filesystem).
  mkdir -p "$up/srv/nvme0/shoal"
  mountpoint -q "$root" ||
    mount -t overlay overlay -o "lowerdir=$BASE,upperdir=$up,workdir=$OV/$n/work" "$root"
  # Supervisor loop: nspawn exits 133 when the guest reboots and expects its caller to
  # start it again (systemd-nspawn@.service does that on a systemd host).
  ( enter_cgroup shoal-lab-$n
    while :; do
      systemd-nspawn --boot --register=no --keep-unit --console=read-only --resolv-conf=off \
        --machine=$n -D "$root" --network-namespace-path=/run/netns/shoal-$n \
        ${NSPAWN_EXTRA:-} && rc=0 || rc=$?
      echo "nspawn exited rc=$rc"; [ $rc -eq 133 ] || exit $rc
    done ) >> "$RUN/$n.console.log" 2>&1 < /dev/null &
  echo $! > "$RUN/$n.loop.pid"
}

nspawn_pid() { pgrep -P "$(cat "$RUN/node$1.loop.pid")" -x systemd-nspawn | sed -n 1p; }
leader() { pgrep -P "$(nspawn_pid "$1")" | sed -n 1p; }

node_wait() {  # $1 = index; until `systemctl is-system-running` says running/degraded (60 s)
  local i=$1 st=none L
  for _ in $(seq 1 600); do
    if L=$(leader "$i" 2>/dev/null) && [ -n "$L" ]; then
      st=$(nsenter -t "$L" -a -- systemctl is-system-running 2>/dev/null || true)
      case "$st" in running|degraded) log "node$i: $st"; return 0;; esac
    fi
    sleep 0.1
  done
  log "node$i: not up after 60 s (state: $st); console: $RUN/node$i.console.log"
  return 1
}

node_down() {  # $1 = index; safe when the node was never started
  local i=$1 loop pid
  loop=$(cat "$RUN/node$i.loop.pid" 2>/dev/null || true)
  if [ -n "$loop" ] && kill -0 "$loop" 2>/dev/null; then
    pid=$(nspawn_pid "$i" || true)
    [ -n "$pid" ] && kill -TERM "$pid"     # SIGTERM to nspawn = orderly guest poweroff
    for _ in $(seq 1 300); do kill -0 "$loop" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$loop" 2>/dev/null; then   # still there after 30 s: force it
      pid=$(nspawn_pid "$i" || true)
      [ -n "$pid" ] && kill -KILL "$pid"
      kill -KILL "$loop" 2>/dev/null || true
      sleep 0.5
    fi
  fi
  umount "$MACHINES/shoal-node$i" 2>/dev/null || true
  rmdir "$MACHINES/shoal-node$i" 2>/dev/null || true
  # Remove the node's cgroups in every hierarchy (deepest first).
  find /sys/fs/cgroup/ -mindepth 2 -maxdepth 6 -type d -name "shoal-lab-node$i" 2>/dev/null |
    while read -r cg; do find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true; done
  [ -n "${KEEP_OVERLAY:-}" ] || rm -rf "${OV:?}/node$i"
  rm -f "$RUN/node$i.loop.pid"
}

cmd=${1:-}; shift || true
case $cmd in
  deps) deps;;
  base) base;;
  up) n=${1:?usage: lab.sh up N}; net_up "$n"
      for i in $(seq 1 "$n"); do node_up "$i" "$n"; done
      for i in $(seq 1 "$n"); do node_wait "$i"; done;;
  down) n=${1:?usage: lab.sh down N}
        for i in $(seq 1 "$n"); do node_down "$i" & done; wait; net_down "$n";;
  ctl) exec nsenter --net=/run/netns/$LAB -- "$@";;
  exec) i=$1; shift; exec nsenter -t "$(leader "$i")" -a -- "$@";;
  *) sed -n '3,16p' "$0"; exit 2;;
esac

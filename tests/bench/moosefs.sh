#!/usr/bin/env bash
# A MooseFS 3 reference cluster on this machine, for side-by-side benchmarks: one master and
# three chunkservers on loopback, goal 2, mounted with mfsmount.
#
#   tests/bench/moosefs.sh up DIR MOUNTPOINT    start (installs the Debian packages as root)
#   tests/bench/moosefs.sh down DIR MOUNTPOINT  unmount and stop every process
#
# Everything lives under DIR (configs, metadata, chunks, logs); ports 9519-9521 (master) and
# 9522-9524 (chunkservers) so that a system-wide MooseFS is left alone. The chunkservers
# refuse a master on 127.x, so it listens on this host's first address (hostname -I).
# Root only (the packages, the mount). Exit status: 0 done; 1 a step failed; 2 usage.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}
die() { echo "moosefs.sh: $*" >&2; exit 1; }

[ $# -eq 3 ] || usage
action="$1"; dir="$2"; mnt="$3"
[ "$(id -u)" = 0 ] || die "run as root (packages, mount)"
case "$dir" in /*) ;; *) dir="$(pwd)/$dir" ;; esac

chunkservers=3
master_ports=(9519 9520 9521) # metalogger, chunkservers, clients

down() {
  if mountpoint -q "$mnt" 2>/dev/null; then umount "$mnt" || umount -l "$mnt" || true; fi
  for i in $(seq 1 "$chunkservers"); do
    [ -f "$dir/cs$i/mfschunkserver.cfg" ] && mfschunkserver -c "$dir/cs$i/mfschunkserver.cfg" stop >/dev/null 2>&1 || true
  done
  [ -f "$dir/master/mfsmaster.cfg" ] && mfsmaster -c "$dir/master/mfsmaster.cfg" stop >/dev/null 2>&1 || true
  return 0
}

case "$action" in
  down) down; exit 0 ;;
  up) ;;
  *) usage ;;
esac

if ! command -v mfsmaster >/dev/null || ! command -v mfschunkserver >/dev/null || ! command -v mfsmount >/dev/null; then
  echo "== apt-get install moosefs-master moosefs-chunkserver moosefs-client" >&2
  export DEBIAN_FRONTEND=noninteractive
  pkgs=(moosefs-master moosefs-chunkserver moosefs-client)
  apt-get install -y -q "${pkgs[@]}" >&2 || { apt-get update -q >&2 && apt-get install -y -q "${pkgs[@]}" >&2; }
fi

host="$(hostname -I 2>/dev/null | awk '{ print $1 }')"
case "$host" in
  ''|127.*|*:*) die "MooseFS needs an IPv4 address that is not loopback (hostname -I gave '$host')" ;;
esac

down
rm -rf "$dir"
mkdir -p "$dir/master" "$mnt"
cat > "$dir/master/mfsmaster.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $dir/master
EXPORTS_FILENAME = $dir/master/mfsexports.cfg
MATOML_LISTEN_HOST = $host
MATOML_LISTEN_PORT = ${master_ports[0]}
MATOCS_LISTEN_HOST = $host
MATOCS_LISTEN_PORT = ${master_ports[1]}
MATOCL_LISTEN_HOST = $host
MATOCL_LISTEN_PORT = ${master_ports[2]}
EOF
echo "*  /  rw,alldirs,maproot=0" > "$dir/master/mfsexports.cfg"
cp /var/lib/mfs/metadata.mfs.empty "$dir/master/metadata.mfs"
mfsmaster -c "$dir/master/mfsmaster.cfg" start >"$dir/master.log" 2>&1 \
  || die "mfsmaster did not start: $(tail -5 "$dir/master.log")"

for i in $(seq 1 "$chunkservers"); do
  cs="$dir/cs$i"
  mkdir -p "$cs/chunks"
  cat > "$cs/mfschunkserver.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $cs
HDD_CONF_FILENAME = $cs/mfshdd.cfg
CSSERV_LISTEN_HOST = $host
CSSERV_LISTEN_PORT = $((9521 + i))
MASTER_HOST = $host
MASTER_PORT = ${master_ports[1]}
EOF
  echo "$cs/chunks" > "$cs/mfshdd.cfg"
  mfschunkserver -c "$cs/mfschunkserver.cfg" start >"$dir/cs$i.log" 2>&1 \
    || die "mfschunkserver $i did not start: $(tail -5 "$dir/cs$i.log")"
done

mfsmount "$mnt" -H $host -P "${master_ports[2]}" >"$dir/mount.log" 2>&1 \
  || die "mfsmount failed: $(tail -5 "$dir/mount.log")"
# Writes and free space wait for the chunkservers to register: give them up to 30 s.
for _ in $(seq 1 60); do
  # Free space shows once the chunkservers have reported theirs.
  free_kb="$(df -Pk "$mnt" 2>/dev/null | awk 'NR == 2 { print $4 }')"
  if [ "${free_kb:-0}" -gt 0 ] && mfssetgoal -r 2 "$mnt" >/dev/null 2>&1 \
     && echo probe > "$mnt/.probe" 2>/dev/null; then
    rm -f "$mnt/.probe"
    echo "moosefs.sh: MooseFS up, goal 2, $chunkservers chunkservers, mounted on $mnt" >&2
    exit 0
  fi
  sleep 0.5
done
die "MooseFS did not accept a write within 30 s (logs in $dir)"

#!/bin/bash
# vm.sh - a cgroup v2 "GPU node" for the shoal tests: a QEMU virtual machine (software
# emulation, TCG) booting Debian's own kernel with systemd as init on the unified cgroup
# hierarchy, the way production nodes run. The build machines are cgroup v1 and the nspawn lab
# shares their kernel, so this is the one place where shoal-agent meets a real cgroup v2 tree.
#
# The kernel (Debian's linux-image-amd64), a small busybox initramfs that loads the virtio,
# ext4, 9p and fuse modules, and a Debian disk image (mmdebstrap: systemd, udev, sshd,
# python3 for Ansible) are built once into $SHOAL_VM_CACHE (default
# /var/tmp/shoal-tools/v2vm) and reused while present; the VM runs on a throw-away copy-on-write
# layer (-snapshot), so the cached image never changes. The guest reaches nothing: user-mode
# networking with restrict=on, only ssh forwarded from 127.0.0.1:$SHOAL_VM_SSH_PORT. A host
# folder is shared read-only at /mnt/host (9p) for test binaries. /dev/kvm is not used: a KVM
# guest hangs at boot on these machines.
#
#   vm.sh deps            install qemu-system-x86, mmdebstrap, busybox-static, kmod, cpio with apt if missing
#   vm.sh build           kernel + initramfs + disk image into the cache (fast when cached)
#   vm.sh up [SHARE_DIR]  boot the VM (SHARE_DIR -> /mnt/host) and wait until systemd is up and ssh answers
#   vm.sh ssh CMD...      run CMD in the VM as root (stdin is passed on)
#   vm.sh down            power the VM off (forced after 30 s); safe when it is not running
#   vm.sh clean           remove the cache (the next build starts from nothing)
# Env: SHOAL_VM_CPUS (2), SHOAL_VM_MEMORY (1536 MiB), SHOAL_VM_SSH_PORT (47022),
#      SHOAL_VM_CACHE, STATE (repo/.lab: pid file, console log). Ansible: lab/v2/inventory.yml.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${SHOAL_VM_CACHE:-/var/tmp/shoal-tools/v2vm}
STATE=${STATE:-$REPO/.lab}
RUN=$STATE/vm
CPUS=${SHOAL_VM_CPUS:-2}
MEMORY=${SHOAL_VM_MEMORY:-1536}
PORT=${SHOAL_VM_SSH_PORT:-47022}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-$(sed -n 's/^URIs: //p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | sed -n 1p)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# The guest's rootfs: systemd as init, udev (device units), dbus, sshd and python3 (Ansible),
# iproute2 (address facts), procps (ps/pgrep for the tests).
PKGS=systemd,systemd-sysv,udev,dbus,python3,openssh-server,iproute2,procps
# Loaded by the initramfs (with their dependencies) and kept after the switch to the disk:
# the disk, the network, the 9p share, FUSE (shoal mount), and entropy.
MODULES="virtio_pci virtio_blk virtio_net ext4 9pnet_virtio 9p fuse virtio_rng"
# The guest's address on QEMU's user-mode network (its own, inside the VM only).
GUEST_ADDR=10.0.2.15

log() { echo "[vm $(date +%T)] $*" >&2; }
die() { log "error: $*"; exit 1; }

deps() {
  local missing=
  command -v qemu-system-x86_64 >/dev/null || missing+=" qemu-system-x86"
  command -v mmdebstrap >/dev/null || missing+=" mmdebstrap"
  [ -x /bin/busybox ] || missing+=" busybox-static"
  command -v depmod >/dev/null || missing+=" kmod"
  command -v cpio >/dev/null || missing+=" cpio"
  command -v ssh-keygen >/dev/null || missing+=" openssh-client"
  command -v mkfs.ext4 >/dev/null || missing+=" e2fsprogs"
  if [ -n "$missing" ]; then
    log "installing$missing"
    apt-get update -qq
    # shellcheck disable=SC2086  # one word per package
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
}

# The kernel package linux-image-amd64 points at now (e.g. linux-image-6.1.0-57-amd64).
kernel_package() {
  apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ { print $2; exit }'
}

# Kernel and initramfs into $CACHE/kernel-VERSION/ (vmlinuz, initrd.gz).
build_kernel() {
  local pkg dir tmp ver m
  pkg=$(kernel_package)
  if [ -z "$pkg" ]; then apt-get update -qq; pkg=$(kernel_package); fi
  [ -n "$pkg" ] || die "apt knows no linux-image-amd64 (check the apt sources)"
  dir=$CACHE/${pkg#linux-image-}
  ln -sfn "$dir" "$CACHE/kernel.new" && mv -T "$CACHE/kernel.new" "$CACHE/kernel"
  [ "$(cat "$dir/.ok" 2>/dev/null)" = "$RECIPE" ] && return 0
  log "kernel: $pkg (apt-get download, unpacked with dpkg-deb) and a busybox initramfs"
  rm -rf "$dir"; mkdir -p "$dir"
  tmp=$(mktemp -d)
  ( cd "$tmp" && apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' ) >&2 || true
  ls "$tmp"/*.deb >/dev/null 2>&1 || die "apt-get download $pkg failed"
  dpkg-deb -x "$tmp"/*.deb "$tmp/x"
  ver=$(ls "$tmp/x/lib/modules")
  cp "$tmp/x/boot/vmlinuz-$ver" "$dir/vmlinuz"
  depmod -b "$tmp/x" "$ver"
  # initramfs: busybox, the modules in dependency order, and /init.
  local ird=$tmp/initrd
  mkdir -p "$ird"/{bin,dev,proc,sys,newroot,lib/modules}
  cp /bin/busybox "$ird/bin/busybox"
  : > "$ird/modules"
  for m in $MODULES; do
    modprobe -d "$tmp/x" -S "$ver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
  done | awk '!seen[$0]++' | while read -r m; do
    cp "$m" "$ird/lib/modules/"
    basename "$m" >> "$ird/modules"
  done
  cat > "$ird/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# An optimised variant may not load on the emulated CPU; its generic twin follows.
while read -r m; do insmod "/lib/modules/$m" 2>/dev/null || echo "initramfs: $m not loaded"; done < /modules
for _ in $(seq 1 100); do [ -b /dev/vda ] && break; sleep 0.1; done
mount -t ext4 -o rw /dev/vda /newroot || { echo "initramfs: cannot mount /dev/vda"; exec sh; }
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
EOF
  chmod 755 "$ird/init"
  ( cd "$ird" && find . | cpio -o -H newc --quiet ) | gzip -1 > "$dir/initrd.gz"
  echo "$pkg $ver" > "$dir/version"
  rm -rf "$tmp"
  echo "$RECIPE" > "$dir/.ok"
}

# The disk image: $CACHE/disk.raw (ext4, no partition table) and the ssh key that logs in.
build_image() {
  local root
  mkdir -p "$CACHE"
  [ -f "$CACHE/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C shoal-v2vm -f "$CACHE/id_ed25519"
  [ "$(cat "$CACHE/disk.ok" 2>/dev/null)" = "$RECIPE" ] && return 0
  root=$CACHE/rootfs
  rm -rf "$root" "$CACHE/disk.raw" "$CACHE/disk.ok"
  log "disk image: bootstrapping $SUITE from $MIRROR"
  mmdebstrap --quiet --variant=minbase --include=$PKGS "$SUITE" "$root" "$MIRROR"
  echo shoal-v2 > "$root/etc/hostname"
  printf '127.0.0.1\tlocalhost\n%s\tshoal-v2\n' "$GUEST_ADDR" > "$root/etc/hosts"
  echo 'nameserver 127.0.0.1' > "$root/etc/resolv.conf"   # hermetic: no real DNS
  : > "$root/etc/machine-id"                                # made at first boot
  ln -sfn /etc/machine-id "$root/var/lib/dbus/machine-id"
  # Static address on QEMU's user network; the gateway is a dead end (restrict=on) that
  # fills ansible_default_ipv4 as on a real node.
  mkdir -p "$root/etc/systemd/network"
  cat > "$root/etc/systemd/network/10-qemu.network" <<EOF
[Match]
Name=en* eth*

[Network]
Address=$GUEST_ADDR/24
Gateway=10.0.2.2
EOF
  ln -sfn /lib/systemd/system/systemd-networkd.service \
    "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
  # Nothing waits for "online": the network is up as soon as networkd configured it.
  ln -sfn /dev/null "$root/etc/systemd/system/systemd-networkd-wait-online.service"
  # The host's share (test binaries), read-only.
  mkdir -p "$root/mnt/host" "$root/srv/nvme0/shoal"
  echo 'shoalhost /mnt/host 9p trans=virtio,version=9p2000.L,msize=262144,ro,nofail 0 0' > "$root/etc/fstab"
  install -d -m 700 "$root/root/.ssh"
  install -m 600 "$CACHE/id_ed25519.pub" "$root/root/.ssh/authorized_keys"
  # The host keys openssh-server's postinst made stay: Debian's ssh.service makes none at boot.
  rm -f "$root"/var/cache/apt/archives/*.deb
  # 3 GiB, sparse: the rootfs (~0.3 GiB) plus room for the agent's data and the test's writes.
  mkfs.ext4 -q -F -L shoal-v2 -d "$root" "$CACHE/disk.raw" 3G
  rm -rf "$root"
  echo "$RECIPE" > "$CACHE/disk.ok"
}

# The cache is rebuilt when its recipe changes: the build functions (as bash prints them,
# without comments) and what they take in.
recipe() {
  { declare -f build_kernel build_image; echo "$PKGS|$MODULES|$SUITE|$GUEST_ADDR"; } |
    sha256sum | cut -c1-16
}

build() { deps; mkdir -p "$CACHE"; RECIPE=$(recipe); build_kernel; build_image; }

pid() { cat "$RUN/qemu.pid" 2>/dev/null || true; }
running() { local p; p=$(pid); [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

ssh_vm() {
  ssh -q -i "$CACHE/id_ed25519" -p "$PORT" -o BatchMode=yes -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5 \
    -o ServerAliveInterval=10 -o ServerAliveCountMax=6 root@127.0.0.1 "$@"
}

up() {  # $1 = folder shared at /mnt/host (optional)
  local share=${1:-} st=none t0=$SECONDS
  [ -f "$CACHE/disk.ok" ] && [ -f "$CACHE/kernel/.ok" ] || die "not built: run vm.sh build"
  running && die "already running (pid $(pid)); vm.sh down first"
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    die "127.0.0.1:$PORT is taken (a VM of another checkout?): set SHOAL_VM_SSH_PORT to a free port"
  fi
  mkdir -p "$RUN"
  : > "$RUN/console.log"
  local virtfs=()
  if [ -n "$share" ]; then
    virtfs=(-virtfs "local,path=$share,mount_tag=shoalhost,security_model=none,readonly=on,id=host0")
  fi
  # -snapshot: the guest's writes go to a temporary layer, the cached image stays clean.
  qemu-system-x86_64 -name shoal-v2 -machine q35 -accel tcg,thread=multi -cpu max \
    -smp "$CPUS" -m "$MEMORY" -snapshot \
    -kernel "$CACHE/kernel/vmlinuz" -initrd "$CACHE/kernel/initrd.gz" \
    -append "console=ttyS0 panic=-1 mitigations=off systemd.unified_cgroup_hierarchy=1 systemd.show_status=false" \
    -drive "file=$CACHE/disk.raw,format=raw,if=virtio,cache=unsafe" \
    -netdev "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:$PORT-:22" \
    -device virtio-net-pci,netdev=n0 -device virtio-rng-pci \
    "${virtfs[@]}" \
    -display none -monitor none -serial "file:$RUN/console.log" \
    -no-reboot -daemonize -pidfile "$RUN/qemu.pid"
  log "booting (pid $(pid), console $RUN/console.log)"
  for _ in $(seq 1 240); do
    running || die "qemu exited; console: $(tail -5 "$RUN/console.log")"
    st=$(ssh_vm systemctl is-system-running 2>/dev/null) || true
    case "$st" in
      running|degraded) log "up in $((SECONDS - t0)) s (systemd: $st)"; return 0;;
    esac
    sleep 1
  done
  die "not up after $((SECONDS - t0)) s (systemd: $st); console: $RUN/console.log"
}

down() {
  local p; p=$(pid)
  if running; then
    ssh_vm systemctl poweroff >/dev/null 2>&1 || true
    for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then log "forcing qemu $p off"; kill -KILL "$p"; fi
  fi
  rm -f "$RUN/qemu.pid"
}

cmd=${1:-}; shift || true
case $cmd in
  deps) deps;;
  build) build;;
  up) up "${1:-}";;
  ssh) ssh_vm "$@";;
  down) down;;
  clean) down; rm -rf "${CACHE:?}";;
  *) sed -n '2,23p' "$0"; exit 2;;
esac

#!/usr/bin/env bash
# Builds the provider's offline Debian 12 (bookworm) qcow2 images:
#   capl-debian-12.qcow2          base: cloud image with cloud-init (NoCloud), qemu-guest-agent
#   capl-debian-12-haproxy.qcow2  haproxy: the same plus haproxy (control-plane load balancer)
#   capl-node-<k8s version>.qcow2 node: a Kubernetes node (kubeadm, kubelet, containerd,
#                                 the control-plane and CNI images), see node/README.md
#
# Usage (as root): images/build.sh [--force] [base] [haproxy] [node]
#   (no variant: base and haproxy; --base-only and --haproxy-only are kept as aliases)
#
# Environment:
#   CAPL_IMAGE_DIR     output directory (default /var/cache/capi-libvirt/images)
#   CAPL_DEB_CACHE     .deb cache shared by builds (default $CAPL_IMAGE_DIR/debs)
#   SOURCE_DATE_EPOCH  timestamp for mmdebstrap (default: pinned below)
#   CAPL_MIRROR, CAPL_SECURITY_MIRROR
#                      Debian archive URIs (default: read from /etc/apt)
#   KUBERNETES_VERSION node: the Kubernetes release (default: hack/tools/envtest's pin)
#
# An image is rebuilt only when its recipe hash changes: this script, lib.sh, customize.sh,
# the package lists, suite, mirrors and the mmdebstrap/GRUB versions (for the node
# image also images/node/, images/oci/ and the key of its binaries). The hash is
# the first line of <image>.manifest, written after the image has been renamed
# into place; an image without a matching manifest is never reused.
# Prints the image paths on stdout, one per line; logs go to stderr.
set -euo pipefail
umask 022 # what the script writes into an image has the same modes whatever the caller's umask

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec 3>&1 1>&2 # stdout is for the image paths only

. "$here/lib.sh" # definitions only; the mirrors are read after the checks below

usage() {
  sed -n '2,26s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
}

variants=() force=0
while (($#)); do
  case $1 in
  base | haproxy | node) variants+=("$1") ;;
  --base-only) variants+=(base) ;;
  --haproxy-only) variants+=(haproxy) ;;
  --force) force=1 ;;
  -h | --help)
    usage
    exit 0
    ;;
  *)
    usage
    die "unknown argument: $1"
    ;;
  esac
  shift
done
((${#variants[@]})) || variants=(base haproxy)

[[ $(id -u) -eq 0 ]] || die "run as root (mmdebstrap root mode, loop devices, mounts)"
for tool in mmdebstrap sfdisk losetup partx mkfs.ext4 grub-install qemu-img flock sha256sum; do
  command -v "$tool" >/dev/null || die "missing $tool; run hack/prepare-host.sh"
done
[[ -d /usr/lib/grub/i386-pc ]] || die "missing GRUB's i386-pc modules (package grub-pc-bin)"
find_mirrors # mirror, security, sources (lib.sh)

# disk_size VARIANT: the image's virtual size; cloud-init's growpart grows it
# to the machine's disk. The node image holds ~1.5 GiB of binaries and images.
disk_size() {
  case $1 in
  node) echo 4G ;;
  *) echo 2G ;;
  esac
}

start_work # the build lock, $work and its removal on every exit path (lib.sh)

# grub-install finds a partition's start sector through "udevadm info --query
# path"; hosts without udev (containers, CI sandboxes) get this stand-in that
# resolves the sysfs path from the device number.
if ! command -v udevadm >/dev/null; then
  mkdir -p "$work/bin"
  cat >"$work/bin/udevadm" <<'EOF'
#!/bin/sh
[ "$1 $2 $3 $4" = "info --query path --name" ] && [ -b "$5" ] || exit 1
mm=$(stat -L -c '%t %T' "$5") || exit 1
set -- $mm
p=$(readlink -f "/sys/dev/block/$((0x$1)):$((0x$2))") || exit 1
echo "${p#/sys}"
EOF
  chmod 0755 "$work/bin/udevadm"
  export PATH="$work/bin:$PATH"
fi

# --- recipe -------------------------------------------------------------------------
recipe_hash() { # $1 variant, $2.. package lists
  local variant=$1
  shift
  {
    echo "variant $variant suite $suite disk $(disk_size "$variant")"
    if [[ $variant == node ]]; then
      echo "node binaries $("$here/node/binaries.sh" --key)"
      cat "$here"/node/*.sh "$here"/oci/go.* "$here"/oci/*.go
    fi
    printf 'source %s\n' "${sources[@]}"
    echo "mmdebstrap $(dpkg-query -W -f='${Version}' mmdebstrap 2>/dev/null || mmdebstrap --version)"
    echo "grub $(dpkg-query -W -f='${Version}' grub-pc-bin 2>/dev/null || grub-install --version)"
    for f in "$here/build.sh" "$here/lib.sh" "$here/customize.sh" "$@"; do
      echo "file ${f##*/}"
      cat "$f"
    done
  } | sha256sum | cut -d' ' -f1
}

uuid_from() { # a stable RFC 4122 (version 4 layout) UUID from a hex string
  local h=$1
  printf '%s-%s-4%s-%x%s-%s\n' "${h:0:8}" "${h:8:4}" "${h:13:3}" \
    $(((0x${h:16:1} & 0x3) | 0x8)) "${h:17:3}" "${h:20:12}"
}

mkfs_features=()
if grep -q orphan_file /etc/mke2fs.conf 2>/dev/null; then
  # newer e2fsprogs default; GRUB 2.06 and bookworm's e2fsck predate it
  mkfs_features=(-O '^orphan_file,^metadata_csum_seed')
fi

# node_inputs: what the node image's customize step installs, built in $work:
# the binaries (cached by images/node/binaries.sh), a minimal Debian root file
# system with iptables, nft and conntrack as the base of the kube-proxy and
# flannel images, and the container images (images/node/containers.sh).
node_inputs() {
  local bin t=$SECONDS
  bin=$("$here/node/binaries.sh")
  CAPL_DEB_CACHE="$deb_cache" run mmdebstrap "${mm_common[@]}" --variant=essential \
    --include=iptables,nftables,conntrack --format=tar "${mm_save_debs[@]}" \
    "$suite" "$work/node-base.tar" "${sources[@]}"
  "$here/node/containers.sh" "$bin" "$work/node-base.tar" "$work/node-images.tar" "$work/node-images.refs"
  rm -f "$work/node-base.tar"
  export CAPL_NODE_BIN=$bin CAPL_NODE_IMAGES=$work/node-images.tar CAPL_NODE_REFS=$work/node-images.refs
  log "node: binaries and container images ready after $((SECONDS - t)) s"
}

build() { # $1 image name, $2 variant, $3.. package lists
  local name=$1 variant=$2
  shift 2
  local lists=("$@")
  local out="$image_dir/$name.qcow2" manifest="$image_dir/$name.manifest"
  local key start
  key=$(recipe_hash "$variant" "${lists[@]}")
  if ((!force)) && [[ -f $out && -f $manifest ]] &&
    [[ $(head -n1 "$manifest") == "recipe-sha256 $key" ]]; then
    log "$name: up to date (recipe ${key:0:12})"
    return 0
  fi
  start=$SECONDS
  log "$name: building (recipe ${key:0:12}, mirror $mirror, SOURCE_DATE_EPOCH $SOURCE_DATE_EPOCH)"
  rm -f "$manifest" # from here on the old image is no longer trusted

  local rootfs="$work/$name.rootfs" raw="$work/$name.raw" mnt="$work/$name.mnt"
  local uuid
  uuid=$(uuid_from "$key")
  local include
  include=$(packages "${lists[@]}" | paste -sd, -)

  # 1. root file system, .debs from and back into the cache
  if [[ $variant == node ]]; then
    node_inputs
  fi
  CAPL_HOOK="$here/customize.sh" CAPL_DEB_CACHE="$deb_cache" \
    CAPL_ROOT_UUID="$uuid" CAPL_VARIANT="$variant" CAPL_RECIPE_HASH="$key" \
    CAPL_SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" \
    run mmdebstrap "${mm_common[@]}" --variant=minbase --format=directory \
    --include="$include" \
    --skip=essential/unlink \
    --essential-hook='"$CAPL_HOOK" "$1"' \
    --customize-hook='"$CAPL_HOOK" "$1"' \
    "${mm_save_debs[@]}" \
    "$suite" "$rootfs" "${sources[@]}"
  log "$name: root file system ready after $((SECONDS - start)) s ($(du -sh --one-file-system "$rootfs" | cut -f1))"

  local kernel=/vmlinuz initrd=/initrd.img kver
  kver=$(ls "$rootfs/lib/modules")
  [[ -e $rootfs/vmlinuz && -e $rootfs/initrd.img ]] || {
    kernel=/boot/vmlinuz-$kver
    initrd=/boot/initrd.img-$kver
  }

  # 2. MBR disk with one ext4 partition, identified by UUID
  truncate -s "$(disk_size "$variant")" "$raw"
  sfdisk --quiet "$raw" <<EOF
label: dos
label-id: 0x${key:32:8}
start=2048, type=83, bootable
EOF
  local loopdev part i
  loopdev=$(losetup --find --show --partscan "$raw")
  part=${loopdev}p1
  # This kernel lacks msdos partition scanning: add the partition by hand.
  if [[ ! -b $part ]]; then
    log "$name: no partition scan on $loopdev; adding $part with partx"
    partx -a "$loopdev" 2>/dev/null || true
  fi
  for i in $(seq 50); do
    [[ -b $part ]] && break
    sleep 0.1
  done
  [[ -b $part ]] || die "$name: partition $part did not appear"
  mkfs.ext4 -q -F -L capl-root -U "$uuid" "${mkfs_features[@]}" "$part"
  mkdir -p "$mnt"
  mount "$part" "$mnt"
  cp -a "$rootfs/." "$mnt/"
  rm -rf --one-file-system "$rootfs"

  # 3. GRUB in the MBR gap, serial console, no menu. tsc=reliable: under TCG
  #    with more than one vCPU the kernel finds the TSCs unsynchronised and
  #    falls back to the HPET, so every clock read (Go's runtime reads the
  #    clock all the time) traps into QEMU's HPET emulation: idle Kubernetes
  #    components then eat the guest's CPUs. With KVM kvm-clock still wins.
  # GRUB cannot map loop partitions to BIOS drives without a device map.
  mkdir -p "$mnt/boot/grub"
  echo "(hd0) $loopdev" >"$mnt/boot/grub/device.map"
  grub-install --target=i386-pc --boot-directory="$mnt/boot" --no-floppy \
    --modules='part_msdos ext2' --locales= --fonts= --themes= "$loopdev" 2>&1 | sed 's/^/grub-install: /' >&2
  rm -f "$mnt/boot/grub/device.map"
  cat >"$mnt/boot/grub/grub.cfg" <<EOF
# capl image $name; written by images/build.sh (no grub package in the guest)
set default=0
set timeout=0
set timeout_style=hidden
serial --unit=0 --speed=115200 --word=8 --parity=no --stop=1
terminal_input serial console
terminal_output serial console
insmod part_msdos
insmod ext2
search --no-floppy --fs-uuid --set=root $uuid
menuentry 'Debian GNU/Linux 12 ($name)' {
	linux $kernel root=UUID=$uuid ro console=tty0 console=ttyS0,115200n8 mitigations=off tsc=reliable
	initrd $initrd
}
EOF
  dpkg-query --admindir="$mnt/var/lib/dpkg" -W -f='${Package} ${Version}\n' >"$work/$name.packages"
  sync -f "$mnt"
  umount "$mnt"
  partx -d "$loopdev" 2>/dev/null || true
  losetup -d "$loopdev"

  # 4. compressed qcow2, renamed into place; the manifest last
  qemu-img convert -q -c -O qcow2 -o compat=1.1 "$raw" "$work/$name.qcow2"
  rm -f "$raw"
  chmod 0644 "$work/$name.qcow2"
  mv -f "$work/$name.qcow2" "$out"
  {
    echo "recipe-sha256 $key"
    echo "# $name: Debian $suite, $(du -h --apparent-size "$out" | cut -f1) qcow2, $(disk_size "$variant") virtual, root UUID $uuid"
    echo "# kernel $kver; mirror $mirror; SOURCE_DATE_EPOCH $SOURCE_DATE_EPOCH"
    cat "$work/$name.packages"
  } >"$work/$name.manifest"
  mv -f "$work/$name.manifest" "$manifest"
  log "$name: built in $((SECONDS - start)) s: $out ($(du -h --apparent-size "$out" | cut -f1))"
}

outputs=()
for variant in "${variants[@]}"; do
  case $variant in
  base)
    build capl-debian-12 base "$here/packages-base.txt"
    outputs+=("$image_dir/capl-debian-12.qcow2")
    ;;
  haproxy)
    build capl-debian-12-haproxy haproxy "$here/packages-base.txt" "$here/packages-haproxy.txt"
    outputs+=("$image_dir/capl-debian-12-haproxy.qcow2")
    ;;
  node)
    kube_version=${KUBERNETES_VERSION:-$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$here/../hack/tools/envtest/go.mod")}
    build "capl-node-$kube_version" node "$here/packages-base.txt" "$here/packages-node.txt"
    outputs+=("$image_dir/capl-node-$kube_version.qcow2")
    ;;
  esac
done
printf '%s\n' "${outputs[@]}" >&3

#!/usr/bin/env bash
# Prepares a Debian/Ubuntu host, as root, to build and test the provider:
# installs the packages (libvirt, QEMU, dnsmasq, image-building tools) and starts
# virtlogd and libvirtd when no service manager runs them (containers, CI
# sandboxes). Safe to run again: it installs only what is missing and starts only
# what is not running.
set -euo pipefail

packages=(
  libvirt-daemon-system libvirt-dev pkg-config gcc libseccomp-dev
  qemu-system-x86 qemu-utils dnsmasq-base iproute2
  genisoimage haproxy openssh-server openssl
  mmdebstrap grub-pc-bin grub2-common fdisk e2fsprogs util-linux
  curl ca-certificates
)

if [[ $(id -u) -ne 0 ]]; then
  echo "prepare-host: run as root (it installs packages and starts libvirtd)" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  echo "prepare-host: installing ${missing[*]}"
  # Packages must not start their daemons: this script starts libvirtd
  # itself, and sshd runs only inside the multi-host test bed's namespaces
  # (hack/testbed-hosts.sh), never on this machine's own addresses.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Without udev, /dev/kvm stays 0600 root:root; libvirt then finds KVM unusable
# for its QEMU user while its cached capabilities say KVM exists, and re-probes
# QEMU on every lookup (a domain define took minutes). Apply Debian's udev rule.
if [[ -c /dev/kvm ]] && getent group kvm >/dev/null; then
  chgrp kvm /dev/kvm
  chmod 0660 /dev/kvm
fi

running() { pgrep -x "$1" >/dev/null; }

# Without systemd as PID 1 nobody starts the daemons for us.
if ! running virtlogd; then virtlogd -d; fi
if ! running libvirtd; then libvirtd -d; fi

for _ in $(seq 1 50); do
  virsh -c qemu:///system version >/dev/null 2>&1 && break
  sleep 0.2
done
virsh -c qemu:///system version >/dev/null

# Docker on the same host sets the FORWARD policy to DROP, which silently
# breaks libvirt's NAT networks; say so instead of letting VMs time out.
if command -v iptables >/dev/null 2>&1 && iptables -S FORWARD 2>/dev/null | grep -q '^-P FORWARD DROP'; then
  echo "prepare-host: warning: iptables FORWARD policy is DROP (Docker?); libvirt NAT networks may not forward" >&2
fi
echo "prepare-host: libvirt $(virsh -c qemu:///system version | awk '/Running hypervisor|Using library/ {print $NF}' | head -1) ready"

#!/bin/sh
# mmdebstrap hook of images/build.sh: configures the root file system of the
# capl Debian images. mmdebstrap runs it with the chroot directory as $1 and
# tells which stage it is in through MMDEBSTRAP_HOOK:
#   essential  after the Essential:yes packages, before the kernel: initramfs
#              configuration, so the initramfs is generated once, correctly.
#   customize  after all packages: cloud-init, fstab, network, cleanup.
# build.sh exports CAPL_ROOT_UUID, CAPL_VARIANT, CAPL_RECIPE_HASH and
# CAPL_SOURCE_DATE_EPOCH (and, for the node variant, what node/customize-node.sh
# reads).
set -eu

root=${1:?usage: customize.sh CHROOT}
: "${MMDEBSTRAP_HOOK:?customize.sh must run as an mmdebstrap hook}"

essential() {
	# The cloud kernel has no AHCI/IDE: the NoCloud ISO comes on virtio-scsi
	# (sr_mod, cdrom, isofs). Put these into the initramfs so udev probes
	# the CD as early as possible and cloud-init-local finds "cidata".
	mkdir -p "$root/etc/initramfs-tools/conf.d" "$root/etc/initramfs-tools/hooks"
	# Only the drivers a libvirt VM boots from: a 4 MB instead of a 13 MB
	# initramfs, which GRUB reads through BIOS calls and udev then probes, both
	# slow under TCG. NVMe and ext4 are built into the cloud kernel.
	cat >"$root/etc/initramfs-tools/conf.d/capl.conf" <<-'EOF'
		# capl images: the modules come from hooks/capl-virtio
		MODULES=list
		COMPRESS=zstd
	EOF
	cat >"$root/etc/initramfs-tools/hooks/capl-virtio" <<-'EOF'
		#!/bin/sh
		# capl images: root on virtio-blk, virtio-scsi or IDE (i440fx), the
		# NoCloud ISO on virtio-scsi (sr_mod), ext4.
		PREREQ=""
		prereqs() { echo "$PREREQ"; }
		case "$1" in prereqs) prereqs; exit 0 ;; esac
		. /usr/share/initramfs-tools/hook-functions
		for m in virtio_pci virtio_blk virtio_scsi sd_mod sr_mod cdrom \
			ata_piix ata_generic ext4 crc32c_generic; do
			manual_add_modules "$m"
		done
	EOF
	chmod 0755 "$root/etc/initramfs-tools/hooks/capl-virtio"
}

# drop_cloud_modules removes modules from the package's cloud.cfg lists and
# fails the build when one is not listed (a cloud-init update renamed it).
drop_cloud_modules() {
	for m in "$@"; do
		grep -q -- "^ - $m\$" "$root/etc/cloud/cloud.cfg" || {
			echo "customize.sh: cloud-init module $m is not in cloud.cfg" >&2
			exit 1
		}
		sed -i "/^ - $m\$/d" "$root/etc/cloud/cloud.cfg"
	done
}

customize() {
	: "${CAPL_ROOT_UUID:?}" "${CAPL_VARIANT:?}" "${CAPL_RECIPE_HASH:?}"

	# Mounts and boot.
	cat >"$root/etc/fstab" <<-EOF
		# <file system> <mount point> <type> <options> <dump> <pass>
		UUID=$CAPL_ROOT_UUID / ext4 rw,errors=remount-ro 0 1
	EOF

	# Identity: the same for every build host; cloud-init sets the hostname
	# from meta-data local-hostname, systemd creates the machine-id at first boot.
	echo localhost >"$root/etc/hostname"
	cat >"$root/etc/hosts" <<-'EOF'
		127.0.0.1	localhost
		::1		localhost ip6-localhost ip6-loopback
		ff02::1		ip6-allnodes
		ff02::2		ip6-allrouters
	EOF
	: >"$root/etc/machine-id"
	rm -f "$root/var/lib/dbus/machine-id" "$root"/etc/ssh/ssh_host_*
	# dhclient writes resolv.conf at boot; do not ship the build host's.
	rm -f "$root/etc/resolv.conf"

	# Without a UTF-8 LANG cloud-init's locale step errors.
	echo 'LANG=C.UTF-8' >"$root/etc/default/locale"

	# cloud-init: NoCloud only (ISO labelled "cidata"), None as the fallback.
	# 99 sorts after the package's 90_dpkg.cfg, which lists every datasource.
	cat >"$root/etc/cloud/cloud.cfg.d/99_capl.cfg" <<-'EOF'
		# capl images: the provider attaches a NoCloud ISO (label "cidata").
		datasource_list: [ NoCloud, None ]
		# /etc/hosts resolves the hostname set from meta-data local-hostname.
		manage_etc_hosts: true
	EOF
	# Without an SSH server cloud-init's ssh module only logs ssh-keygen
	# tracebacks; drop it unless a package list adds openssh-server.
	if [ ! -e "$root/usr/sbin/sshd" ]; then
		sed -i '/^cloud_init_modules:/,/^$/{/^ *- ssh$/d}' "$root/etc/cloud/cloud.cfg"
		! sed -n '/^cloud_init_modules:/,/^$/p' "$root/etc/cloud/cloud.cfg" | grep -q -- '- ssh$'
		drop_cloud_modules ssh-authkey-fingerprints keys-to-console
	fi
	# Modules for software these images do not have (snapd, byobu, GRUB's
	# package, rsyslog, config-management agents, LXD, Landscape, RMC) and
	# for a keyboard no one types at. cloud-init imports every listed module
	# in each of its Python stages, which is slow under TCG; none of them can
	# act on a capl image, so dropping them changes nothing a user sees.
	drop_cloud_modules snap ssh-import-id keyboard byobu grub-dpkg \
		disable-ec2-metadata rsyslog fan landscape lxd puppet chef mcollective \
		salt-minion reset_rmc refresh_rmc_and_interface rightscale_userdata

	# ifupdown: cloud-init renders the NIC into interfaces.d/50-cloud-init.
	cat >"$root/etc/network/interfaces" <<-'EOF'
		# The loopback network interface; cloud-init writes the others
		# into /etc/network/interfaces.d/50-cloud-init.
		auto lo
		iface lo inet loopback

		source /etc/network/interfaces.d/*
	EOF
	mkdir -p "$root/etc/network/interfaces.d"
	# A NIC configured statically (addresses from IPAM pools) gets its DNS
	# servers as dns-nameservers in 50-cloud-init; without resolvconf
	# ifupdown only exports them to if-up.d hooks, so this one writes them.
	# DHCP NICs keep dhclient's resolv.conf.
	cat >"$root/etc/network/if-up.d/capl-dns" <<-'EOF'
		#!/bin/sh
		# capl: resolv.conf from a static NIC's dns-nameservers.
		[ -n "$IF_DNS_NAMESERVERS" ] || exit 0
		for ns in $IF_DNS_NAMESERVERS; do echo "nameserver $ns"; done >/etc/resolv.conf.capl
		mv /etc/resolv.conf.capl /etc/resolv.conf
	EOF
	chmod 0755 "$root/etc/network/if-up.d/capl-dns"

	# Background jobs that only cost CPU in short-lived test VMs under TCG.
	for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
		e2scrub_reap.service fstrim.timer dpkg-db-backup.timer; do
		if [ -e "$root/lib/systemd/system/$unit" ]; then
			chroot "$root" systemctl disable --quiet "$unit"
		fi
	done

	# The load balancer VM: haproxy enabled with Debian's default (valid)
	# configuration; the provider writes haproxy.cfg and reloads it.
	if [ "$CAPL_VARIANT" = haproxy ]; then
		chroot "$root" systemctl enable --quiet haproxy.service
		chroot "$root" haproxy -c -q -f /etc/haproxy/haproxy.cfg
	fi

	# The Kubernetes node: binaries, runtime, kubelet, container images.
	if [ "$CAPL_VARIANT" = node ]; then
		"$(dirname "$0")/node/customize-node.sh" "$root"
	fi

	# Checks that fail the build instead of a silent DataSourceNone at boot.
	kver=$(ls "$root/lib/modules")
	for m in virtio_scsi sr_mod cdrom isofs; do
		if ! grep -q "/$m\.ko" "$root/lib/modules/$kver/modules.dep" &&
			! grep -q "/$m\.ko" "$root/lib/modules/$kver/modules.builtin"; then
			echo "customize.sh: kernel $kver lacks module $m" >&2
			exit 1
		fi
	done
	for m in virtio_blk virtio_scsi sr_mod; do
		if ! grep -q "/$m\.ko" "$root/lib/modules/$kver/modules.builtin" &&
			! chroot "$root" lsinitramfs "/boot/initrd.img-$kver" | grep -q "/$m\.ko"; then
			echo "customize.sh: initramfs lacks module $m" >&2
			exit 1
		fi
	done
	chroot "$root" python3 -c 'import jinja2' # cloud-init "## template: jinja"
	chroot "$root" systemctl is-enabled --quiet cloud-init-local.service
	test -x "$root/usr/bin/growpart"

	cat >"$root/etc/capl-image" <<-EOF
		CAPL_IMAGE_VARIANT=$CAPL_VARIANT
		CAPL_IMAGE_RECIPE=$CAPL_RECIPE_HASH
		CAPL_IMAGE_SOURCE_DATE_EPOCH=${CAPL_SOURCE_DATE_EPOCH:-}
	EOF
}

case "$MMDEBSTRAP_HOOK" in
essential) essential ;;
customize) customize ;;
*) ;;
esac

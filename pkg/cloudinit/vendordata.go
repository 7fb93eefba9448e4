package cloudinit

// BootstrapSentinelVendorData is the vendor-data of every machine's seed.
// It keeps Cluster API's bootstrap sentinel,
// /run/cluster-api/bootstrap-success.complete, through reboots and power
// cuts: /run is empty after every boot and cloud-init does not run the
// bootstrap again for the same instance-id, so without it a guest that went
// down before the provider read the sentinel would count as failed.
//
// It is a shell script because a vendor cloud-config's bootcmd or
// write_files would be replaced by the user-data's; a script is run as it
// is, once per instance, by cloud-init's scripts_vendor module. In cloud-init
// 22.4's final stage (the capl images keep its order) that module comes
// right before scripts_per_boot and scripts_user, which runs the
// user-data's runcmd and so the bootstrap. The script:
//
//   - makes /var/lib/capi-libvirt/cluster-api/<instance-id>, 0700, with
//     chattr +S and +D where the file system has them: a file written there
//     is on the disk when its write returns, so a power cut right after the
//     bootstrap wrote the sentinel cannot lose it with the page cache; with
//     +D its creation is too, so a cut between the shell opening the
//     sentinel and echo writing it leaves the sentinel, empty, which counts
//     (the bootstrap's command had ended). The instance-id keeps a sentinel
//     in an image made from a bootstrapped guest from passing for a new
//     instance's.
//   - installs /var/lib/cloud/scripts/per-boot/capl-bootstrap-sentinel,
//     which makes /run/cluster-api a link to that directory, after moving
//     into it what a real /run/cluster-api holds (Cluster API's write_files
//     puts a placeholder there in the init stage). scripts_per_boot runs it
//     right after this script on the first boot, before runcmd writes the
//     sentinel (mkdir -p /run/cluster-api accepts the link), and on every
//     later boot before cloud-init writes /run/cloud-init/result.json, the
//     file after which the provider takes a missing sentinel for a failure.
//   - syncs, so that the directory, the per-boot script and cloud-init's
//     record that this script ran are on the disk before the bootstrap
//     starts.
//
// It holds no secret. A user-data that disables vendor data
// (vendor_data: {enabled: false}) keeps the sentinel in /run only.
const BootstrapSentinelVendorData = `#!/bin/sh
# capi-libvirt: keeps Cluster API's bootstrap sentinel through reboots.
set -eu
iid=$(cat /var/lib/cloud/data/instance-id)
dir=/var/lib/capi-libvirt/cluster-api/$iid
hook=/var/lib/cloud/scripts/per-boot/capl-bootstrap-sentinel
umask 077
mkdir -p "$dir"
chattr +S "$dir" 2>/dev/null || true
chattr +D "$dir" 2>/dev/null || true
mkdir -p "${hook%/*}"
cat >"$hook.new" <<'EOF'
#!/bin/sh
# capi-libvirt: /run/cluster-api is a link to a directory on the disk.
dir=/var/lib/capi-libvirt/cluster-api/$(cat /var/lib/cloud/data/instance-id) || exit 0
[ -d "$dir" ] || exit 0
if [ -d /run/cluster-api ] && [ ! -L /run/cluster-api ]; then
	find /run/cluster-api -mindepth 1 -maxdepth 1 -exec mv -f {} "$dir/" \;
	rmdir /run/cluster-api || exit 1
fi
ln -sfn "$dir" /run/cluster-api
EOF
chmod 0755 "$hook.new"
mv -f "$hook.new" "$hook"
sync
`

#!/usr/bin/env bash
# Times the libvirt calls a machine's life makes, as `virsh -t` reports
# them in one session (the connection set up once), against LIBVIRT_URI
# (qemu:///system): define, dominfo, metadata, undefine, a qcow2 volume
# created, described and deleted, a DHCP host entry added and deleted, a
# domain listing. It prints the median and the 90th percentile of ROUNDS
# (20) rounds. It makes a throwaway pool in a temporary directory and an
# inactive network, named capl-timings-*, and removes them; it starts no
# domain. make bench-scale's simulated host takes its delays from these
# figures (docs/performance.md).
set -euo pipefail
URI=${LIBVIRT_URI:-qemu:///system}
ROUNDS=${ROUNDS:-20}
work=$(mktemp -d)
trap 'virsh -c "$URI" net-undefine capl-timings-net >/dev/null 2>&1 || true; virsh -c "$URI" undefine capl-timings-dom >/dev/null 2>&1 || true; virsh -c "$URI" pool-destroy capl-timings-pool >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
cat >"$work/dom.xml" <<X
<domain type='qemu'><name>capl-timings-dom</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>
<metadata><capl:owner xmlns:capl="https://capi-libvirt.invalid/timings"><kind>LibvirtMachine</kind></capl:owner></metadata>
<os><type arch='x86_64'>hvm</type></os><devices></devices></domain>
X
cat >"$work/net.xml" <<X
<network><name>capl-timings-net</name><bridge name='capltim0'/><ip address='10.254.254.1' netmask='255.255.255.0'>
<dhcp><range start='10.254.254.100' end='10.254.254.250'/></dhcp></ip></network>
X
mkdir "$work/pool"
virsh -c "$URI" pool-create-as capl-timings-pool dir --target "$work/pool" >/dev/null
virsh -c "$URI" net-define "$work/net.xml" >/dev/null
names=(define dominfo metadata undefine vol-create-as vol-info vol-delete dhcp-host-add dhcp-host-delete list-all)
cmds=""
for i in $(seq 10 $((9 + ROUNDS))); do
	host="\"<host mac='52:54:00:00:00:$((i % 90 + 10))' ip='10.254.254.$((i % 90 + 10))'/>\""
	cmds+="define $work/dom.xml; dominfo capl-timings-dom; metadata capl-timings-dom https://capi-libvirt.invalid/timings; undefine capl-timings-dom; "
	cmds+="vol-create-as capl-timings-pool v$i 1M --format qcow2; vol-info v$i --pool capl-timings-pool; vol-delete v$i --pool capl-timings-pool; "
	cmds+="net-update capl-timings-net add ip-dhcp-host $host --config; net-update capl-timings-net delete ip-dhcp-host $host --config; list --all --uuid; "
done
virsh -t -c "$URI" "$cmds" 2>&1 | grep -o 'Time: [0-9.]* ms' | awk '{print $2}' >"$work/times"
echo "libvirt call timings on $(hostname) against $URI, $ROUNDS rounds (ms):"
for k in "${!names[@]}"; do
	awk -v k="$k" -v n="${#names[@]}" 'NR % n == (k + 1) % n' "$work/times" | sort -n |
		awk -v name="${names[$k]}" '{v[NR]=$1} END {printf "  %-18s median %6.1f  p90 %6.1f\n", name, v[int((NR+1)/2)], v[int(NR*0.9)]}'
done

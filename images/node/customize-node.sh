#!/bin/sh
# The Kubernetes node part of images/customize.sh's customize stage: shapes the
# root file system as image-builder shapes its qemu/raw node images, so that a
# user's image-builder image and ours behave the same under the templates.
#   $1                the root file system (chroot directory)
#   CAPL_NODE_BIN     output of images/node/binaries.sh
#   CAPL_NODE_IMAGES  OCI image layout tarball of images/node/containers.sh
#   CAPL_NODE_REFS    its "reference digest" lines
# Runs on the build host: containerd (the one built for the guest, static) runs
# here once against the guest's /var/lib/containerd to import the images, so
# they are present in the k8s.io namespace from the first boot on.
set -eu

root=${1:?usage: customize-node.sh CHROOT}
: "${CAPL_NODE_BIN:?}" "${CAPL_NODE_IMAGES:?}" "${CAPL_NODE_REFS:?}"
bin=$CAPL_NODE_BIN/bin

# Binaries where image-builder puts them: kubelet, kubeadm and kubectl in
# /usr/bin (kubeadm's drop-in runs /usr/bin/kubelet), the runtime in /usr/local.
install -m 0755 "$bin/kubelet" "$bin/kubeadm" "$bin/kubectl" "$root/usr/bin/"
install -m 0755 "$bin/containerd" "$bin/containerd-shim-runc-v2" "$bin/ctr" "$bin/crictl" "$root/usr/local/bin/"
install -m 0755 "$bin/runc" "$root/usr/local/sbin/"
install -d -m 0755 "$root/opt/cni/bin" "$root/etc/cni/net.d"
install -m 0755 "$CAPL_NODE_BIN"/cni/* "$root/opt/cni/bin/"
install -m 0644 "$CAPL_NODE_BIN/VERSIONS" "$root/etc/capl-node-versions"

# containerd: containerd's own unit; systemd cgroups (kubelet's default
# driver under kubeadm); our pause image as the sandbox image.
pause_ref=$(awk '$1 ~ /\/pause:/ {print $1}' "$CAPL_NODE_REFS")
[ -n "$pause_ref" ] || { echo "customize-node.sh: no pause image in $CAPL_NODE_REFS" >&2; exit 1; }
cat >"$root/etc/systemd/system/containerd.service" <<'EOF'
# containerd's upstream unit (containerd.service in its repository).
[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target local-fs.target dbus.service

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
EOF
install -d -m 0755 "$root/etc/containerd"
cat >"$root/etc/containerd/config.toml" <<EOF
# capl node image: containerd 2 defaults plus what kubeadm expects.
version = 3

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '$pause_ref'

# One directory, as image-builder sets it: containerd 2.3's default is the
# list '/etc/containerd/certs.d:/etc/docker/certs.d', which its CRI pulls
# (the transfer service) read as a single path, so that no hosts.toml,
# capl-registry-mirror's included, would apply.
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = '/etc/containerd/certs.d'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
EOF
cat >"$root/etc/crictl.yaml" <<'EOF'
runtime-endpoint: unix:///run/containerd/containerd.sock
image-endpoint: unix:///run/containerd/containerd.sock
timeout: 10
EOF

# The one-host plane's registry (internal/registry) as containerd's mirror of
# every registry: at each boot, once the network is up, when the guest's
# gateway answers as that registry on its port (registry.DefaultPort, which
# internal/registry's test checks against this), containerd asks it first for
# any image and falls back to the named registry for what it lacks. Elsewhere
# (a bridged homelab network, a cloud) nothing answers and nothing changes.
install -d -m 0755 "$root/usr/local/lib/capl"
cat >"$root/usr/local/lib/capl/registry-mirror" <<'EOF'
#!/bin/sh
# capl node image: the plane's registry as containerd's mirror, when the gateway serves one.
set -u
port=5050
hosts=/etc/containerd/certs.d/_default/hosts.toml
gw=
for _ in $(seq 30); do # DHCP may still be under way
  gw=$(ip -4 route show default | awk '{print $3; exit}')
  [ -n "$gw" ] && break
  sleep 1
done
if [ -n "$gw" ] && curl -fsS -m 5 -o /dev/null -D - "http://$gw:$port/v2/" 2>/dev/null | grep -qi '^capl-registry:'; then
  mkdir -p "${hosts%/*}"
  printf '[host."http://%s:%s"]\n  capabilities = ["pull", "resolve"]\n' "$gw" "$port" >"$hosts.tmp"
  mv "$hosts.tmp" "$hosts"
  echo "containerd pulls through the plane's registry at http://$gw:$port"
else
  rm -f "$hosts"
  echo "no plane registry at the gateway (${gw:-none}):$port"
fi
EOF
chmod 0755 "$root/usr/local/lib/capl/registry-mirror"
cat >"$root/etc/systemd/system/capl-registry-mirror.service" <<'EOF'
[Unit]
Description=capl: the plane's registry as containerd's mirror
Wants=network-online.target
After=network-online.target
# before kubeadm (cloud-init's runcmd) and the kubelet pull anything
Before=kubelet.service cloud-final.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/lib/capl/registry-mirror

[Install]
WantedBy=multi-user.target
EOF

# kubelet: the unit and kubeadm drop-in of Kubernetes' packages (kubernetes/release).
cat >"$root/lib/systemd/system/kubelet.service" <<'EOF'
[Unit]
Description=kubelet: The Kubernetes Node Agent
Documentation=https://kubernetes.io/docs/
Wants=network-online.target
After=network-online.target

[Service]
ExecStart=/usr/bin/kubelet
Restart=always
StartLimitInterval=0
RestartSec=10

[Install]
WantedBy=multi-user.target
EOF
install -d -m 0755 "$root/lib/systemd/system/kubelet.service.d"
cat >"$root/lib/systemd/system/kubelet.service.d/10-kubeadm.conf" <<'EOF'
# Note: This dropin only works with kubeadm and kubelet v1.11+
[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
# This is a file that "kubeadm init" and "kubeadm join" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
# This is a file that the user can use for overrides of the kubelet args as a last resort. Preferably, the user should use
# the .NodeRegistration.KubeletExtraArgs object in the configuration files instead. KUBELET_EXTRA_ARGS should be sourced from this file.
EnvironmentFile=-/etc/default/kubelet
ExecStart=
ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS
EOF
# Not in Kubernetes' packages: until kubeadm writes the kubelet's
# configuration the kubelet exits at once and systemd restarts it every 10 s,
# a few CPU-seconds each under TCG, taken from cloud-init and kubeadm. kubeadm's
# kubelet-start phase writes the file and restarts the unit, which then passes
# the condition; kubeadm's preflight only asks that the unit be enabled.
cat >"$root/lib/systemd/system/kubelet.service.d/05-capl-wait-for-config.conf" <<'EOF'
# capl node image: start only once kubeadm has configured the kubelet.
[Unit]
ConditionPathExists=/var/lib/kubelet/config.yaml
EOF
install -d -m 0755 "$root/etc/kubernetes/manifests" "$root/var/lib/kubelet"
chroot "$root" systemctl enable --quiet containerd.service kubelet.service capl-registry-mirror.service

# Kernel: what kubeadm's preflight and the CNI want, at every boot.
cat >"$root/etc/modules-load.d/kubernetes.conf" <<'EOF'
overlay
br_netfilter
EOF
cat >"$root/etc/sysctl.d/90-kubernetes.conf" <<'EOF'
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward = 1
EOF

# The images, imported by the guest's own containerd build on this host.
work=$(mktemp -d)
cat >"$work/config.toml" <<EOF
version = 3
root = '$root/var/lib/containerd'
state = '$work/state'
# Only the image store, content and snapshotter run here: nothing of CRI, NRI
# or /opt may touch the build host.
disabled_plugins = ['io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.images', 'io.containerd.cri.v1.runtime',
  'io.containerd.nri.v1.nri', 'io.containerd.internal.v1.opt', 'io.containerd.podsandbox.controller.v1.podsandbox']
[grpc]
  address = '$work/containerd.sock'
[ttrpc]
  address = '$work/containerd.sock.ttrpc'
EOF
"$bin/containerd" --config "$work/config.toml" >"$work/containerd.log" 2>&1 &
ctrd=$!
stop_containerd() {
  kill "$ctrd" 2>/dev/null || true
  wait "$ctrd" 2>/dev/null || true
  rm -rf "$work"
}
trap stop_containerd EXIT
ctr() { "$bin/ctr" --address "$work/containerd.sock" --namespace k8s.io "$@"; }
i=0
until ctr version >/dev/null 2>&1; do
  i=$((i + 1))
  if [ "$i" -gt 100 ]; then
    cat "$work/containerd.log" >&2
    echo "customize-node.sh: containerd did not start" >&2
    exit 1
  fi
  sleep 0.1
done
ctr images import --snapshotter overlayfs "$CAPL_NODE_IMAGES" >/dev/null
# Every reference present, unpacked, with the digest written.
while read -r ref digest; do
  got=$(ctr images ls "name==$ref" | awk 'NR == 2 {print $3}')
  if [ "$got" != "$digest" ]; then
    echo "customize-node.sh: $ref imported as '$got', want $digest" >&2
    exit 1
  fi
  ctr images check "name==$ref" | grep -q 'complete' || {
    echo "customize-node.sh: $ref incomplete after import" >&2
    exit 1
  }
done <"$CAPL_NODE_REFS"
install -m 0644 "$CAPL_NODE_REFS" "$root/etc/capl-node-images"
stop_containerd
trap - EXIT
# (mmdebstrap itself keeps /proc, /sys and /dev mounted in the chroot.)
if grep -q " $root/var/lib/containerd" /proc/self/mountinfo; then
  echo "customize-node.sh: mounts left under $root/var/lib/containerd after the import" >&2
  exit 1
fi

# kubeadm's preflight fails on swap; the image has none, keep it so.
! grep -qw swap "$root/etc/fstab"

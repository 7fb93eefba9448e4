#!/usr/bin/env bash
# A homelab of libvirt hosts on this one machine, for the multi-host tests:
# each host is a libvirtd (with its virtlogd) in its own network and mount
# namespace, with its own /run, /etc/libvirt, /var/lib/libvirt,
# /var/log/libvirt and /var/cache/libvirt, listening on qemu+tcp:// at its
# address on a shared LAN, on qemu+tls:// with certificates of the test
# bed's own CA (client certificates required), and reachable over
# qemu+ssh:// through an sshd in the same namespaces (when openssh-server
# is installed) that lets in root with the test bed's key only. Each
# host's bridge br0 is joined to the LAN through a veth pair, like a
# machine plugged into a home router's switch; the "router" is a namespace
# with the LAN bridge and a dnsmasq handing out addresses. This machine
# (the management side) is on the LAN too.
#
#   LAN 10.231.0.0/24: .1 this machine (capl-lan), .2 router: DHCP (.100-.199) and DNS,
#   .11, .12, ... the hosts' br0, in the order named.
#
# Usage:
#   hack/testbed-hosts.sh up [host...]      start hosts (default: a b); prints their URIs
#   hack/testbed-hosts.sh stop HOST         stop HOST's libvirtd (its guests keep running)
#   hack/testbed-hosts.sh start HOST        start HOST's libvirtd again
#   hack/testbed-hosts.sh unplug HOST       pull HOST's cable: its link to the LAN
#                                           goes down (a power cut, as the network
#                                           sees it: nothing answers, nothing closes)
#   hack/testbed-hosts.sh plug HOST         plug it back in
#   hack/testbed-hosts.sh uri HOST          print HOST's libvirt URI
#   hack/testbed-hosts.sh ssh-uri HOST      print HOST's libvirt URI over SSH
#   hack/testbed-hosts.sh tls-uri HOST      print HOST's libvirt URI over TLS
#   hack/testbed-hosts.sh tls-client        print the directory of the client's
#                                           TLS files (cacert.pem, clientcert.pem,
#                                           clientkey.pem), libvirt's pkipath
#   hack/testbed-hosts.sh ssh-key           print the path of the SSH private key
#                                           the hosts let in
#   hack/testbed-hosts.sh known-hosts       print the hosts' SSH keys (known_hosts)
#   hack/testbed-hosts.sh down              remove everything: guests, daemons,
#                                           namespaces, links, directories
# State lives in $CAPL_TESTBED_DIR (default /var/tmp/capl-testbed).
set -euo pipefail

dir=${CAPL_TESTBED_DIR:-/var/tmp/capl-testbed}
lan_prefix=10.231.0
router_ns=capl-lan
root_link=capl-lan

log() { echo "testbed: $*" >&2; }

# ns_of names the network namespace of host $1.
ns_of() { echo "capl-host-$1"; }

# addr_of prints host $1's LAN address, recorded when it was created.
addr_of() { cat "$dir/hosts/$1/addr"; }

uri_of() { echo "qemu+tcp://$(addr_of "$1")/system"; }

ssh_uri_of() { echo "qemu+ssh://root@$(addr_of "$1")/system"; }

tls_uri_of() { echo "qemu+tls://$(addr_of "$1")/system"; }

# pid_alive tells whether the process in pid file $1 runs (and is no zombie).
pid_alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ -n $pid ]] || return 1
  local state
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [[ $state != Z && $state != X ]]
}

router_up() {
  [[ -e /run/netns/$router_ns ]] && return 0
  ip netns add "$router_ns"
  ip -n "$router_ns" link set lo up
  ip -n "$router_ns" link add lan0 type bridge forward_delay 0 stp_state 0
  ip -n "$router_ns" addr add "$lan_prefix.2/24" dev lan0
  ip -n "$router_ns" link set lan0 up
  ip link add "$root_link" type veth peer name root0
  ip link set root0 netns "$router_ns"
  ip -n "$router_ns" link set root0 master lan0 up
  ip addr add "$lan_prefix.1/24" dev "$root_link"
  ip link set "$root_link" up
  mkdir -p "$dir/router"
  # Like a home router it is also the LAN's DNS server (without upstream:
  # the testbed is offline), which DHCP hands out: a node without
  # /etc/resolv.conf runs no pod. The default route points at this machine,
  # which the kubelet needs to pick its node address.
  ip netns exec "$router_ns" dnsmasq --no-resolv --no-hosts --interface=lan0 --bind-interfaces \
    --dhcp-range="$lan_prefix.100,$lan_prefix.199,255.255.255.0,12h" \
    --dhcp-option=option:router,"$lan_prefix.1" --dhcp-authoritative \
    --dhcp-leasefile="$dir/router/leases" --pid-file="$dir/router/dnsmasq.pid" \
    --log-facility="$dir/router/dnsmasq.log" --log-dhcp
}

# libvirtd_start runs host $1's libvirtd. The first start makes the mount
# namespace (and its virtlogd, which keeps it alive); a restart enters it,
# so that the running guests' monitor sockets under /run are found again.
libvirtd_start() {
  local h=$1 hd="$dir/hosts/$1" ns
  ns=$(ns_of "$h")
  if pid_alive "$hd/libvirtd.pid"; then return 0; fi
  if pid_alive "$hd/virtlogd.pid"; then
    nsenter --target "$(cat "$hd/virtlogd.pid")" --mount --net \
      libvirtd --listen >>"$hd/libvirtd.log" 2>&1 &
    echo $! >"$hd/libvirtd.pid"
  else
    # ip netns exec and unshare both exec: $! ends up being libvirtd.
    ip netns exec "$ns" unshare --mount --propagation private sh -ec "
      mount -t tmpfs -o mode=0755 tmpfs /run
      mkdir -p /run/libvirt
      mount --bind '$hd/etc' /etc/libvirt
      mount --bind '$hd/lib' /var/lib/libvirt
      mount --bind '$hd/log' /var/log/libvirt
      mount --bind '$hd/cache' /var/cache/libvirt
      virtlogd -d
      while [ ! -s /run/virtlogd.pid ]; do sleep 0.1; done
      cp /run/virtlogd.pid '$hd/virtlogd.pid'
      exec libvirtd --listen" >>"$hd/libvirtd.log" 2>&1 &
    echo $! >"$hd/libvirtd.pid"
  fi
  for _ in $(seq 300); do
    if virsh -c "$(uri_of "$h")" version >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  log "libvirtd of host $h did not answer; see $hd/libvirtd.log"
  return 1
}

libvirtd_stop() {
  local hd="$dir/hosts/$1" pid
  pid_alive "$hd/libvirtd.pid" || return 0
  pid=$(cat "$hd/libvirtd.pid")
  kill "$pid"
  for _ in $(seq 300); do
    pid_alive "$hd/libvirtd.pid" || return 0
    sleep 0.1
  done
  log "libvirtd of host $1 ($pid) did not stop; killing it"
  kill -9 "$pid" || true
}

# tls_sign signs a certificate for subject $2 with extensions $3 by the
# test bed's CA, key and certificate to $1.key and $1.pem.
tls_sign() {
  openssl req -new -newkey rsa:2048 -nodes -keyout "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
  printf '%b' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$dir/pki/ca.pem" -CAkey "$dir/pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

# tls_ca makes the test bed's CA and the client certificate it signs, once,
# with the client's files named as libvirt's pkipath wants them.
tls_ca() {
  [[ -f $dir/pki/client/clientcert.pem ]] && return 0
  mkdir -p "$dir/pki/client"
  chmod 0700 "$dir/pki"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$dir/pki/ca.key" -out "$dir/pki/ca.pem" -days 2 \
    -subj /CN=capl-testbed-ca 2>/dev/null
  tls_sign "$dir/pki/client/client" /CN=capl-testbed-client \
    'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n'
  mv "$dir/pki/client/client.pem" "$dir/pki/client/clientcert.pem"
  mv "$dir/pki/client/client.key" "$dir/pki/client/clientkey.pem"
  cp "$dir/pki/ca.pem" "$dir/pki/client/cacert.pem"
}

# tls_server makes host $1's server certificate, for its LAN address.
tls_server() {
  local hd="$dir/hosts/$1"
  tls_ca
  mkdir -p "$hd/pki"
  tls_sign "$hd/pki/server" "/CN=$(addr_of "$1")" \
    "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:$(addr_of "$1")\n"
}

# ssh_client_key makes the key pair the hosts' sshds let in, once.
ssh_client_key() {
  [[ -f $dir/ssh/id_ed25519 ]] && return 0
  mkdir -p "$dir/ssh"
  chmod 0700 "$dir/ssh"
  ssh-keygen -q -t ed25519 -N '' -C capl-testbed -f "$dir/ssh/id_ed25519"
  cp "$dir/ssh/id_ed25519.pub" "$dir/ssh/authorized_keys"
}

# sshd_start runs host $1's sshd in its namespaces (where virt-ssh-helper
# finds the host's libvirtd socket), if openssh-server is installed.
sshd_start() {
  local h=$1 hd="$dir/hosts/$1"
  if [[ ! -x /usr/sbin/sshd ]]; then
    log "no /usr/sbin/sshd (openssh-server): host $h is reachable over qemu+tcp only"
    return 0
  fi
  pid_alive "$hd/sshd.pid" && return 0
  ssh_client_key
  if [[ ! -f $hd/ssh/ssh_host_ed25519_key ]]; then
    mkdir -p "$hd/ssh"
    ssh-keygen -q -t ed25519 -N '' -C "capl-testbed-$h" -f "$hd/ssh/ssh_host_ed25519_key"
    cat >"$hd/ssh/sshd_config" <<EOF
ListenAddress $(addr_of "$h")
HostKey $hd/ssh/ssh_host_ed25519_key
PidFile $hd/sshd.pid
AuthorizedKeysFile $dir/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
EOF
  fi
  nsenter --target "$(cat "$hd/virtlogd.pid")" --mount --net sh -ec "
    mkdir -p /run/sshd
    /usr/sbin/sshd -f '$hd/ssh/sshd_config' -E '$hd/sshd.log'"
}

host_up() {
  local h=$1 n=$2 hd="$dir/hosts/$1" ns
  ns=$(ns_of "$h")
  if [[ ! -e /run/netns/$ns ]]; then
    mkdir -p "$hd"/{etc,lib,log,cache}
    chmod 0755 "$dir" "$dir/hosts" "$hd" "$hd/lib"
    echo "$lan_prefix.$((10 + n))" >"$hd/addr"
    # A fresh configuration: no networks, pools or domains of this machine,
    # but the same nwfilters (clean-traffic) and QEMU settings.
    cp /etc/libvirt/qemu.conf /etc/libvirt/virtlogd.conf "$hd/etc/"
    cp -r /etc/libvirt/nwfilter "$hd/etc/"
    tls_server "$h"
    cat >"$hd/etc/libvirtd.conf" <<EOF
listen_tls = 1
listen_tcp = 1
listen_addr = "$(addr_of "$h")"
auth_tcp = "none"
auth_tls = "none"
key_file = "$hd/pki/server.key"
cert_file = "$hd/pki/server.pem"
ca_file = "$dir/pki/ca.pem"
EOF
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "capl-$h-up" type veth peer name "capl-$h-lan"
    ip link set "capl-$h-up" netns "$ns"
    ip link set "capl-$h-lan" netns "$router_ns"
    ip -n "$router_ns" link set "capl-$h-lan" master lan0 up
    ip -n "$ns" link add br0 type bridge forward_delay 0 stp_state 0
    ip -n "$ns" link set "capl-$h-up" name up0
    ip -n "$ns" link set up0 master br0 up
    ip -n "$ns" addr add "$(addr_of "$h")/24" dev br0
    ip -n "$ns" link set br0 up
    ip -n "$ns" route add default via "$lan_prefix.1"
  fi
  libvirtd_start "$h"
  sshd_start "$h"
  echo "$h $(uri_of "$h")"
}

host_down() {
  local h=$1 hd="$dir/hosts/$1" ns uri
  ns=$(ns_of "$h")
  if [[ -f $hd/addr ]]; then
    uri=$(uri_of "$h")
    if pid_alive "$hd/libvirtd.pid" || libvirtd_start "$h" 2>/dev/null; then
      # Through libvirtd, so that it removes what it made for each guest
      # (cgroups, taps, nwfilter rules) as it stops it.
      for d in $(virsh -c "$uri" list --all --name 2>/dev/null); do
        virsh -c "$uri" destroy "$d" >/dev/null 2>&1 || true
        virsh -c "$uri" undefine "$d" --nvram >/dev/null 2>&1 || virsh -c "$uri" undefine "$d" >/dev/null 2>&1 || true
      done
      libvirtd_stop "$h"
    fi
  fi
  if [[ -e /run/netns/$ns ]]; then
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
    ip netns del "$ns"
  fi
  rm -rf "$hd"
}

cmd=${1:-}
shift || true
case $cmd in
  up)
    hosts=("$@")
    [[ ${#hosts[@]} -gt 0 ]] || hosts=(a b)
    mkdir -p "$dir/hosts"
    router_up
    n=0
    for h in "${hosts[@]}"; do
      n=$((n + 1))
      if [[ -f $dir/hosts/$h/addr ]]; then n=$(( $(cut -d. -f4 <"$dir/hosts/$h/addr") - 10 )); fi
      host_up "$h" "$n"
    done
    ;;
  stop) libvirtd_stop "$1" ;;
  start) libvirtd_start "$1" ;;
  unplug) ip -n "$router_ns" link set "capl-$1-lan" down ;;
  plug) ip -n "$router_ns" link set "capl-$1-lan" up ;;
  uri) uri_of "$1" ;;
  ssh-uri) ssh_uri_of "$1" ;;
  ssh-key) echo "$dir/ssh/id_ed25519" ;;
  tls-uri) tls_uri_of "$1" ;;
  tls-client) echo "$dir/pki/client" ;;
  known-hosts)
    for hd in "$dir"/hosts/*/; do
      [[ -f $hd/ssh/ssh_host_ed25519_key.pub ]] || continue
      echo "$(cat "$hd/addr") $(cut -d' ' -f1,2 "$hd/ssh/ssh_host_ed25519_key.pub")"
    done
    ;;
  down)
    if [[ -d $dir/hosts ]]; then
      for hd in "$dir"/hosts/*/; do
        [[ -d $hd ]] && host_down "$(basename "$hd")"
      done
    fi
    for ns in $(ip netns list | awk '/^capl-host-/ {print $1}'); do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [[ -n $pids ]] && kill -9 $pids 2>/dev/null || true
      ip netns del "$ns"
    done
    if [[ -e /run/netns/$router_ns ]]; then
      pids=$(ip netns pids "$router_ns" 2>/dev/null || true)
      [[ -n $pids ]] && kill $pids 2>/dev/null || true
      ip netns del "$router_ns"
    fi
    ip link del "$root_link" 2>/dev/null || true
    rm -rf "$dir"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Builds every binary of the Kubernetes node image from the Go module proxy (and
# pause from its C source), because no release download is reachable from our
# machines. Versions are pinned by the tools modules:
#   hack/tools/envtest          k8s.io/kubernetes (kubelet, kubeadm, kubectl,
#                               kube-apiserver, kube-controller-manager,
#                               kube-scheduler, kube-proxy, pause) and etcd,
#                               built by hack/kubernetes.sh in the cache
#                               hack/envtest.sh takes its binaries from
#   hack/tools/node/containerd  containerd, containerd-shim-runc-v2, ctr
#   hack/tools/node/runc        runc (cgo, static, libseccomp)
#   hack/tools/node/cri-tools   crictl
#   hack/tools/node/cni-plugins the containernetworking plugins
#   hack/tools/node/coredns     coredns (for another Kubernetes minor whose
#                               kubeadm deploys another coredns: a module
#                               made at build time, see below)
#   hack/tools/node/flannel     flanneld
#
# Usage: images/node/binaries.sh [--key]
#   prints the output directory on stdout; with --key only the key, building nothing
#
# The output directory is $CAPL_IMAGE_DIR/node-bin/<key>, where <key> hashes this
# script, the tools modules and the Go version: a second run with the same key
# builds nothing. A build is written to a temporary directory and renamed into
# place, so an interrupted build is never mistaken for a finished one.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
exec 3>&1 1>&2 # stdout is for the output directory only

log() { printf '%s node-binaries: %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
command -v go >/dev/null || die "no go on PATH (Go 1.26 at /usr/local/go/bin)"
command -v gcc >/dev/null || die "no gcc (runc, flanneld and pause need cgo); run hack/prepare-host.sh"
[[ -e /usr/lib/x86_64-linux-gnu/libseccomp.a || -e /usr/lib/libseccomp.a ]] ||
  die "no static libseccomp (package libseccomp-dev); run hack/prepare-host.sh"

kube_module=$root/hack/tools/envtest
node_modules=$root/hack/tools/node
image_dir=${CAPL_IMAGE_DIR:-/var/cache/capi-libvirt/images}

mod_version() { # $1 go.mod, $2 module path: the required version
  awk -v m="$2" '$1 == m {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1"
}

pinned=$(mod_version "$kube_module/go.mod" k8s.io/kubernetes)
kube_version=${KUBERNETES_VERSION:-$pinned}
[[ $kube_version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "KUBERNETES_VERSION $kube_version is not v1.MINOR.PATCH"

key=$({
  echo "kubernetes $kube_version"
  go version
  cat "${BASH_SOURCE[0]}" "$root/hack/kubernetes.sh"
  for f in "$kube_module"/go.mod "$kube_module"/go.sum "$node_modules"/*/go.mod "$node_modules"/*/go.sum; do
    echo "file ${f#"$root"/}"
    cat "$f"
  done
} | sha256sum | cut -c1-16)
if [[ ${1:-} == --key ]]; then
  echo "$key" >&3
  exit 0
fi
out=$image_dir/node-bin/$key
if [[ -f $out/.complete ]]; then
  log "up to date: $out"
  echo "$out" >&3
  exit 0
fi

mkdir -p "$image_dir/node-bin"
exec 9>"$image_dir/node-bin/.build.lock"
flock 9
if [[ -f $out/.complete ]]; then # another build finished while we waited
  echo "$out" >&3
  exit 0
fi
rm -rf "$image_dir/node-bin"/.tmp.* # leftovers of an interrupted build; we hold the lock
tmp=$(mktemp -d "$image_dir/node-bin/.tmp.XXXXXX")
mods=$(mktemp -d) # modules made at build time
trap 'rm -rf "$tmp" "$mods"' EXIT

mkdir -p "$tmp/bin" "$tmp/cni"
start=$SECONDS

# build DIR ENV... -- GO-BUILD-ARGS...: go build in a tools module.
build() {
  local dir=$1 envs=()
  shift
  while [[ $1 != -- ]]; do
    envs+=("$1")
    shift
  done
  shift
  local t=$SECONDS
  (cd "$dir" && env "${envs[@]}" go build -trimpath "$@")
  log "built ${*: -1} in $((SECONDS - t)) s"
}

m=$node_modules/containerd
v=$(mod_version "$m/go.mod" github.com/containerd/containerd/v2)
for cmd in containerd containerd-shim-runc-v2 ctr; do
  build "$m" CGO_ENABLED=0 -- -tags no_btrfs \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$v -X github.com/containerd/containerd/v2/version.Package=github.com/containerd/containerd/v2" \
    -o "$tmp/bin/$cmd" "github.com/containerd/containerd/v2/cmd/$cmd"
done

m=$node_modules/runc
v=$(mod_version "$m/go.mod" github.com/opencontainers/runc)
build "$m" CGO_ENABLED=1 -- -tags "seccomp urfave_cli_no_docs netgo osusergo" \
  -ldflags "-s -w -X main.version=${v#v} -extldflags -static" -o "$tmp/bin/runc" github.com/opencontainers/runc

m=$node_modules/cri-tools
v=$(mod_version "$m/go.mod" sigs.k8s.io/cri-tools)
build "$m" CGO_ENABLED=0 -- -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$v" \
  -o "$tmp/bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl

m=$node_modules/cni-plugins
v=$(mod_version "$m/go.mod" github.com/containernetworking/plugins)
for p in $(sed -n 's|^\t_ "github.com/containernetworking/plugins/\(plugins/.*\)"$|\1|p' "$m/tools.go"); do
  build "$m" CGO_ENABLED=0 -- \
    -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$v" \
    -o "$tmp/cni/${p##*/}" "github.com/containernetworking/plugins/$p"
done

# The Kubernetes module of the release: kubeadm's constants name the coredns
# it deploys, build/pause the pause program.
kube_dir=$(cd "$kube_module" && go mod download -json "k8s.io/kubernetes@$kube_version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[[ -n $kube_dir ]] || die "k8s.io/kubernetes@$kube_version is not served"
kubeadm_constants=$kube_dir/cmd/kubeadm/app/constants/constants.go

# coredns: the pinned module when kubeadm deploys its version (the pinned
# release's kubeadm does); for another minor's a module made like it, from
# scratch, so that every dependency is the one that coredns release requires.
coredns_version=$(sed -n 's/^\tCoreDNSVersion = "\(v[0-9.]*\)"$/\1/p' "$kubeadm_constants")
[[ -n $coredns_version ]] || die "no CoreDNSVersion in $kubeadm_constants"
m=$node_modules/coredns
if [[ $coredns_version != "$(mod_version "$m/go.mod" github.com/coredns/coredns)" ]]; then
  log "coredns $coredns_version for Kubernetes $kube_version instead of the pinned $(mod_version "$m/go.mod" github.com/coredns/coredns)"
  mkdir "$mods/coredns"
  cp "$m/tools.go" "$mods/coredns/"
  (
    cd "$mods/coredns" &&
      go mod init "$(awk '$1 == "module" {print $2; exit}' "$m/go.mod")" 2>/dev/null &&
      go mod edit -go="$(awk '$1 == "go" {print $2; exit}' "$m/go.mod")" -require="github.com/coredns/coredns@$coredns_version" &&
      go mod tidy
  ) || die "no module graph for coredns $coredns_version" # (set -e does not apply left of ||)
  m=$mods/coredns
fi
build "$m" CGO_ENABLED=0 -- -ldflags "-s -w" -o "$tmp/bin/coredns" github.com/coredns/coredns

# flanneld's UDP backend needs cgo; link statically so the binary runs in
# any image base.
m=$node_modules/flannel
v=$(mod_version "$m/go.mod" github.com/flannel-io/flannel)
build "$m" CGO_ENABLED=1 -- -tags netgo,osusergo \
  -ldflags "-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$v -extldflags -static" \
  -o "$tmp/bin/flanneld" github.com/flannel-io/flannel

# Kubernetes and etcd: from the cache hack/envtest.sh shares, built there
# once per release.
kube_bin=$(KUBERNETES_VERSION=$kube_version "$root/hack/kubernetes.sh" kubelet kubeadm kubectl kube-proxy kube-scheduler kube-controller-manager kube-apiserver etcd)
cp "$kube_bin"/{kubelet,kubeadm,kubectl,kube-proxy,kube-scheduler,kube-controller-manager,kube-apiserver,etcd} "$tmp/bin/"

# pause: the C program of kubernetes' build/pause, as its Makefile builds it.
pause_version=$(sed -n 's/^TAG ?= *//p' "$kube_dir/build/pause/Makefile")
[[ -n $pause_version ]] || die "no TAG in $kube_dir/build/pause/Makefile"
gcc -Os -Wall -Werror -static -DVERSION="v$pause_version" -o "$tmp/bin/pause" "$kube_dir/build/pause/linux/pause.c"
strip "$tmp/bin/pause"

{
  echo "k8s.io/kubernetes $kube_version"
  echo "pause $pause_version"
  # etcd and coredns as the binaries report themselves (containers.sh tags their images so)
  echo "go.etcd.io/etcd/server/v3 v$("$tmp/bin/etcd" --version | awk '$1 == "etcd" && $2 == "Version:" {print $3}')"
  echo "github.com/coredns/coredns v$("$tmp/bin/coredns" -version | sed -n 's/^CoreDNS-//p')"
  for d in "$node_modules"/*/; do # each tools module requires its component first
    [[ $d == */coredns/ ]] && continue
    awk '$1 == "require" && $2 != "(" {print $2, $3; exit}' "$d/go.mod"
  done
} >"$tmp/VERSIONS"
touch "$tmp/.complete"
chmod 0755 "$tmp"
mv "$tmp" "$out"
trap - EXIT
log "all node binaries built in $((SECONDS - start)) s: $out ($(du -sh "$out" | cut -f1))"
echo "$out" >&3

#!/usr/bin/env bash
# Builds Kubernetes binaries of one release from the Go module proxy, once for
# everything that needs them: envtest and the management plane (hack/envtest.sh)
# and the node image (images/node/binaries.sh) take theirs from the same cache,
# so no release is compiled or linked twice.
#
# Usage: hack/kubernetes.sh BINARY...
#   BINARY: kube-apiserver kube-controller-manager kube-scheduler kube-proxy
#           kubelet kubeadm kubectl etcd
#   KUBERNETES_VERSION: the release (default: hack/tools/envtest's pin); etcd
#           is the version that release's kubeadm deploys (for the pin:
#           the module's go.etcd.io/etcd/server/v3, the same one)
# Prints the directory holding the binaries on stdout. Binaries already there
# are not built again.
#
# The directory is $CAPL_KUBERNETES_CACHE/<version>-<key> (default cache
# /var/cache/capi-libvirt/kubernetes), where <key> hashes this script, the
# envtest tools module and the Go version. Each binary is linked to a
# temporary name and renamed, so an interrupted build is never mistaken for a
# finished one; a lock lets concurrent callers share one build.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
exec 3>&1 1>&2 # stdout is for the output directory only

log() { printf '%s kubernetes: %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

(($# > 0)) || die "usage: $0 BINARY..."
for b in "$@"; do
  case $b in
  kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy | kubelet | kubeadm | kubectl | etcd) ;;
  *) die "unknown binary $b" ;;
  esac
done

export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0
command -v go >/dev/null || die "no go on PATH (Go 1.26 at /usr/local/go/bin)"

module=$root/hack/tools/envtest
pinned=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$module/go.mod")
version=${KUBERNETES_VERSION:-$pinned}
[[ $version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "KUBERNETES_VERSION $version is not v1.MINOR.PATCH"

key=$({
  echo "kubernetes $version"
  go version
  cat "${BASH_SOURCE[0]}" "$module/go.mod" "$module/go.sum"
} | sha256sum | cut -c1-16)
cache=${CAPL_KUBERNETES_CACHE:-/var/cache/capi-libvirt/kubernetes}
out=$cache/$version-$key

missing() {
  local b
  for b in "$@"; do [[ -x $out/$b ]] || echo "$b"; done
}
if [[ -z $(missing "$@") ]]; then
  echo "$out" >&3
  exit 0
fi

mkdir -p "$out"
exec 9>"$out/.build.lock"
flock 9
mapfile -t todo < <(missing "$@") # another build may have finished some while we waited
if ((${#todo[@]} == 0)); then
  echo "$out" >&3
  exit 0
fi
rm -f "$out"/*.tmp # leftovers of an interrupted build; we hold the lock

# Another release than the pinned one: a module of its own, made the way the
# pinned one was: k8s.io/kubernetes at that release, the staging modules its
# go.mod replaces by ./staging paths at v0.MINOR.PATCH, and the etcd server its
# kubeadm deploys (DefaultEtcdVersion); go mod tidy takes every other version
# from that release's requirements. (Editing a copy of the pinned module would
# keep the pin's dependency versions and staging list, which another minor
# does not have: 1.36 added k8s.io/cri-streaming, absent from 1.35.)
if [[ $version != "$pinned" ]]; then
  log "Kubernetes $version instead of the pinned $pinned"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp "$module/tools.go" "$tmp/"
  mod_path=$(awk '$1 == "module" {print $2; exit}' "$module/go.mod")
  go_version=$(awk '$1 == "go" {print $2; exit}' "$module/go.mod")
  module=$tmp
  cd "$module"
  go mod init "$mod_path" 2>/dev/null || die "go mod init $mod_path failed in $module"
  go mod edit -go="$go_version"
  kube_dir=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p') ||
    die "k8s.io/kubernetes@$version is not served"
  [[ -n $kube_dir ]] || die "no directory for k8s.io/kubernetes@$version in the module cache"
  etcd=$(sed -n 's/^\tDefaultEtcdVersion = "\([0-9.]*\)-[0-9]*"$/\1/p' "$kube_dir/cmd/kubeadm/app/constants/constants.go")
  [[ -n $etcd ]] || die "no DefaultEtcdVersion in kubeadm $version's constants"
  edits=(-require="k8s.io/kubernetes@$version" -require="go.etcd.io/etcd/server/v3@v$etcd")
  for m in $(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$kube_dir/go.mod"); do
    edits+=(-replace="$m=$m@v0.${version#v1.}")
  done
  go mod edit "${edits[@]}"
  go mod tidy || die "no module graph for Kubernetes $version"
  log "module for $version: etcd v$etcd, $(grep -c '=>' go.mod) staging modules"
fi

v=${version#v}
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=${v%%.*} -X $pkg.gitMinor=$(cut -d. -f2 <<<"$v") -X $pkg.gitTreeState=clean"
cd "$module"
start=$SECONDS
# kubelet first when asked for: it compiles most of the packages the others share.
for b in kubelet kubeadm kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl etcd; do
  [[ " ${todo[*]} " == *" $b "* ]] || continue
  t=$SECONDS
  if [[ $b == etcd ]]; then
    go build -trimpath -ldflags "-s -w" -o "$out/$b.tmp" go.etcd.io/etcd/server/v3
    what="etcd $(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3) for $version"
  else
    go build -trimpath -ldflags "$ldflags" -o "$out/$b.tmp" "k8s.io/kubernetes/cmd/$b"
    what="$b $version"
  fi
  mv "$out/$b.tmp" "$out/$b"
  log "built $what in $((SECONDS - t)) s"
done
log "built ${todo[*]} in $((SECONDS - start)) s: $out"
echo "$out" >&3

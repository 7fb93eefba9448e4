#!/usr/bin/env bash
# Builds kube-apiserver, etcd and kubectl for envtest, and kube-controller-manager for
# the one-host management plane (internal/devplane), from the Go module proxy,
# because setup-envtest's prebuilt downloads are not reachable from our machines.
# The binaries land in setup-envtest's layout, <bin>/k8s/<version>-linux-amd64/,
# and the script prints that directory (use it as KUBEBUILDER_ASSETS).
# A second run with the binaries present does nothing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
module="$root/hack/tools/envtest"
version=$(awk '$1 == "k8s.io/kubernetes" {print substr($2, 2); exit}' "$module/go.mod")
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$module/go.mod")
assets="${ENVTEST_BIN_DIR:-$root/bin}/k8s/${version}-linux-amd64"

binaries=(kube-apiserver kubectl kube-controller-manager etcd)
complete=1
for b in "${binaries[@]}"; do [[ -x "$assets/$b" ]] || complete=0; done
if ((complete)); then
  echo "$assets"
  exit 0
fi

mkdir -p "$assets"
cd "$module"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=v$version -X $pkg.gitMajor=${version%%.*} -X $pkg.gitMinor=$(cut -d. -f2 <<<"$version") -X $pkg.gitTreeState=clean"
start=$(date +%s)
go build -trimpath -ldflags "$ldflags" -o "$assets/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -ldflags "$ldflags" -o "$assets/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl
go build -trimpath -ldflags "$ldflags" -o "$assets/kube-controller-manager.tmp" k8s.io/kubernetes/cmd/kube-controller-manager
go build -trimpath -ldflags "-s -w" -o "$assets/etcd.tmp" go.etcd.io/etcd/server/v3
# Rename last so an interrupted build is never mistaken for a finished one.
for b in "${binaries[@]}"; do mv "$assets/$b.tmp" "$assets/$b"; done
echo "built kube-apiserver, kubectl and kube-controller-manager v$version, etcd $etcd_version in $(( $(date +%s) - start ))s" >&2
echo "$assets"

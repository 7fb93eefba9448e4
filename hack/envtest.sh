#!/usr/bin/env bash
# Provides kube-apiserver, etcd and kubectl for envtest, and kube-controller-manager
# for the one-host management plane (internal/devplane), built from the Go module
# proxy by hack/kubernetes.sh (setup-envtest's prebuilt downloads are not reachable
# from our machines) in the cache it shares with the node image.
# The binaries are linked into setup-envtest's layout, <bin>/k8s/<version>-linux-amd64/,
# and the script prints that directory (use it as KUBEBUILDER_ASSETS).
# A second run with the binaries present does nothing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
module="$root/hack/tools/envtest"
version=$(awk '$1 == "k8s.io/kubernetes" {print substr($2, 2); exit}' "$module/go.mod")
assets="${ENVTEST_BIN_DIR:-$root/bin}/k8s/${version}-linux-amd64"

binaries=(kube-apiserver kubectl kube-controller-manager etcd)
complete=1
for b in "${binaries[@]}"; do [[ -x "$assets/$b" ]] || complete=0; done
if ((complete)); then
  echo "$assets"
  exit 0
fi

# shellcheck source=timings.sh
source "$root/hack/timings.sh"
key="envtest v$version"
printf '%s envtest: %s v%s from the Kubernetes build cache, built first when missing (%s; cold, a 2-core host took 9-14 min)\n' \
  "$(date +%T)" "${binaries[*]}" "$version" "$(timing_last "$key")" >&2
start=$SECONDS
built=$(KUBERNETES_VERSION="v$version" go_quiet "$root/hack/kubernetes.sh" "${binaries[@]}")
# Only a build is a figure worth keeping; linking from the cache takes seconds.
if ((SECONDS - start > 30)); then
  timing_record "$key" $((SECONDS - start))
fi
mkdir -p "$assets"
for b in "${binaries[@]}"; do ln -sfn "$built/$b" "$assets/$b"; done
echo "$assets"

#!/usr/bin/env bash
# Copies every CRD and webhook manifest the management plane installs into
# internal/plane/manifests, which the plane embeds (go:embed) so that capl-dev
# runs without the checkout or the Go module cache: the provider's (config/,
# as controller-gen writes them) and Cluster API's core, kubeadm bootstrap and
# kubeadm control-plane ones from the module go.mod pins. `make generate` runs
# it; `make verify` fails when the copy is stale.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=internal/plane/manifests
capi=$(GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)
[[ -d $capi ]] || { echo "plane-manifests: no sigs.k8s.io/cluster-api module at '$capi'" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/provider/crds" "$out/cluster-api/core/crds"
cp config/crd/bases/*.yaml "$out/provider/crds/"
cp config/webhook/manifests.yaml "$out/provider/webhooks.yaml"
cp "$capi"/core/config/crd/bases/*.yaml "$out/cluster-api/core/crds/"
cp "$capi/core/config/webhook/manifests.yaml" "$out/cluster-api/core/webhooks.yaml"
# The kubeadm providers' kustomizations add the contract labels the topology
# controller looks up; the plane applies them as kustomize would.
for p in controlplane:kubeadm-control-plane bootstrap:kubeadm-bootstrap; do
  src=$capi/${p%%:*}/kubeadm/config
  dst=$out/cluster-api/${p##*:}
  mkdir -p "$dst/crds/bases"
  cp "$src/crd/kustomization.yaml" "$dst/crds/"
  cp "$src"/crd/bases/*.yaml "$dst/crds/bases/"
  cp "$src/webhook/manifests.yaml" "$dst/webhooks.yaml"
done
chmod -R u+w,go-w "$out"
find "$out" -type f -exec chmod 0644 {} +

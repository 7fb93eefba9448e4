#!/usr/bin/env bash
# Builds, offline, everything `clusterctl init --infrastructure libvirt`
# installs, as a clusterctl local repository and the container images it
# names, so that a cluster made by the one-host plane can become a management
# cluster without a public registry or GitHub:
#   - Cluster API's core, kubeadm bootstrap and kubeadm control-plane
#     providers: their managers built from the Cluster API module of the
#     provider's go.mod (its own module graph has all they import), their
#     components YAML from that module's kustomize trees (config/default),
#     as Cluster API's release-manifests target builds them;
#   - cert-manager: controller, webhook and cainjector built from its Go
#     module, its static manifest rendered from the module's Helm chart as
#     its own `make static-manifests` does (helm template, CRDs included,
#     startupapicheck left out);
#   - this provider: the release manifests of `make release-manifests`.
# The images carry the names the manifests use (registry.k8s.io/cluster-api/…,
# quay.io/jetstack/…): nodes of the plane pull them through their mirror of
# every registry, the plane's registry (images/node: capl-registry-mirror),
# into which `capl-dev serve --registry-layout=OUT_DIR/oci` pushes them.
#
# Usage: images/providers/build.sh OUT_DIR
#        images/providers/build.sh --manifests OUT_DIR
#   --manifests writes only Cluster API's three providers' repository
#   (OUT_DIR/repository/, below), naming the images Cluster API publishes
#   for its release of go.mod: no manager built, no image, no cert-manager,
#   no infrastructure provider (make release: Cluster API's part of
#   dist/release/clusterctl.yaml). It needs KUSTOMIZE only.
#
# Environment:
#   CERT_MANAGER_VERSION  the cert-manager release (required; the Makefile's pin)
#   INFRA_RELEASE_DIR     make release-manifests' output (required)
#   INFRA_VERSION         the provider's release version (required)
#   KUSTOMIZE, HELM       the tools (required; the Makefile builds them)
#   KUBERNETES_VERSION    the clusters' Kubernetes release, for the chart's
#                         kubeVersion check (required; the node image's)
#
# OUT_DIR is replaced by:
#   oci/                 an OCI image layout with the six images
#   refs                 "reference digest" per image
#   repository/          clusterctl's local repository: {provider}/{version}/
#                        components and metadata.yaml, cert-manager/{version}/
#   clusterctl.yaml      a clusterctl configuration naming the repository
#                        (clusterctl --config OUT_DIR/clusterctl.yaml init …)
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
manifests_only=false
if [[ ${1:-} == --manifests ]]; then
  manifests_only=true
  shift
fi
out_dir=$(realpath -m "${1:?usage: build.sh [--manifests] OUT_DIR}")
: "${KUSTOMIZE:?}"
$manifests_only || : "${CERT_MANAGER_VERSION:?}" "${INFRA_RELEASE_DIR:?}" "${INFRA_VERSION:?}" "${HELM:?}" "${KUBERNETES_VERSION:?}"
log() { printf '%s providers: %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}
start=$SECONDS

capi_version=$(cd "$root" && go list -m -f '{{.Version}}' sigs.k8s.io/cluster-api)
[[ -n $capi_version ]] || die "no sigs.k8s.io/cluster-api in go.mod"
case $(ls -A "$out_dir" 2>/dev/null) in
"") ;;                  # absent or empty
*clusterctl.yaml*) ;;   # a previous build: replaced
repository) ;;          # a previous --manifests build: replaced
*) die "$out_dir holds other files than a previous build's; give an absent or empty directory" ;;
esac
export GOFLAGS=-mod=readonly GOTOOLCHAIN=local CGO_ENABLED=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/out"

# module_dir MODULE@VERSION: its directory in the module cache, downloaded
# (and checked against the checksum database) when missing.
module_dir() {
  (cd "$work" && GOFLAGS= go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
}
capi_dir=$(module_dir "sigs.k8s.io/cluster-api@$capi_version")
[[ -d $capi_dir ]] || die "could not download Cluster API $capi_version"
capi_registry=registry.k8s.io/cluster-api cm_registry=quay.io/jetstack

# 1. The repository, in clusterctl's layout for a local repository:
#    {basepath}/{provider-label}/{version}/{components.yaml}.
repo=$work/out/repository
# capi_components LABEL CONFIG_DIR FILE IMAGE: one of Cluster API's providers,
# its manager image set to IMAGE (name:tag), its pull policy that of Cluster
# API's releases (IfNotPresent; the kustomize tree says Always, for
# development).
capi_components() {
  local label=$1 config=$2 file=$3 image=$4 k=$work/kustomize/$1
  mkdir -p "$k" "$repo/$label/$capi_version"
  cat >"$k/kustomization.yaml" <<EOF
resources:
- $(realpath --relative-to="$k" "$capi_dir/$config")
images:
- name: gcr.io/k8s-staging-cluster-api/${image%%:*}
  newName: $capi_registry/${image%%:*}
  newTag: ${image#*:}
patches:
- target:
    kind: Deployment
  patch: |-
    - op: replace
      path: /spec/template/spec/containers/0/imagePullPolicy
      value: IfNotPresent
EOF
  "$KUSTOMIZE" build "$k" >"$repo/$label/$capi_version/$file"
  grep -q "image: $capi_registry/$image\$" "$repo/$label/$capi_version/$file" ||
    die "$label: $file does not run $capi_registry/$image"
  cp "$capi_dir/metadata.yaml" "$repo/$label/$capi_version/metadata.yaml"
}
log "writing the repository"
capi_components cluster-api core/config/default core-components.yaml "cluster-api-controller:$capi_version"
capi_components bootstrap-kubeadm bootstrap/kubeadm/config/default bootstrap-components.yaml "kubeadm-bootstrap-controller:$capi_version"
capi_components control-plane-kubeadm controlplane/kubeadm/config/default control-plane-components.yaml "kubeadm-control-plane-controller:$capi_version"

if $manifests_only; then
  rm -rf "$out_dir"
  mkdir -p "$out_dir"
  mv "$repo" "$out_dir/repository"
  log "Cluster API $capi_version's core, kubeadm bootstrap and kubeadm control-plane components in $out_dir/repository"
  exit 0
fi
cm_dir=$(module_dir "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION")
[[ -d $cm_dir ]] || die "could not download cert-manager $CERT_MANAGER_VERSION"
[[ -d $cm_dir/cmd/controller && ! -f $cm_dir/cmd/controller/go.mod ]] ||
  die "cert-manager $CERT_MANAGER_VERSION keeps its controllers in modules of their own (v1.12 and later), which the module proxy does not serve; use v1.11.x"

# 2. The managers: static, as Cluster API's and cert-manager's Dockerfiles
#    build them (CGO_ENABLED=0, -trimpath), with their version variables.
log "building Cluster API $capi_version's managers (core, kubeadm bootstrap, kubeadm control plane)"
for main in core bootstrap/kubeadm controlplane/kubeadm; do
  (cd "$root" && go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$capi_version -X sigs.k8s.io/cluster-api/version.gitTreeState=clean" \
    -o "$work/bin/${main//\//-}" "sigs.k8s.io/cluster-api/$main")
done
# cert-manager's go.mod replaces a dependency, so it is built inside its own
# module (the module cache's copy, read only) rather than from ours.
log "building cert-manager $CERT_MANAGER_VERSION (controller, webhook, cainjector)"
(cd "$cm_dir" && go build -trimpath \
  -ldflags "-s -w -X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$CERT_MANAGER_VERSION" \
  -o "$work/bin/" ./cmd/controller ./cmd/webhook ./cmd/cainjector)

# 3. The images, named as the manifests name them.
image() { # REF SRC DST USER
  printf '{"ref": "%s", "baseTar": "", "files": [{"src": "%s", "dst": "%s"}], "entrypoint": ["%s"], "user": "%s"}' "$1" "$2" "$3" "$3" "$4"
}
{
  echo '{"images": ['
  image "$capi_registry/cluster-api-controller:$capi_version" "$work/bin/core" /manager 65532:65532
  echo ,
  image "$capi_registry/kubeadm-bootstrap-controller:$capi_version" "$work/bin/bootstrap-kubeadm" /manager 65532:65532
  echo ,
  image "$capi_registry/kubeadm-control-plane-controller:$capi_version" "$work/bin/controlplane-kubeadm" /manager 65532:65532
  for c in controller webhook cainjector; do
    echo ,
    image "$cm_registry/cert-manager-$c:$CERT_MANAGER_VERSION" "$work/bin/$c" "/app/cmd/$c/$c" 1000
  done
  echo ']}'
} >"$work/spec.json"
log "writing the images"
(cd "$root/images/oci" && go run . -spec "$work/spec.json" -layout "$work/out/oci" -refs "$work/out/refs")

# 4. This provider and cert-manager in the repository.
mkdir -p "$repo/infrastructure-libvirt/$INFRA_VERSION"
cp "$INFRA_RELEASE_DIR"/*.yaml "$repo/infrastructure-libvirt/$INFRA_VERSION/"

# cert-manager's static manifest: its chart with the version filled in and
# the CRDs as a template, rendered as its make/manifests.mk renders it.
chart=$work/chart/cert-manager
cm_manifest=cert-manager/$CERT_MANAGER_VERSION/cert-manager.yaml
mkdir -p "$chart" "$repo/$(dirname "$cm_manifest")"
cp -r "$cm_dir/deploy/charts/cert-manager/templates" "$cm_dir/deploy/charts/cert-manager/values.yaml" "$chart/"
chmod -R u+w "$chart"
sed -e "s/^version: .*/version: $CERT_MANAGER_VERSION/" -e "s/^appVersion: .*/appVersion: $CERT_MANAGER_VERSION/" \
  -e 's/{{IS_PRERELEASE}}/false/' "$cm_dir/deploy/charts/cert-manager/Chart.template.yaml" >"$chart/Chart.yaml"
{
  echo '{{- if .Values.installCRDs }}'
  for crd in "$cm_dir"/deploy/crds/*.yaml; do
    echo ---
    cat "$crd"
  done
  echo '{{- end }}'
} >"$chart/templates/crds.yaml"
{
  cat "$cm_dir/deploy/manifests/namespace.yaml"
  echo ---
  "$HELM" template --kube-version="$KUBERNETES_VERSION" --namespace=cert-manager --set=installCRDs=true --set=creator=static \
    --set=startupapicheck.enabled=false cert-manager "$chart" | sed -e '1{/^---$/d;}'
} >"$repo/$cm_manifest"
for c in controller webhook cainjector; do
  grep -q "image: \"$cm_registry/cert-manager-$c:$CERT_MANAGER_VERSION\"" "$repo/$cm_manifest" ||
    die "cert-manager.yaml does not run $cm_registry/cert-manager-$c:$CERT_MANAGER_VERSION"
done

# 5. clusterctl's configuration: every provider init installs, from the
#    repository (a file:// URL's directory is read as a local repository),
#    and cert-manager from its file.
cat >"$work/out/clusterctl.yaml" <<EOF
# Written by images/providers/build.sh. Use:
#   CLUSTERCTL_DISABLE_VERSIONCHECK=true clusterctl --config $out_dir/clusterctl.yaml init --infrastructure libvirt
providers:
- name: cluster-api
  type: CoreProvider
  url: file://$out_dir/repository/cluster-api/$capi_version/core-components.yaml
- name: kubeadm
  type: BootstrapProvider
  url: file://$out_dir/repository/bootstrap-kubeadm/$capi_version/bootstrap-components.yaml
- name: kubeadm
  type: ControlPlaneProvider
  url: file://$out_dir/repository/control-plane-kubeadm/$capi_version/control-plane-components.yaml
- name: libvirt
  type: InfrastructureProvider
  url: file://$out_dir/repository/infrastructure-libvirt/$INFRA_VERSION/infrastructure-components.yaml
cert-manager:
  url: $out_dir/repository/$cm_manifest
  version: $CERT_MANAGER_VERSION
  # clusterctl's default is 10m; the first pull of cert-manager's images
  # into a TCG guest and its webhook's start can take longer.
  timeout: 30m
EOF

rm -rf "$out_dir"
mkdir -p "$(dirname "$out_dir")"
mv "$work/out" "$out_dir"
log "Cluster API $capi_version, cert-manager $CERT_MANAGER_VERSION and infrastructure-libvirt $INFRA_VERSION in $out_dir" \
  "(images $(du -sh --apparent-size "$out_dir/oci/blobs" | cut -f1) compressed), built in $((SECONDS - start)) s"
log "use: CLUSTERCTL_DISABLE_VERSIONCHECK=true clusterctl --config $out_dir/clusterctl.yaml init --infrastructure libvirt"

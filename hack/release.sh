#!/usr/bin/env bash
# Completes make release's directory, which make release-manifests has filled
# with this provider's release assets (infrastructure-components.yaml,
# metadata.yaml, the cluster templates and the ClusterClass), into what a
# provider's GitHub release holds plus what clusterctl needs to install from
# it without the network:
#   manager-image.tar     the manager image of make image (an OCI image layout
#                         as one tarball, naming IMG for ctr images import)
#   manager-image.digest  its manifest's digest, which infrastructure-components.yaml
#                         runs (IMG@digest)
#   repository/           clusterctl's local repository layout,
#                         {basepath}/{provider-label}/{version}/{file}:
#                         infrastructure-libvirt/VERSION/ (links to the assets
#                         above) and Cluster API's core, kubeadm bootstrap and
#                         kubeadm control-plane providers of go.mod's release
#                         (images/providers/build.sh --manifests)
#   clusterctl.yaml       a providers: list naming that repository by absolute
#                         path: clusterctl init --infrastructure libvirt
#                         --config RELEASE_DIR/clusterctl.yaml
#
# usage: hack/release.sh RELEASE_DIR VERSION MANAGER_IMAGE_DIR
# environment: IMG (the manager image's name), KUSTOMIZE
set -euo pipefail

log() { printf '%s release: %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}
[[ $# == 3 ]] || die "usage: hack/release.sh RELEASE_DIR VERSION MANAGER_IMAGE_DIR"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(realpath "$1") version=$2 image_dir=$(realpath -m "$3")
: "${IMG:?IMG is not set}" "${KUSTOMIZE:?KUSTOMIZE is not set}"
[[ -f $out/infrastructure-components.yaml && -f $out/metadata.yaml ]] || die "$out holds no release manifests (make release-manifests RELEASE_DIR=$out)"

# clusterctl takes only versions of a release series of metadata.yaml.
[[ $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+([-+].*)?$ ]] || die "version $version is not vMAJOR.MINOR.PATCH"
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
awk -v major="$major" -v minor="$minor" '
  /^- major:/ { m = $3 } /^  minor:/ && m == major && $2 == minor { found = 1 } END { exit !found }' "$out/metadata.yaml" ||
  die "metadata.yaml has no release series $major.$minor for $version: add it there"

# The image: this commit's build of IMG, which the components run by digest.
[[ -f $image_dir/image.tar && -f $image_dir/digest && -f $image_dir/ref ]] || die "no manager image in $image_dir (make image)"
ref=$(<"$image_dir/ref") digest=$(<"$image_dir/digest")
[[ $ref == "$IMG@$digest" ]] || die "$image_dir holds $ref, not a build of $IMG"
awk -v ref="$ref" '$1 == "image:" && $2 == ref { found = 1 } END { exit !found }' "$out/infrastructure-components.yaml" ||
  die "infrastructure-components.yaml does not run $ref: $image_dir is not this commit's build (commit or stash your changes; make release then builds it)"
cp "$image_dir/image.tar" "$out/manager-image.tar"
echo "$digest" >"$out/manager-image.digest"

# The repository: this provider's assets linked in, Cluster API's written.
repo=$out/repository
mkdir -p "$repo/infrastructure-libvirt/$version"
for f in "$out"/*.yaml; do
  ln -s "../../../${f##*/}" "$repo/infrastructure-libvirt/$version/${f##*/}"
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
KUSTOMIZE=$KUSTOMIZE "$root/images/providers/build.sh" --manifests "$work/capi"
mv "$work/capi/repository/"* "$repo/"
core() { # LABEL: the path of its one components file
  local f
  f=$(cd "$repo" && echo "$1"/v*/*-components.yaml)
  [[ -f $repo/$f ]] || die "no components of $1 in $repo"
  echo "$repo/$f"
}

cat >"$out/clusterctl.yaml" <<YAML
# Written by make release (hack/release.sh) for this directory, where it is:
#   clusterctl init --infrastructure libvirt --config $out/clusterctl.yaml
# reads every provider from repository/ (clusterctl's local repository
# layout), without the network. cert-manager is not here: clusterctl installs
# its own default release from GitHub unless the cluster has cert-manager.
# Moved elsewhere, the directory needs these paths changed (or make release
# RELEASE_OUT=there).
providers:
- name: libvirt
  type: InfrastructureProvider
  url: $repo/infrastructure-libvirt/$version/infrastructure-components.yaml
- name: cluster-api
  type: CoreProvider
  url: $(core cluster-api)
- name: kubeadm
  type: BootstrapProvider
  url: $(core bootstrap-kubeadm)
- name: kubeadm
  type: ControlPlaneProvider
  url: $(core control-plane-kubeadm)
YAML
log "$out: infrastructure-libvirt $version, the manager image $ref, Cluster API's providers; use:"
log "  clusterctl init --infrastructure libvirt --config $out/clusterctl.yaml"

#!/usr/bin/env bash
# Writes the container images a kubeadm node runs, offline, into one
# OCI image layout tarball: every image `kubeadm config images list` names for the
# node's Kubernetes version, and the CNI's (flannel), with exactly those names.
# Called by images/build.sh for the node image; not meant to be run alone.
#
# Usage: containers.sh BIN_DIR BASE_ROOTFS_TAR OUT_TAR OUT_REFS
#   BIN_DIR          output of images/node/binaries.sh
#   BASE_ROOTFS_TAR  a minimal Debian root file system with iptables, nft and
#                    conntrack, the base of the kube-proxy and flannel images
#   OUT_TAR          the OCI image layout tarball to write
#   OUT_REFS         "reference digest" lines, one per image
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin_dir=${1:?usage: containers.sh BIN_DIR BASE_ROOTFS_TAR OUT_TAR OUT_REFS}
bin=$bin_dir/bin
base=${2:?} out=${3:?} refs=${4:?}
log() { printf '%s node-images: %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

kube_version=$("$bin/kubeadm" version -o short)
flannel_version=$(awk '$1 == "require" && $2 == "github.com/flannel-io/flannel" {print $3}' "$root/hack/tools/node/flannel/go.mod")
# etcd and coredns: the versions binaries.sh built for this release (its kubeadm's)
etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$bin_dir/VERSIONS")
coredns_version=$(awk '$1 == "github.com/coredns/coredns" {print $2; exit}' "$bin_dir/VERSIONS")
[[ -n $etcd_version && -n $coredns_version ]] || die "no etcd or coredns version in $bin_dir/VERSIONS"
pause_version=$("$bin/pause" -v 2>&1 | awk '{print $NF}' | sed 's/^v//')
path_env='PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

# json_image REF BASE_TAR SRC DST ENTRYPOINT [USER]: one image of the spec.
json_image() {
  local ref=$1 base_tar=$2 src=$3 dst=$4 entry=$5 user=${6:-}
  printf '{"ref": "%s", "baseTar": "%s", "files": [{"src": "%s", "dst": "%s"}], "entrypoint": ["%s"], "env": ["%s"], "user": "%s"}' \
    "$ref" "$base_tar" "$src" "$dst" "$entry" "$path_env" "$user"
}

images=()
# The names kubeadm asks for; the build fails when one of them is a version we
# did not build (update the pins in hack/tools, not the tags).
while read -r ref; do
  repo=${ref%:*} tag=${ref##*:}
  case ${repo##*/} in
  kube-apiserver | kube-controller-manager | kube-scheduler)
    [[ $tag == "$kube_version" ]] || die "kubeadm wants $ref, the binaries are $kube_version"
    images+=("$(json_image "$ref" "" "$bin/${repo##*/}" "/usr/local/bin/${repo##*/}" "/usr/local/bin/${repo##*/}")")
    ;;
  kube-proxy) # iptables, nft and conntrack come from the Debian base
    [[ $tag == "$kube_version" ]] || die "kubeadm wants $ref, the binaries are $kube_version"
    images+=("$(json_image "$ref" "$base" "$bin/kube-proxy" /usr/local/bin/kube-proxy /usr/local/bin/kube-proxy)")
    ;;
  etcd)
    [[ ${tag%-*} == "${etcd_version#v}" ]] || die "kubeadm wants $ref, the etcd built is $etcd_version"
    images+=("$(json_image "$ref" "" "$bin/etcd" /usr/local/bin/etcd /usr/local/bin/etcd)")
    ;;
  coredns)
    [[ $tag == "$coredns_version" ]] || die "kubeadm wants $ref, the coredns built is $coredns_version"
    images+=("$(json_image "$ref" "" "$bin/coredns" /coredns /coredns)")
    ;;
  pause)
    [[ $tag == "$pause_version" ]] || die "kubeadm wants $ref, the pause built is $pause_version"
    images+=("$(json_image "$ref" "" "$bin/pause" /pause /pause 65535:65535)")
    ;;
  *) die "kubeadm wants $ref, which the node image does not know how to build" ;;
  esac
done < <("$bin/kubeadm" config images list --kubernetes-version "$kube_version" 2>/dev/null)
((${#images[@]} == 7)) || die "kubeadm listed ${#images[@]} images, expected 7"
# The CNI: the name and tag templates/cni-flannel.yaml runs.
images+=("$(json_image "ghcr.io/flannel-io/flannel:$flannel_version" "$base" "$bin/flanneld" /opt/bin/flanneld /opt/bin/flanneld)")

spec=$(mktemp)
trap 'rm -f "$spec"' EXIT
{
  echo '{"images": ['
  (IFS=,; echo "${images[*]}")
  echo ']}'
} >"$spec"
(cd "$root/images/oci" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go run . -spec "$spec" -out "$out" -refs "$refs")
log "$(wc -l <"$refs") images, $(du -h --apparent-size "$out" | cut -f1): $(awk '{print $1}' "$refs" | paste -sd' ')"

#!/usr/bin/env bash
# Installs release files as clusterctl's local override of the
# infrastructure-libvirt provider and registers the provider in
# clusterctl.yaml, so that `clusterctl init --infrastructure libvirt` and
# `clusterctl generate cluster --infrastructure libvirt` work without a
# published release.
#
# usage: hack/clusterctl-override.sh <release dir> <version> <clusterctl config dir>
#
# The provider's repository URL points into the overrides directory itself
# ({dir}/{provider-label}/latest/{components}), which clusterctl reads as a
# local repository: "latest" resolves to the newest version there whose
# metadata.yaml series matches the management cluster's contract.
set -euo pipefail

release_dir=$1 version=$2 config_dir=$3
overrides="$config_dir/overrides/infrastructure-libvirt"
config="$config_dir/clusterctl.yaml"
url="$overrides/latest/infrastructure-components.yaml"

mkdir -p "$overrides/$version"
cp "$release_dir"/*.yaml "$overrides/$version/"
echo "installed $(ls "$release_dir" | wc -l) files in $overrides/$version"

entry="- name: libvirt
  url: $url
  type: InfrastructureProvider"
if [[ ! -s "$config" ]]; then
  printf 'providers:\n%s\n' "$entry" >"$config"
  echo "wrote $config"
elif grep -qF "url: $url" "$config"; then
  echo "$config already registers the provider"
elif ! grep -q '^providers:' "$config"; then
  printf '\nproviders:\n%s\n' "$entry" >>"$config"
  echo "added the provider to $config"
else
  echo "$config has a providers list already; add this entry to it:" >&2
  echo "$entry" | sed 's/^/  /' >&2
  exit 1
fi

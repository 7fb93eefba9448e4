#!/usr/bin/env bash
# Builds the manager's container image reproducibly, without a Docker engine,
# a registry or a base image: the same commit, Debian mirror content and build
# host tools (Go, gcc, binutils, libc6-dev, libvirt-dev, tar) give the same
# image digest. The network serves only what is not cached: apt reads the
# mirror's indices, .debs come from the .deb cache, Go modules from the module
# cache (what is missing there through GOPROXY, checked against go.sum).
# Two layers, written by images/oci (go-containerregistry):
#   base     the Debian bookworm packages of packages.txt and what they need at
#            run time, extracted without maintainer scripts; users root and
#            manager (65532), the CA bundle, the packages' control files in
#            /var/lib/dpkg/status.d (what image scanners read); no apt, no dpkg;
#            /bin/sh (dash) only for the ssh wrapper pkg/hosts writes
#   manager  /manager, built with cgo against the host's libvirt-dev, which must
#            be the libvirt release of the base layer's libvirt0
#
# Usage (as root): images/manager/build.sh OUT_DIR
#                  images/manager/build.sh --ref OUT_DIR
#   --ref prints IMG@<digest> when OUT_DIR holds IMG's image built from this
#   checkout's commit, otherwise IMG (and a warning if OUT_DIR holds another).
#
# Environment:
#   IMG              the image's reference, registry/repository:tag (required)
#   RELEASE_VERSION  its org.opencontainers.image.version label (default: IMG's tag)
#   CAPL_IMAGE_DIR, CAPL_DEB_CACHE, SOURCE_DATE_EPOCH, CAPL_MIRROR, CAPL_SECURITY_MIRROR
#                    as for images/build.sh (the .deb cache and mirrors are shared)
#   What would change the binary is not taken from the environment or go env -w
#   (GOENV=off): CC, CGO_*FLAGS, GOAMD64, GOEXPERIMENT, GOFIPS140, PKG_CONFIG_PATH
#   and the like are unset, GOWORK=off, GOFLAGS=-mod=readonly; GOPROXY, GOSUMDB,
#   GOPRIVATE, GONOPROXY, GONOSUMDB, GOINSECURE, GOMODCACHE and GOCACHE are kept
#   (as go env gives them).
#
# OUT_DIR, which must be absent, empty or a previous build's output (ref and
# digest, nothing but the files below), is replaced by:
#   oci/       the OCI image layout: for a registry (crane push OUT_DIR/oci IMG,
#              skopeo copy oci:OUT_DIR/oci docker://IMG keep the digest)
#   image.tar  the same layout as one tarball, named IMG for containerd
#              (ctr images import, kind load image-archive)
#   digest     the image manifest's digest, sha256:…
#   ref        IMG@digest
#   revision   the commit it was built from, -dirty with uncommitted changes
#   packages   the base layer's packages and versions, then the build host's Go,
#              libvirt-dev, gcc, binutils, libc6-dev and tar
# Prints IMG@digest on stdout; logs go to stderr.
set -euo pipefail
umask 022 # the image's files and directories get the build's modes, not the caller's umask

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

# revision: the commit, as Go's build info records it (vcs.modified: any
# change, untracked files included, makes the binary another one).
revision() {
  local rev
  rev=$(git -C "$root" rev-parse HEAD 2>/dev/null) || {
    echo unknown # not a git checkout
    return 0
  }
  [[ -z $(git -C "$root" status --porcelain) ]] || rev+=-dirty
  echo "$rev"
}

if [[ ${1:-} == --ref ]]; then
  # No lib.sh here: release-manifests runs this without root or apt.
  out_dir=${2:?usage: build.sh --ref OUT_DIR}
  : "${IMG:?IMG is not set}"
  if [[ ! -f $out_dir/ref || ! -f $out_dir/revision ]]; then
    echo "$IMG"
    exit 0
  fi
  built=$(<"$out_dir/ref") built_rev=$(<"$out_dir/revision") rev=$(revision)
  if [[ ${built%@*} != "$IMG" || $built_rev != "$rev" || $rev == *-dirty ]]; then
    printf 'manager-image: warning: %s holds %s built from %s, not %s from %s; referring to %s by tag only (make image)\n' \
      "$out_dir" "$built" "$built_rev" "$IMG" "$rev" "$IMG" >&2
    echo "$IMG"
    exit 0
  fi
  echo "$built"
  exit 0
fi

exec 3>&1 1>&2 # stdout is for the reference only
log_prefix=manager-image
. "$root/images/lib.sh" # definitions only; the mirrors are read after the checks below

case ${1:-} in
-h | --help)
  sed -n '2,45s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
  exit 0
  ;;
'' | -*) die "usage: images/manager/build.sh OUT_DIR (images/manager/build.sh --help)" ;;
esac
(($# == 1)) || die "usage: images/manager/build.sh OUT_DIR (images/manager/build.sh --help)"
out_dir=$(realpath -m "$1")

# What a build writes into OUT_DIR; check_out_dir replaces nothing else.
outputs=(digest image.tar oci packages ref revision)
# check_out_dir: OUT_DIR is absent, empty or a previous build's output, which
# the build may replace; anything else is not this script's to delete.
check_out_dir() {
  local entry
  [[ -e $out_dir || -L $out_dir ]] || return 0
  [[ -d $out_dir && ! -L $out_dir ]] || die "$out_dir exists and is not a directory; not replacing it (give a new or empty directory)"
  [[ -n $(ls -A "$out_dir") ]] || return 0
  [[ -f $out_dir/ref && -f $out_dir/digest ]] ||
    die "$out_dir is not empty and holds no previous build (no ref and digest); not replacing it (give a new or empty directory)"
  while IFS= read -r -d '' entry; do
    entry=${entry##*/}
    [[ " ${outputs[*]} " == *" $entry "* ]] ||
      die "$out_dir holds $entry, which no build writes; not replacing it (give a new or empty directory)"
  done < <(find "$out_dir" -mindepth 1 -maxdepth 1 -print0)
}

: "${IMG:?IMG is not set (registry/repository:tag)}"
tag=${IMG##*/}
[[ $tag == *:* ]] || die "IMG $IMG has no tag"
version=${RELEASE_VERSION:-${tag##*:}}
[[ $version =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] || die "RELEASE_VERSION $version is not a version"
[[ $(id -u) -eq 0 ]] || die "run as root (mmdebstrap root mode, file owners of the image)"
for tool in mmdebstrap dpkg-deb tar flock go gcc pkg-config git; do
  command -v "$tool" >/dev/null || die "missing $tool; run hack/prepare-host.sh"
done
check_out_dir
find_mirrors # mirror, security, sources (lib.sh)
start=$SECONDS
rev=$(revision)

# Go and cgo see nothing of the caller's settings that would change the
# binary: not the go env file (go env -w), nor CC, CGO_*FLAGS, GOAMD64,
# GOEXPERIMENT, a go.work or another pkg-config path (the toolchain's
# defaults, the host's libvirt-dev). Where modules come from and the caches
# are kept: modules are checked against go.sum, and -mod=readonly changes no
# go.mod or go.sum.
for v in GOPROXY GONOPROXY GOSUMDB GONOSUMDB GOPRIVATE GOINSECURE GOMODCACHE GOCACHE; do
  val=$(go env "$v")
  export "$v=$val"
done
unset CC CXX FC CGO_CFLAGS CGO_CPPFLAGS CGO_CXXFLAGS CGO_FFLAGS CGO_LDFLAGS \
  GOAMD64 GOEXPERIMENT GOFIPS140 GO_EXTLINK_ENABLED \
  PKG_CONFIG PKG_CONFIG_PATH PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR \
  CPATH C_INCLUDE_PATH LIBRARY_PATH GCC_EXEC_PREFIX COMPILER_PATH
export GOENV=off GOWORK=off GOTOOLCHAIN=local GOFLAGS=-mod=readonly

# 1. The manager, before taking the build lock that images/build.sh shares:
#    cold, this is minutes of compiling. -trimpath and no DWARF: the binary
#    depends on the sources, Go and libvirt-dev, not on where it is built.
bin=$(mktemp -d "${TMPDIR:-/tmp}/capl-manager.XXXXXX")
trap 'rm -rf "$bin"' EXIT
#    Its version (manager --version): RELEASE_VERSION, the commit and the
#    commit's time, the same for every build of the commit.
commit_date=$(TZ=UTC git -C "$root" show -s --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD 2>/dev/null || echo unknown)
version_pkg=github.com/capi-libvirt/cluster-api-provider-libvirt/internal/version
ldflags="-s -w -X $version_pkg.gitVersion=$version -X $version_pkg.gitCommit=$rev -X $version_pkg.buildDate=$commit_date"
(cd "$root" && CGO_ENABLED=1 GOOS=linux GOARCH=amd64 go build -trimpath -ldflags "$ldflags" -o "$bin/manager" ./cmd/manager)
log "manager built after $((SECONDS - start)) s ($(du -h --apparent-size "$bin/manager" | cut -f1))"

start_work
mv "$bin/manager" "$work/manager"
rm -rf "$bin"

# 2. What the base layer holds: apt resolves the hard dependencies of the
#    listed packages (mmdebstrap's extract variant downloads them through the
#    .deb cache); the packages only the left-out ones need are then dropped.
roots=() excluded=()
while read -r p; do
  if [[ $p == -* ]]; then excluded+=("${p#-}"); else roots+=("$p"); fi
done < <(packages "$here/packages.txt")
mkdir "$work/debs"
CAPL_DEB_CACHE="$deb_cache" CAPL_WORK="$work" CAPL_ROOTS="${roots[*]}" \
  run mmdebstrap "${mm_common[@]}" --variant=extract --format=null \
  --include="$(IFS=,; echo "${roots[*]}")" \
  --extract-hook="$mm_save_debs_hook" \
  --extract-hook='APT_CONFIG=$MMDEBSTRAP_APT_CONFIG apt-get --simulate --quiet install $CAPL_ROOTS >"$CAPL_WORK/simulated" &&
      for f in "$1"/var/cache/apt/archives/*.deb; do ln "$f" "$CAPL_WORK/debs/" 2>/dev/null || cp "$f" "$CAPL_WORK/debs/"; done' \
  "$suite" "$work/null" "${sources[@]}"

# deb NAME: the .deb apt resolved NAME to, named as apt names its downloads.
declare -A deb=()
while read -r name ver arch; do
  deb[$name]=$work/debs/${name}_${ver//:/%3a}_$arch.deb
  [[ -f ${deb[$name]} ]] || die "apt resolved $name $ver, but ${deb[$name]} was not downloaded"
done < <(awk '$1 == "Inst" && match($0, /\[[a-z0-9]+\]\)/) { v = $3; sub(/^\(/, "", v); print $2, v, substr($0, RSTART + 1, RLENGTH - 3) }' "$work/simulated")
(($(grep -c '^Inst ' "$work/simulated") == ${#deb[@]})) || die "cannot read apt's resolution ($work/simulated)"
((${#deb[@]})) || die "apt resolved nothing for ${roots[*]}"

# The packages reachable from the roots through Depends and Pre-Depends (any
# alternative or provider apt resolved) without passing a left-out package.
kept=$(
  for name in "${!deb[@]}"; do
    dpkg-deb -f "${deb[$name]}" Package Provides Pre-Depends Depends
    echo
  done | awk -v roots="${roots[*]}" -v excluded="${excluded[*]}" '
    function name(s) { sub(/^[ \t]+/, "", s); sub(/[ \t:(].*/, "", s); return s }
    /^Package:/ { p = $2; have[p] = 1 }
    /^Provides:/ { n = split(substr($0, 11), a, ","); for (i = 1; i <= n; i++) prov[name(a[i])] = prov[name(a[i])] " " p }
    /^(Pre-)?Depends:/ { sub(/^[^:]*:/, ""); deps[p] = deps[p] "," $0 }
    END {
      split(excluded, x, " "); for (i in x) skip[x[i]] = 1
      n = split(roots, queue, " ")
      for (i = 1; i <= n; i++) if (!(queue[i] in have)) { print "missing root " queue[i] > "/dev/stderr"; exit 1 }
      for (h = 1; h <= n; h++) {
        p = queue[h]; if (p in kept) continue; kept[p] = 1
        g = split(deps[p], groups, ",")
        for (j = 1; j <= g; j++) {
          m = split(groups[j], alts, "|")
          for (k = 1; k <= m; k++) {
            d = name(alts[k]); cands = (d in have ? d : "") prov[d]
            c = split(cands, cs, " ")
            for (l = 1; l <= c; l++) if (!(cs[l] in skip)) queue[++n] = cs[l]
          }
        }
      }
      for (p in kept) print p
    }' | sort
)
log "base: $(wc -w <<<"$kept") of the ${#deb[@]} packages apt resolved; left out: $(comm -23 <(printf '%s\n' "${!deb[@]}" | sort) <(echo "$kept") | paste -sd' ')"

# The manager's libvirt-dev and the image's libvirt0 must be one release: the
# binding calls what the headers declare, which an older library lacks.
lib_version=$(dpkg-deb -f "${deb[libvirt0]}" Version)
dev_version=$(pkg-config --modversion libvirt)
upstream=${lib_version#*:} upstream=${upstream%-*}
[[ $upstream == "$dev_version" ]] ||
  die "the manager is built against libvirt-dev $dev_version, the image's libvirt0 is $lib_version: install libvirt-dev $upstream"

# 3. The base root file system.
rootfs=$work/rootfs
mkdir "$rootfs" "$work/out"
mkdir -p "$rootfs/var/lib/dpkg/status.d"
for name in $kept; do
  dpkg-deb --fsys-tarfile "${deb[$name]}" | tar -x --numeric-owner -C "$rootfs"
  # One control file per package, as distroless images carry them: what
  # scanners read to know the packages without a dpkg database.
  dpkg-deb -f "${deb[$name]}" >"$rootfs/var/lib/dpkg/status.d/$name"
  dpkg-deb -f "${deb[$name]}" Package Version | paste -sd' ' | sed 's/Package: \(.*\) Version: /\1 /' >>"$work/out/packages"
done
# What images/build.sh's dpkg excludes leave out: documentation but the
# copyright files, manual pages, translations.
find "$rootfs/usr/share/doc" -mindepth 2 -maxdepth 2 ! -name copyright -exec rm -rf {} +
rm -rf "$rootfs/usr/share/man" "$rootfs/usr/share/info"
find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} + 2>/dev/null || true
# The manager needs no privilege: no setuid or setgid file (ssh-keysign is
# setuid root) gives a process in the container a way up.
find "$rootfs" -type f -perm /6000 -exec chmod ug-s {} +
# /bin/sh, for the #!/bin/sh wrapper pkg/hosts writes for a qemu+ssh connection
# with a credentials Secret, which libvirt runs as ssh (command=): dash's .deb
# carries the link, which its maintainer scripts would otherwise make.
[[ -e $rootfs/bin/sh || -L $rootfs/bin/sh ]] || ln -s dash "$rootfs/bin/sh"
[[ -f $rootfs/bin/dash && $(readlink "$rootfs/bin/sh") == dash ]] || die "/bin/sh is not a link to dash"
# The users ssh and libvirt look up, the CA bundle update-ca-certificates
# would have written (every certificate of the package, in file name order).
printf '%s\n' 'root:x:0:0:root:/root:/usr/sbin/nologin' 'manager:x:65532:65532:manager:/home/manager:/usr/sbin/nologin' >"$rootfs/etc/passwd"
printf '%s\n' 'root:x:0:' 'manager:x:65532:' >"$rootfs/etc/group"
printf '%s\n' 'passwd: files' 'group: files' 'shadow: files' 'hosts: files dns' 'networks: files' \
  'protocols: files' 'services: files' >"$rootfs/etc/nsswitch.conf"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"
install -d -m 0755 -o 65532 -g 65532 "$rootfs/home/manager"
mkdir -p "$rootfs/etc/ssl/certs"
find "$rootfs/usr/share/ca-certificates" -name '*.crt' -printf '%P\n' | LC_ALL=C sort | while read -r crt; do
  sed -e '$a\' "$rootfs/usr/share/ca-certificates/$crt"
done >"$rootfs/etc/ssl/certs/ca-certificates.crt"
[[ -s $rootfs/etc/ssl/certs/ca-certificates.crt ]] || die "no certificates in ca-certificates"
# Sorted entries, one timestamp, numeric owners, no access or change times:
# the same files give the same bytes.
tar -c -f "$work/base.tar" -C "$rootfs" --sort=name --format=posix --numeric-owner \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime --mtime="@$SOURCE_DATE_EPOCH" .
log "base layer: $(du -sh --apparent-size "$rootfs" | cut -f1) in $(wc -l <"$work/out/packages") packages"

# 4. The image.
labels=$(printf '"org.opencontainers.image.source": "%s", "org.opencontainers.image.revision": "%s", "org.opencontainers.image.version": "%s"' \
  https://github.com/capi-libvirt/cluster-api-provider-libvirt "$rev" "$version")
cat >"$work/spec.json" <<EOF
{"images": [{
  "ref": "$IMG",
  "baseTar": "$work/base.tar",
  "files": [{"src": "$work/manager", "dst": "/manager"}],
  "entrypoint": ["/manager"],
  "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/manager"],
  "user": "65532:65532",
  "labels": {$labels}
}]}
EOF
(cd "$root/images/oci" && go run . -spec "$work/spec.json" \
  -layout "$work/out/oci" -out "$work/out/image.tar" -refs "$work/refs" -gzip-level 6)
digest=$(awk '{print $2}' "$work/refs")
[[ $digest == sha256:* ]] || die "no digest in $work/refs"
echo "$digest" >"$work/out/digest"
echo "$IMG@$digest" >"$work/out/ref"
echo "$rev" >"$work/out/revision"
{
  echo "# manager: $(go version | cut -d' ' -f3), cgo against libvirt-dev $(dpkg-query -W -f='${Version}' libvirt-dev 2>/dev/null || echo "$dev_version")"
  echo "# build host: $(dpkg-query -W -f='${Package} ${Version}\n' gcc binutils libc6-dev tar 2>/dev/null | paste -sd, - | sed 's/,/, /g')"
} >>"$work/out/packages"

# OUT_DIR: checked again (it may have changed during the build), then replaced
# by a copy made next to it.
check_out_dir
parent=$(dirname "$out_dir")
mkdir -p "$parent"
new=$(mktemp -d "$parent/.${out_dir##*/}.new.XXXXXX")
chmod 0755 "$new"
cp -r "$work/out/." "$new/" || {
  rm -rf "$new"
  die "cannot copy the image to $parent"
}
rm -rf "$out_dir"
mv -T "$new" "$out_dir"
log "$IMG@$digest: $(du -sh --apparent-size "$out_dir/oci/blobs" | cut -f1) compressed, built in $((SECONDS - start)) s, in $out_dir"
echo "$IMG@$digest" >&3

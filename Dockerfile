# Manager image with a Docker engine: `make docker-build IMG=...`.
#
# The manager talks to libvirt through libvirt's C client library (cgo), so
# the build stage compiles against libvirt-dev and the runtime stage carries
# the matching libvirt0, both from Debian 12 (libvirt 9.0). The runtime adds
# an ssh client for qemu+ssh:// URIs (config/default mounts the optional
# Secret capl-libvirt-ssh at /home/manager/.ssh) and CA certificates for
# images fetched over https. It runs as the unprivileged user 65532.
#
# `make image` (images/manager/build.sh) builds it without Docker or a
# registry, and `make release-manifests` then refers to it by digest. That
# image differs from this one:
# - its base is only those packages and their run-time dependencies, extracted
#   from Debian's archive, not debian:bookworm-slim (no apt, dpkg or dpkg
#   database; the packages' control files in /var/lib/dpkg/status.d; the one
#   shell is dash as /bin/sh, for the wrapper through which the manager runs
#   ssh for a qemu+ssh:// host with a credentials Secret);
# - it is reproducible: the same commit, mirror content, Go and host gcc,
#   binutils, libc6-dev, libvirt-dev and tar give the same digest (here
#   apt-get update, the base images' tags and the clock decide);
# - the manager is built with the host's Go and libvirt-dev, not golang:1.26;
# - it carries the labels org.opencontainers.image.{source,revision,version};
# - it is written as an OCI image layout with its digest, for a registry
#   (crane push, skopeo copy) or containerd (ctr images import).
ARG GO_VERSION=1.26
FROM golang:${GO_VERSION}-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
ENV GOTOOLCHAIN=local CGO_ENABLED=1
# Modules first, so that source edits reuse the download layer.
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY pkg/ pkg/
COPY internal/ internal/
RUN go build -trimpath -ldflags "-s -w" -o /manager ./cmd/manager

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt0 openssh-client ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 65532 manager \
 && useradd --uid 65532 --gid 65532 --home-dir /home/manager --create-home --shell /usr/sbin/nologin manager
COPY --from=build /manager /manager
USER 65532:65532
ENV HOME=/home/manager
ENTRYPOINT ["/manager"]

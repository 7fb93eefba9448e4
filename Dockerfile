# Manager image: `make docker-build IMG=...`.
#
# The manager talks to libvirt through libvirt's C client library (cgo), so
# the build stage compiles against libvirt-dev and the runtime stage carries
# the matching libvirt0, both from Debian 12 (libvirt 9.0). The runtime adds
# an ssh client for qemu+ssh:// URIs (config/default mounts the optional
# Secret capl-libvirt-ssh at /home/manager/.ssh) and CA certificates for
# images fetched over https. It runs as the unprivileged user 65532.
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

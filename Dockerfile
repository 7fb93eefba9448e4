# Manager image: a cgo build against libvirt's client library, run as a
# non-root user with the libvirt client library and an ssh client (for
# qemu+ssh:// URIs).
ARG GO_VERSION=1.26
FROM golang:${GO_VERSION}-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libvirt-dev pkg-config && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY pkg/ pkg/
COPY internal/ internal/
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o /manager ./cmd/manager

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libvirt0 openssh-client ca-certificates && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 65532 --home-dir /home/manager --create-home manager
COPY --from=build /manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]

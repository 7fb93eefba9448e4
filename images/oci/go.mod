// Module oci writes container images with go-containerregistry, so no
// registry or Docker engine is ever contacted: the node image's (the images
// kubeadm and the CNI run) and the manager's. Its own module keeps
// go-containerregistry's dependencies out of the provider's go.mod.
module github.com/capi-libvirt/cluster-api-provider-libvirt/images/oci

go 1.26.0

require (
	github.com/google/go-containerregistry v0.22.1
	github.com/opencontainers/image-spec v1.1.1
)

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
)

package plane

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/registry"
)

// registryDirName is the registry's data in the state directory: kept
// across restarts of the plane, removed by Down with the rest.
const registryDirName = "registry"

// RegistryDir is where the plane of stateDir keeps its registry's blobs
// and manifests.
func RegistryDir(stateDir string) string { return filepath.Join(stateDir, registryDirName) }

// serveRegistry runs the plane's OCI registry (internal/registry) on
// o.RegistryPort of every host address until ctx ends, then pushes
// o.RegistryLayouts into it. It returns the registry's loopback URL,
// empty when the registry is off (a negative port) or when another process holds
// the port: a second plane on the host (the move scenario's) leaves the
// registry to the first, whose images the guests pull all the same.
func serveRegistry(ctx context.Context, o Options) (string, error) {
	if o.RegistryPort < 0 {
		return "", nil
	}
	l, err := net.Listen("tcp", ":"+strconv.Itoa(o.RegistryPort))
	if errors.Is(err, syscall.EADDRINUSE) {
		log.Printf("registry: port %d is taken (another plane's registry?); this plane serves none", o.RegistryPort)
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("registry: %w", err)
	}
	reg, err := registry.Open(RegistryDir(o.StateDir), log.New(log.Writer(), "registry: ", log.LstdFlags))
	if err != nil {
		_ = l.Close()
		return "", err
	}
	go func() {
		defer reg.Close()
		if err := reg.Serve(ctx, l); err != nil {
			log.Printf("registry: %v", err)
		}
	}()
	url := fmt.Sprintf("http://%s:%d", loopbackHost, o.RegistryPort)
	for _, dir := range o.RegistryLayouts {
		refs, err := registry.PushLayout(ctx, url, dir)
		if err != nil {
			return "", fmt.Errorf("registry: pushing %s: %w", dir, err)
		}
		log.Printf("registry: pushed %v from %s", refs, dir)
	}
	log.Printf("registry: serving %s on port %d to the host and to the guests of the provider's networks", RegistryDir(o.StateDir), o.RegistryPort)
	return url, nil
}

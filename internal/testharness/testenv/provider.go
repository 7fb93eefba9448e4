package testenv

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"sigs.k8s.io/cluster-api/util/flags"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// Provider is the provider's manager (pkg/manager, as the binary wires it)
// running in this process. Tests stop and start it to simulate restarts.
type Provider struct {
	cancel context.CancelFunc
	done   chan error
}

// ProviderOptions are the manager options of the provider in tests: no
// metrics, health probes or leader election, the webhook server on a
// free port with a throwaway certificate in dir, and the
// flags' tenancy policy.
func ProviderOptions(dir string) (manager.Options, error) {
	port, err := freePort()
	if err != nil {
		return manager.Options{}, err
	}
	if err := plane.WriteServingCertificate(dir, "localhost", "127.0.0.1"); err != nil {
		return manager.Options{}, err
	}
	return manager.Options{
		HealthAddr:         "0",
		Diagnostics:        flags.ManagerOptions{DiagnosticsAddress: "0", InsecureDiagnostics: true},
		ClusterConcurrency: 1,
		MachineConcurrency: 10,
		SyncPeriod:         10 * time.Minute,
		WebhookPort:        port,
		WebhookCertDir:     dir,
		StoragePoolDirs:    slices.Clone(tenancy.DefaultPoolDirs),
		ImagePools:         slices.Clone(tenancy.DefaultImagePools),
	}, nil
}

// StartProvider builds the provider's manager with opts and w and starts
// it; it returns once the manager's caches are in sync.
func (e *Environment) StartProvider(opts manager.Options, w manager.Wiring) (*Provider, error) {
	mgr, err := manager.NewWithWiring(e.Config, opts, w)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Provider{cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- mgr.Start(ctx) }()
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		_ = p.Stop()
		return nil, errors.New("the provider's cache did not sync")
	}
	return p, nil
}

// Crash stops the manager at once, as if the process died; it returns at
// once (use Done to wait).
func (p *Provider) Crash() { p.cancel() }

// Done is closed-with-result when the manager has stopped.
func (p *Provider) Done() <-chan error { return p.done }

// Stop stops the manager and waits for it.
func (p *Provider) Stop() error {
	p.cancel()
	return <-p.done
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

package webhooks_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/webhooks"
)

// The integration tests run the API server with the provider's webhook
// configurations (config/webhook/manifests.yaml) and serve them from this
// process, as the manager does; with CAPL_TEST_LIBVIRT_URI set the
// webhooks look base images up on the real libvirtd.
var (
	env *testenv.Environment
	// host is the libvirt connection the webhooks inspect volumes through;
	// nil when CAPL_TEST_LIBVIRT_URI is unset.
	host *virt.Client
	// warnings records the warnings the API server relays from the webhooks.
	warnings = &warningRecorder{}
	// c is a client whose warnings land in warnings.
	c client.Client
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	if env, err = testenv.Start(plane.WithProviderWebhooks()); err != nil {
		fmt.Println(err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	var volumes webhooks.VolumeInspector
	if uri := os.Getenv("CAPL_TEST_LIBVIRT_URI"); uri != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		host, err = virt.Dial(ctx, uri)
		cancel()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		defer host.Close()
		volumes = host
	}
	start := time.Now()
	mgr, err := env.StartManager(plane.ProviderWebhooks(volumes))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer func() { _ = mgr.Stop() }()
	fmt.Printf("BENCH webhook server ready in %v\n", time.Since(start).Round(time.Millisecond))

	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandlerWithContext = warnings
	scheme, err := manager.NewScheme()
	if err == nil {
		c, err = client.New(cfg, client.Options{Scheme: scheme})
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	return m.Run()
}

func requireEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("integration test: needs envtest (not run with -short)")
	}
}

// warningRecorder keeps the warnings of admission responses.
type warningRecorder struct {
	mu   sync.Mutex
	list []string
}

func (r *warningRecorder) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, text)
}

// take returns the warnings that contain substr and forgets every warning.
func (r *warningRecorder) take(substr string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, w := range r.list {
		if strings.Contains(w, substr) {
			out = append(out, w)
		}
	}
	r.list = nil
	return out
}

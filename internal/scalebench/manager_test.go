//go:build scale

package scalebench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	logsv1 "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// The benchmark runs the provider's manager in a process of its own, so
// that its CPU and memory are its own: this test binary again, with
// roleEnv set, doing what cmd/manager's main does (the same flags, their
// defaults, the same logging) but on the simulated host instead of a
// libvirt connection.
const (
	roleEnv      = "CAPL_SCALE_ROLE"
	argsEnv      = "CAPL_SCALE_MANAGER_ARGS"
	statsAddrEnv = "CAPL_SCALE_STATS_ADDR"
	bootEnv      = "CAPL_SCALE_BOOT"
)

// Stats are what the manager process reports of itself.
type Stats struct {
	// LibvirtCalls are the simulated host's calls by method.
	LibvirtCalls map[string]int64 `json:"libvirtCalls"`
	// APIRequests are the manager's requests to the API server by
	// "VERB resource".
	APIRequests map[string]int64 `json:"apiRequests"`
	// Reconciles are controller-runtime's reconciles by controller.
	Reconciles map[string]float64 `json:"reconciles"`
}

// requestCounter counts the requests of the manager's clients by verb
// and resource.
type requestCounter struct {
	mu sync.Mutex
	n  map[string]int64
}

// wrap counts the requests through rt (client-go wraps each client's
// transport).
func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		key := verbOf(r) + " " + resourceOf(r.URL.Path)
		c.mu.Lock()
		c.n[key]++
		c.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *requestCounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// verbOf is the Kubernetes verb of a request.
func verbOf(r *http.Request) string {
	q := r.URL.Query()
	switch r.Method {
	case http.MethodGet:
		if q.Get("watch") == "true" || q.Get("watch") == "1" {
			return "WATCH"
		}
		// A collection's path ends in its resource: api/v1/secrets,
		// api/v1/namespaces/ns/secrets (odd), apis/g/v/machines,
		// apis/g/v/namespaces/ns/machines (even).
		parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
		if len(parts) >= 3 && (len(parts)%2 == 1 && parts[0] == "api" || len(parts)%2 == 0 && parts[0] == "apis") {
			return "LIST"
		}
		return "GET"
	case http.MethodPost:
		return "CREATE"
	case http.MethodPut:
		return "UPDATE"
	}
	return r.Method
}

// resourceOf is the resource (and subresource) a request's path names.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) > 0 && parts[0] == "api":
		if len(parts) < 2 {
			return "discovery"
		}
		parts = parts[2:] // api/v1
	case len(parts) > 0 && parts[0] == "apis":
		if len(parts) < 3 {
			return "discovery"
		}
		parts = parts[3:] // apis/group/version
	default:
		return path
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		if len(parts) == 2 {
			return "namespaces"
		}
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "discovery"
	case 1, 2:
		return parts[0]
	}
	return parts[0] + "/" + parts[2]
}

// runManager is the manager process: it returns its exit code.
func runManager() int {
	var opts manager.Options
	fs := pflag.NewFlagSet("manager", pflag.ContinueOnError)
	logOptions := logs.NewOptions()
	opts.AddFlags(fs)
	logsv1.AddFlags(logOptions, fs)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	goflags := flag.NewFlagSet("manager", flag.ContinueOnError)
	klog.InitFlags(goflags)
	fs.AddGoFlagSet(goflags)
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv(argsEnv)), &args); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", argsEnv, err)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := logsv1.ValidateAndApply(logOptions, nil); err != nil {
		fmt.Fprintf(os.Stderr, "invalid logging flags: %v\n", err)
		return 1
	}
	ctrl.SetLogger(klog.Background())
	log := ctrl.Log.WithName("setup")

	boot, err := time.ParseDuration(os.Getenv(bootEnv))
	if err != nil {
		log.Error(err, "Invalid boot delay")
		return 2
	}
	host, err := newSimHost(measuredDelays(boot))
	if err != nil {
		log.Error(err, "Unable to make the simulated host")
		return 1
	}
	defer host.close()
	cfg := ctrl.GetConfigOrDie()
	counter := &requestCounter{n: map[string]int64{}}
	cfg.Wrap(counter.wrap)

	mgr, err := manager.NewWithWiring(cfg, opts, manager.Wiring{Host: host, HostName: "simulated"})
	if err != nil {
		log.Error(err, "Unable to create the manager")
		return 1
	}
	l, err := net.Listen("tcp", os.Getenv(statsAddrEnv))
	if err != nil {
		log.Error(err, "Unable to serve the figures")
		return 1
	}
	go func() {
		_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			st := Stats{LibvirtCalls: host.Calls(), APIRequests: counter.snapshot(), Reconciles: map[string]float64{}}
			if mfs, err := ctrlmetrics.Registry.Gather(); err == nil {
				for _, mf := range mfs {
					if mf.GetName() != "controller_runtime_reconcile_total" {
						continue
					}
					for _, m := range mf.GetMetric() {
						for _, lp := range m.GetLabel() {
							if lp.GetName() == "controller" {
								st.Reconciles[lp.GetValue()] += m.GetCounter().GetValue()
							}
						}
					}
				}
			}
			_ = json.NewEncoder(w).Encode(st)
		}))
	}()
	log.Info("Starting manager on the simulated libvirt host", "boot", boot)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil && err != context.Canceled {
		log.Error(err, "Manager stopped with an error")
		return 1
	}
	return 0
}

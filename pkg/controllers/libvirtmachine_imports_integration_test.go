package controllers_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Short bounds of the image imports in testStuckImageServers.
const (
	stuckHeaderTimeout = 4 * time.Second
	stuckDeadline      = 40 * time.Second
)

// testStuckImageServers: one image server accepts connections and never
// answers, another trickles a byte a second. Their machines' DiskReady
// says so (progress, then the failure's reason) within the configured
// timeouts, a machine whose image is in the pool gets its domain
// meanwhile, deleting a machine whose import runs completes in seconds,
// and no volume of the stuck imports is left in the pool.
func testStuckImageServers(h *harness, cluster string) {
	silent := silentServer(h)
	trickle := trickleServer(h)
	h.stopProvider()
	h.options = func(o *manager.Options) {
		o.ImageImport = imageimport.Options{
			Fetch:    virt.FetchLimits{ConnectTimeout: 2 * time.Second, HeaderTimeout: stuckHeaderTimeout, IdleTimeout: 4 * time.Second},
			Deadline: stuckDeadline, MinBackoff: 5 * time.Second, MaxBackoff: 5 * time.Second,
		}
	}
	defer func() { h.options = nil }()
	h.startProvider(nil)
	// The good machine's image is in the pool already (a no-op after the
	// earlier scenarios): what it must not wait for is the stuck imports.
	_, err := h.host.ImportImage(h.ctx, virt.ImageImport{Pool: h.pool, Volume: naming.ImageVolumeName(h.imageSum),
		Source: h.image, Policy: testlibvirt.FilePolicy(h.image), SHA256: h.imageSum})
	must(h.t, err)

	sums := map[string]string{"silent": strings.Repeat("1", 64), "trickle": strings.Repeat("2", 64)}
	start := time.Now()
	h.createMachine("silent", machineOpts{cluster: cluster, withData: true,
		image: &infrav1.ImageSource{URL: silent + "/img.qcow2", Checksum: "sha256:" + sums["silent"]}})
	h.createMachine("trickle", machineOpts{cluster: cluster, withData: true,
		image: &infrav1.ImageSource{URL: trickle + "/img.qcow2", Checksum: "sha256:" + sums["trickle"]}})

	// While the silent server holds the request, DiskReady says the
	// source has not answered; once the header timeout passed, it says that.
	h.waitDiskMessage("silent", infrav1.WaitingForImageImportReason, "waiting for the source to answer", 30*time.Second)
	h.waitDiskMessage("silent", infrav1.ImageImportFailedReason, "timeout awaiting response headers", stuckHeaderTimeout+15*time.Second)
	h.t.Logf("silent server: ImageImportFailed %s after creation", time.Since(start).Round(time.Second))
	// The trickle shows its progress and rate.
	h.waitDiskMessage("trickle", infrav1.WaitingForImageImportReason, " B/s", 30*time.Second)

	// Meanwhile a machine whose image is there gets its domain.
	h.createMachine("good", machineOpts{cluster: cluster, withData: true})
	good := h.waitCondition("good", infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 2*time.Minute)
	if c := conditions.Get(h.lm("trickle"), infrav1.DiskReadyCondition); time.Since(start) < stuckDeadline &&
		(c == nil || c.Reason != infrav1.WaitingForImageImportReason) {
		h.t.Errorf("trickle's import is not running while the good machine started: %+v", c)
	}
	h.t.Logf("good machine running %s after the stuck ones were created", time.Since(start).Round(time.Second))

	// The trickle's overall deadline fails it, and it is retried.
	h.waitDiskMessage("trickle", infrav1.ImageImportFailedReason, "did not finish within "+stuckDeadline.String(), stuckDeadline+15*time.Second)
	h.waitDiskMessage("trickle", infrav1.WaitingForImageImportReason, "(attempt 2)", time.Minute)

	// Deleting the stuck machines, one while its import runs, takes seconds.
	for _, name := range []string{"trickle", "silent"} {
		mac := ""
		if d := h.lm(name).Status.Domain; d != nil {
			mac = d.MAC
		}
		began := time.Now()
		h.deleteMachine(name, 15*time.Second)
		h.t.Logf("deleting %s took %s", name, time.Since(began).Round(time.Millisecond))
		h.assertClean(name, mac)
	}
	h.waitFor("the stuck imports' volumes gone", 15*time.Second, func() (bool, string) {
		vols := h.poolVolumes()
		for _, sum := range sums {
			for _, v := range []string{naming.ImageVolumeName(sum), naming.ImageVolumeName(sum) + ".partial"} {
				if slices.Contains(vols, v) {
					return false, fmt.Sprint(vols)
				}
			}
		}
		return true, ""
	})
	h.deleteMachine("good", 2*time.Minute)
	h.assertClean("good", good.Status.Domain.MAC)
	h.stopProvider()
	h.startProvider(nil)
}

// waitDiskMessage waits until the machine's DiskReady is False with reason
// and a message containing text.
func (h *harness) waitDiskMessage(name, reason, text string, timeout time.Duration) {
	h.t.Helper()
	h.waitFor(fmt.Sprintf("%s DiskReady %s saying %q", name, reason, text), timeout, func() (bool, string) {
		c := conditions.Get(h.lm(name), infrav1.DiskReadyCondition)
		if c == nil {
			return false, "no DiskReady"
		}
		return c.Status == metav1.ConditionFalse && c.Reason == reason && strings.Contains(c.Message, text), c.Reason + ": " + c.Message
	})
}

// silentServer accepts connections on 127.0.0.1 and never answers; it
// returns its base URL.
func silentServer(h *harness) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(h.t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	h.t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return "http://" + l.Addr().String()
}

// trickleServer announces a 1 MiB image and sends one byte a second.
func trickleServer(h *harness) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(1<<20))
		w.WriteHeader(http.StatusOK)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			if _, err := w.Write([]byte{0}); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
			}
		}
	}))
	h.t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL
}

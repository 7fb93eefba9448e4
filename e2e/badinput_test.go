//go:build e2e

package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// insufficientHostMemoryReason is the DomainReady reason for a machine
// asking more memory than the host has.
const insufficientHostMemoryReason = "InsufficientHostMemory"

// Bad-input cases are cheap: they run in parallel while the demo's VMs
// boot. Each must end in a condition with a reason and a message, create
// no domain, and leave nothing once deleted.
func (s *suite) badInput(t *testing.T) {
	stop := s.rep.phase("bad input (in parallel with the demo's boot)")
	t.Cleanup(stop)
	cases := map[string]func(t *testing.T){
		"missing image": func(t *testing.T) {
			s.badMachine(t, extraPrefix+"bad-missing-image", func(lm *infrav1.LibvirtMachine) {
				// An imported image's name: allowed in any pool (the demo's
				// is no image pool, see docs/configuration.md), and absent.
				lm.Spec.Image = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: naming.ImageVolumeName(strings.Repeat("0", 64))}}
			}, infrav1.DiskReadyCondition, []string{infrav1.ImageNotFoundReason})
		},
		"bad checksum": func(t *testing.T) {
			content := make([]byte, 256<<10)
			_, _ = rand.Read(content)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.ServeContent(w, r, "image.qcow2", time.Now(), bytes.NewReader(content))
			}))
			t.Cleanup(srv.Close)
			wrong := sha256.Sum256(append([]byte("not the image"), content...))
			msg := s.badMachine(t, extraPrefix+"bad-checksum", func(lm *infrav1.LibvirtMachine) {
				lm.Spec.Image = infrav1.ImageSource{URL: srv.URL + "/image.qcow2", Checksum: "sha256:" + hex.EncodeToString(wrong[:])}
			}, infrav1.DiskReadyCondition, []string{infrav1.ImageChecksumMismatchReason})
			// The digest of what the tenant pointed at stays in the manager.
			if real := sha256.Sum256(content); strings.Contains(msg, hex.EncodeToString(real[:])) {
				t.Errorf("DiskReady shows the source's digest: %s", msg)
			}
		},
		"image redirecting to a denied address": func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, "http://"+strings.TrimSuffix(e2eDeniedCIDR, "/32")+"/image.qcow2", http.StatusFound)
			}))
			t.Cleanup(srv.Close)
			s.badMachine(t, extraPrefix+"bad-redirect", func(lm *infrav1.LibvirtMachine) {
				lm.Spec.Image = infrav1.ImageSource{URL: srv.URL + "/image.qcow2?token=e2e-secret", Checksum: "sha256:" + strings.Repeat("1", 64)}
			}, infrav1.DiskReadyCondition, []string{infrav1.ImageSourceNotAllowedReason})
		},
		"qcow2 image naming a host file": func(t *testing.T) {
			content := qcow2WithBackingFile(t, "/etc/shadow")
			sum := sha256.Sum256(content)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.ServeContent(w, r, "image.qcow2", time.Now(), bytes.NewReader(content))
			}))
			t.Cleanup(srv.Close)
			s.badMachine(t, extraPrefix+"bad-backing", func(lm *infrav1.LibvirtMachine) {
				lm.Spec.Image = infrav1.ImageSource{URL: srv.URL + "/image.qcow2", Checksum: "sha256:" + hex.EncodeToString(sum[:])}
			}, infrav1.DiskReadyCondition, []string{infrav1.ImageHasBackingFileReason})
		},
		"memory larger than the host": func(t *testing.T) {
			s.badMachine(t, extraPrefix+"bad-memory", func(lm *infrav1.LibvirtMachine) {
				lm.Spec.MemoryMiB = 96 << 10 // more than this host, less than --max-machine-memory's 128Gi
			}, infrav1.DomainReadyCondition, []string{insufficientHostMemoryReason})
		},
		"larger than one machine may be": func(t *testing.T) {
			lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: extraPrefix + "bad-size"}}
			lm.Spec = *s.cut.machineSpec.DeepCopy()
			lm.Spec.CPUs, lm.Spec.MemoryMiB = 512, 1<<20
			err := s.c.Create(s.ctx, lm)
			if err == nil {
				_ = s.c.Delete(s.ctx, lm)
				t.Fatal("a machine of 512 vCPUs and 1 TiB was admitted")
			}
			for _, want := range []string{"spec.cpus", "--max-machine-vcpus", "spec.memoryMiB", "--max-machine-memory"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not name %s: %v", want, err)
				}
			}
			s.rep.passed(t, "bad input larger than one machine may be: refused on create: %v", err)
		},
		"cidr conflicts with a host route": s.badCIDR,
	}
	// All at once, whatever -parallel says: each mostly waits for the
	// cluster infrastructure (the HAProxy VM started). t.Run may be called from several goroutines.
	var wg sync.WaitGroup
	for name, fn := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(name, fn)
		}()
	}
	wg.Wait()
}

// badMachine creates a machine of the demo cluster changed by mutate and
// waits until condType is False with one of reasons; then it checks no
// domain exists, deletes the machine and checks nothing of it remains.
func (s *suite) badMachine(t *testing.T, name string, mutate func(*infrav1.LibvirtMachine), condType string, reasons []string) (message string) {
	objs := s.createExtraMachine(t, name, mutate)
	var reason, msg string
	s.waitFor(t, fmt.Sprintf("%s: %s False with reason %v", name, condType, reasons), bootTimeout, func() (bool, string) {
		lm := s.lm(name)
		if lm == nil {
			return false, "not found"
		}
		var st metav1.ConditionStatus
		st, reason, msg = condition(lm, condType)
		return st == metav1.ConditionFalse && containsString(reasons, reason), fmt.Sprintf("%s %s: %s", st, reason, msg)
	})
	if strings.TrimSpace(msg) == "" {
		t.Errorf("%s: %s False/%s without a message", name, condType, reason)
	}
	if strings.Contains(msg, "e2e-secret") {
		t.Errorf("%s: the message shows the URL's query: %s", name, msg)
	}
	t.Logf("%s: %s False, reason %s: %s", name, condType, reason, msg)
	s.rep.passed(t, "bad input %s: %s False, reason %s: %q", name, condType, reason, msg)
	lm := s.lm(name)
	if lm == nil {
		t.Fatalf("%s vanished", name)
	}
	// Time for a reconcile that would go on to define the domain anyway.
	time.Sleep(5 * time.Second)
	ctx := s.ctx
	if _, err := s.host.DomainInfo(ctx, naming.DomainName(namespace, name)); !virt.IsNotFound(err) {
		t.Errorf("%s: a domain exists for bad input (lookup error %v)", name, err)
	}
	s.deleteAndWait(t, objs.machine, deleteTimeout, objs.lm)
	if l := s.machineLeftovers(name, macSeed(lm), s.clusterNetwork()); len(l) > 0 {
		t.Errorf("%s left in libvirt: %s", name, strings.Join(l, ", "))
	}
	return msg
}

// e2eDeniedCIDR is an address the plane's manager may not download from.
const e2eDeniedCIDR = "127.0.0.2/32"

// qcow2WithBackingFile is a qcow2 image whose header names backing as its
// backing file, made by qemu-img without opening it.
func qcow2WithBackingFile(t *testing.T, backing string) []byte {
	t.Helper()
	p := filepath.Join(t.TempDir(), "backed.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", "raw", p, "1G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Host route the CIDR case conflicts with: an interface with an address,
// made for the test and removed afterwards.
const (
	dummyInterface = "capl-e2e-route"
	dummyAddress   = "172.31.213.1/24"
	dummyCIDR      = "172.31.213.0/24"
)

// badCIDR creates a cluster whose network CIDR overlaps a host route; its
// NetworkReady must say so, and no network may be created.
func (s *suite) badCIDR(t *testing.T) {
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	_ = exec.Command("ip", "link", "del", dummyInterface).Run() // from an interrupted run
	// A dummy link where the kernel has the module; a bridge without
	// ports otherwise (kernels without modules, as on CI's VMs): either
	// gives the host an address and a connected route.
	if out, err := exec.Command("ip", "link", "add", dummyInterface, "type", "dummy").CombinedOutput(); err != nil {
		t.Logf("no dummy link (%v: %s); using a bridge", err, strings.TrimSpace(string(out)))
		ip("link", "add", dummyInterface, "type", "bridge")
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "link", "del", dummyInterface).CombinedOutput(); err != nil {
			t.Errorf("removing %s: %v: %s", dummyInterface, err, out)
		}
	})
	ip("addr", "add", dummyAddress, "dev", dummyInterface)
	ip("link", "set", dummyInterface, "up")

	name := extraPrefix + "bad-cidr"
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
		Labels: map[string]string{clusterv1.ClusterNameLabel: name}}}
	lc.Spec.Network.CIDR = dummyCIDR
	lc.Spec.StoragePool = s.libvirtCluster(t, s.cut.infrastructure).Spec.StoragePool
	lc.Spec.LoadBalancer.Type = infrav1.LoadBalancerNone
	lc.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "172.31.213.10", Port: 6443}
	if err := s.c.Create(s.ctx, lc); err != nil {
		// Refused at admission is a clear error too, as long as it names
		// the CIDR.
		if !strings.Contains(errString(err), dummyCIDR) {
			t.Fatalf("creating a LibvirtCluster with cidr %s: %v", dummyCIDR, err)
		}
		t.Logf("refused at admission: %v", err)
		return
	}
	cl := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	cl.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtCluster", Name: name}
	cl.Spec.Paused = ptr.To(false)
	must(t, s.c.Create(s.ctx, cl))
	var reason, msg string
	s.waitFor(t, name+": NetworkReady False with a conflict reason", 5*time.Minute, func() (bool, string) {
		got := &infrav1.LibvirtCluster{}
		if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(lc), got); err != nil {
			return false, err.Error()
		}
		var st metav1.ConditionStatus
		st, reason, msg = condition(got, infrav1.NetworkReadyCondition)
		return st == metav1.ConditionFalse && strings.HasSuffix(reason, "Conflict"), fmt.Sprintf("%s %s: %s", st, reason, msg)
	})
	if !strings.Contains(msg, dummyCIDR) && !strings.Contains(msg, dummyInterface) && !strings.Contains(msg, "172.31.213.") {
		t.Errorf("NetworkReady message %q names neither the CIDR nor the conflicting interface", msg)
	}
	t.Logf("%s: NetworkReady False, reason %s: %s", name, reason, msg)
	s.rep.passed(t, "bad input %s (cidr %s over a host route on %s): NetworkReady False, reason %s: %q", name, dummyCIDR, dummyInterface, reason, msg)
	network := naming.ClusterNetworkName(namespace, name)
	if s.networkExists(t, network) {
		t.Errorf("network %s was created despite the conflict", network)
	}
	s.deleteAndWait(t, cl, deleteTimeout, lc)
	if s.networkExists(t, network) {
		t.Errorf("network %s left after deleting the cluster", network)
	}
}

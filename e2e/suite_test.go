//go:build e2e

package e2e

import (
	"context"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testipam"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

var (
	killRounds = flag.Int("e2e.kill-rounds", 3, "rounds of killing the manager during a machine's creation and deletion")
	standIn    = flag.Bool("e2e.stand-in", false, "run the checks and faults against the stand-in cluster of devplane.Demo, whose guests run no Kubernetes (`make test-soak`), instead of a kubeadm cluster from the template (CI: `make test-e2e`)")
	lifecycle  = flag.Bool("e2e.lifecycle", false, "add the manager image pulled through the plane's registry, MachineHealthCheck remediation and worker scaling 1 → 2 → 1 to the kubeadm scenario (`make test-e2e-kubeadm`)")
	soak       = flag.Bool("e2e.soak", false, "size the stand-in cluster 3 + 2 and add worker scaling with batch figures (`make test-soak`)")
	multiHost  = flag.Bool("e2e.multihost", false, "a kubeadm cluster over two libvirt hosts of hack/testbed-hosts.sh instead: placement, a Service across hosts, a host's libvirtd stopped and back, deletion (`make test-e2e-multihost`)")
	moveFlag   = flag.Bool("e2e.move", false, "bootstrap and pivot instead: a kubeadm cluster moved by the real clusterctl to a second plane, the first plane taken down, workers scaled from the second, a host power cut (`make test-e2e-move`)")
	rollout    = flag.Bool("e2e.rollout", false, "add a control-plane rollout (rollout.after, the new machine's first join stopped on purpose) to the kubeadm scenario")
	upgrade    = flag.Bool("e2e.upgrade", false, "day two instead: the kubeadm cluster, its etcd on the host, upgraded (control plane, then workers with maxSurge 0), then a ClusterClass cluster in its place whose workers roll out a changed variable (`make test-e2e-upgrade`)")
	seedFlag   = flag.Uint64("e2e.seed", 0, "seed of the random fault timings; 0 picks one from the clock (the log prints it)")
	// workerWithin sizes CI's cluster to its host (docs/tcg.md, "A worker
	// only where it fits").
	workerWithin = flag.Duration("e2e.worker-within", 8*time.Minute, "the kubeadm scenario joins its worker only when its control-plane node was Ready within this long of apply; otherwise the control plane also schedules pods and the report says so (0: always; -e2e.lifecycle always joins)")
)

// Environment of the suite; `make test-e2e` sets all of them.
const (
	envArtifacts = "CAPL_E2E_ARTIFACTS"
	envBin       = "CAPL_E2E_BIN"
	envURI       = "CAPL_TEST_LIBVIRT_URI"
	envImage     = "CAPL_TEST_IMAGE"
)

const (
	// namespace holds every object of the run. Every libvirt object the
	// provider makes for it is named "capl-e2e.…" (naming.DomainName), which
	// is how the leak checks and the emergency sweep tell the run's objects
	// from those of other users of the host.
	namespace   = "e2e"
	clusterName = "e2e"
	// pollInterval is how often waits look at the API server.
	pollInterval = 500 * time.Millisecond
	// workloadPollInterval is how often waits look at a workload
	// cluster's API server, which runs in a TCG guest.
	workloadPollInterval = 10 * time.Second
)

// suite is one run: the management plane, a libvirt connection of its
// own, what the demo created, and the figures the report collects.
type suite struct {
	t     *testing.T
	ctx   context.Context
	plane *plane.Plane
	c     client.Client
	host  *virt.Client
	uri   string
	image string
	bin   string
	arts  string
	state string
	rng   *rand.Rand
	seed  uint64
	// cores is the libvirt host's CPU count, for the report.
	cores uint
	// hostLock is this run's hold of hostLockPath.
	hostLock *os.File
	// imagesBefore are the base images and import markers the host held
	// before the run (imagesBefore).
	imagesBefore map[string]bool

	// cut is the cluster the shared checks, bad input and faults run
	// against: the stand-in cluster, or the kubeadm one with
	// -e2e.stand-in=false.
	cut       clusterUnderTest
	demo      demoObjects
	k8s       kubeadmState
	bootStart time.Time
	move      moveState
	selfHost  selfHostState
	mh        multiHostState
	rec       *recorder
	rep       *report

	mu       sync.Mutex
	downDone bool
}

// clusterUnderTest is what the shared checks, the bad-input cases and the
// fault rounds need to know of the cluster they run against.
type clusterUnderTest struct {
	// name is the Cluster's.
	name string
	// infrastructure is the LibvirtCluster's: the Cluster's name in the
	// templates and the demo, one the topology controller makes up for a
	// Cluster of a ClusterClass (readClusterRefs).
	infrastructure string
	// controlPlane is the KubeadmControlPlane's; none for the demo.
	controlPlane string
	// workers is the MachineDeployment of workers.
	workers string
	// machineSpec is the spec of the machines the suite adds itself (bad
	// input, faults): the workers'.
	machineSpec infrav1.LibvirtMachineSpec
	// bootstrapSecret is their bootstrap data Secret.
	bootstrapSecret string
	// controlPlaneMachines and workerMachines are how many Machines the
	// cluster has once ready.
	controlPlaneMachines, workerMachines int32
}

// demoObjects are the objects devplane.Demo rendered, by role.
type demoObjects struct {
	all          []client.Object
	cluster      *clusterv1.Cluster
	lc           *infrav1.LibvirtCluster
	controlPlane []string // Machine names
	md           *clusterv1.MachineDeployment
	template     *infrav1.LibvirtMachineTemplate
	workerSecret string // dataSecretName of the MachineDeployment's machines
}

func newSuite(t *testing.T) *suite {
	t.Helper()
	s := &suite{t: t, rep: newReport()}
	for _, v := range []struct {
		env string
		dst *string
	}{{envURI, &s.uri}, {envImage, &s.image}, {envBin, &s.bin}, {envArtifacts, &s.arts}} {
		*v.dst = os.Getenv(v.env)
		if *v.dst == "" {
			t.Fatalf("%s is unset: run the suite through `make test-e2e`", v.env)
		}
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is unset: run the suite through `make test-e2e`")
	}
	must(t, os.MkdirAll(s.arts, 0o755))
	s.seed = *seedFlag
	if s.seed == 0 {
		s.seed = uint64(time.Now().UnixNano())
	}
	s.rng = rand.New(rand.NewPCG(s.seed, s.seed>>1|1))
	t.Logf("fault timing seed: %d (rerun with -args -e2e.seed=%d)", s.seed, s.seed)
	s.rep.Seed = s.seed

	ctx, cancel := context.WithCancel(context.Background())
	s.ctx = ctx
	// One cleanup tears the run down, in the order written here rather than
	// the reverse order of registration: the run's objects are deleted and
	// swept before the suite's libvirt client is closed, and the report,
	// written last, covers the teardown. It runs even when the test fails
	// half way.
	t.Cleanup(inOrder(
		s.firstPlaneDown,
		func() {
			if !s.isDown() {
				s.down(false)
			}
		},
		func() {
			if s.host != nil {
				_ = s.host.Close()
			}
		},
		cancel,
		s.writeReport,
		s.releaseHost,
	))

	// Leftovers of an earlier, killed run in this namespace would make
	// every check below ambiguous: they go first. The base images and
	// import markers already on the host are not the run's.
	claimCtx, claimCancel := context.WithTimeout(ctx, 5*time.Minute)
	defer claimCancel()
	cleared, err := s.claimHost(claimCtx)
	for _, c := range cleared {
		t.Logf("removed what a killed run left: %s", c)
	}
	if len(cleared) > 0 {
		s.rep.note("Before the run, removed what killed runs left: %s", strings.Join(cleared, "; "))
	}
	must(t, err)
	s.state, err = os.MkdirTemp("", statePrefix)
	must(t, err)
	dialCtx, dialCancel := context.WithTimeout(ctx, time.Minute)
	defer dialCancel()
	s.host, err = virt.Dial(dialCtx, s.uri, virt.WithReconnectBudget(3*time.Minute))
	must(t, err)
	s.cores, err = hostCores(s.uri)
	must(t, err)
	objs, err := s.hostObjects()
	must(t, err)
	s.imagesBefore = imagesBefore(objs)
	if left := names(runObjects(objs, afterDown, s.imagesBefore)); len(left) > 0 {
		t.Fatalf("libvirt still holds objects of namespace %q after removing what killed runs left: %s", namespace, strings.Join(left, ", "))
	}

	stop := s.rep.phase("start management plane")
	startCtx, startCancel := context.WithTimeout(ctx, 5*time.Minute)
	defer startCancel()
	s.plane, err = plane.Start(startCtx, s.planeOptions(s.state), filepath.Join(s.bin, "capl-dev"))
	stop()
	if err != nil {
		t.Fatalf("starting the management plane: %v", err)
	}
	s.c = s.plane.Client
	t.Logf("management plane in %s (kubeconfig %s)", s.state, s.plane.Kubeconfig)
	must(t, client.IgnoreAlreadyExists(s.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}})))
	s.rec = startRecorder(s)
	startRSSSampler(s)
	return s
}

// planeOptions are the options of the run's planes.
func (s *suite) planeOptions(state string) plane.Options {
	return plane.Options{
		StateDir:      state,
		LibvirtURI:    s.uri,
		ManagerBinary: filepath.Join(s.bin, "manager"),
		ImageDir:      filepath.Dir(s.image),
		// The bad-input image servers listen on 127.0.0.1; 127.0.0.2
		// stands for the addresses the operator denies.
		ManagerArgs: append([]string{"--image-url-deny-cidrs=" + e2eDeniedCIDR + ",169.254.0.0/16,fe80::/10"}, multiHostArgs()...),
	}
}

// multiHostArgs let the manager use the multi-host scenario's hosts.
func multiHostArgs() []string {
	if !*multiHost {
		return nil
	}
	// pprof, for a goroutine dump should a host's connection hang. The
	// test bed's LAN is trusted: the HAProxy VM holds the endpoint as a
	// static address there, which the traffic filter would drop. The
	// worker's pool (testipam's) hands out addresses of the LAN above its
	// router's DHCP range (.100-.199).
	return []string{"--libvirt-uris=*", "--traffic-filter=none", "--profiler-address=127.0.0.1:16060",
		"--pool-address-cidrs=10.231.0.208/28", "--ipam-pools=*=" + testipam.Kind + "." + testipam.Group + "/*"}
}

// inOrder returns a function that calls steps in the order given.
func inOrder(steps ...func()) func() {
	return func() {
		for _, f := range steps {
			f()
		}
	}
}

//go:build e2e

package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

var (
	killRounds = flag.Int("e2e.kill-rounds", 3, "rounds of killing the manager during a machine's creation and deletion")
	standIn    = flag.Bool("e2e.stand-in", false, "run the checks and faults against the stand-in cluster of devplane.Demo, whose guests run no Kubernetes (`make test-soak`), instead of a kubeadm cluster from the template (CI: `make test-e2e`)")
	lifecycle  = flag.Bool("e2e.lifecycle", false, "add MachineHealthCheck remediation and worker scaling 1 → 2 → 1 to the kubeadm scenario (`make test-e2e-kubeadm`)")
	soak       = flag.Bool("e2e.soak", false, "size the stand-in cluster 3 + 2 and add worker scaling with batch figures (`make test-soak`)")
	multiHost  = flag.Bool("e2e.multihost", false, "a kubeadm cluster over two libvirt hosts of hack/testbed-hosts.sh instead: placement, a Service across hosts, a host's libvirtd stopped and back, deletion (`make test-e2e-multihost`)")
	moveFlag   = flag.Bool("e2e.move", false, "bootstrap and pivot instead: a kubeadm cluster moved by the real clusterctl to a second plane, the first plane taken down, workers scaled from the second, a host power cut (`make test-e2e-move`)")
	rollout    = flag.Bool("e2e.rollout", false, "add a control-plane rollout (rollout.after, the new machine's first join stopped on purpose) to the kubeadm scenario")
	upgrade    = flag.Bool("e2e.upgrade", false, "day two instead: the kubeadm cluster upgraded (control plane, then workers), rollout.after on both (the control plane's first join stopped on purpose), then a ClusterClass cluster in its place upgraded by its topology version (`make test-e2e-upgrade`)")
	seedFlag   = flag.Uint64("e2e.seed", 0, "seed of the random fault timings; 0 picks one from the clock (the log prints it)")
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
	// static address there, which the traffic filter would drop.
	return []string{"--libvirt-uris=*", "--traffic-filter=none", "--profiler-address=127.0.0.1:16060"}
}

// inOrder returns a function that calls steps in the order given.
func inOrder(steps ...func()) func() {
	return func() {
		for _, f := range steps {
			f()
		}
	}
}

func (s *suite) isDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.downDone
}

// down deletes every Cluster and stray machine of the namespace, stops the
// plane through plane.Down and sweeps what is left of the run. With
// strict it fails the test for anything the provider itself left behind
// (the sweep is then only the safety net for CI); without, it is the
// cleanup of a failed run and reports what it had to remove.
func (s *suite) down(strict bool) {
	s.mu.Lock()
	s.downDone = true
	s.mu.Unlock()
	t := s.t
	if s.state == "" || s.host == nil || s.imagesBefore == nil {
		// Failed before the plane had a state directory: there is nothing
		// to take down, and an empty StateDir would make Down take down
		// the default plane of `make up` instead.
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if s.plane != nil {
		stop := s.rep.phase("delete everything")
		if err := s.deleteNamespaceObjects(ctx, 10*time.Minute); err != nil {
			t.Errorf("deleting the objects of namespace %s: %v", namespace, err)
		}
		stop()
	}
	if left := s.ourLibvirtObjects(whileClusters); len(left) > 0 {
		msg := fmt.Sprintf("after deleting every object, libvirt still holds: %s", strings.Join(left, ", "))
		if strict {
			t.Error(msg)
		} else {
			t.Log(msg)
		}
	}
	s.saveLogs(s.state, "e2e-")
	stop := s.rep.phase("plane down")
	rep, err := plane.Down(ctx, plane.Options{StateDir: s.state, LibvirtURI: s.uri, ManagerBinary: filepath.Join(s.bin, "manager")})
	stop()
	if err != nil {
		t.Errorf("plane.Down: %v", err)
	}
	t.Logf("plane.Down removed domains %v, networks %v, volumes %v, pools %v; kept %v", rep.Domains, rep.Networks, rep.Volumes, rep.Pools, rep.Kept)
	s.rep.note("plane.Down removed %d domains, %d networks, %d volumes (%v), %d pools; kept: %v",
		len(rep.Domains), len(rep.Networks), len(rep.Volumes), rep.Volumes, len(rep.Pools), rep.Kept)
	// Whatever Down did, nothing of this run may outlive it; on a failed
	// run this removes what is left. Both look at the host on connections
	// of their own.
	swept, err := s.sweepOurs(ctx, false)
	for _, o := range swept {
		t.Errorf("swept after plane.Down: %s", o)
	}
	if err != nil {
		t.Error(err)
	}
	if left := s.ourLibvirtObjects(afterDown); len(left) > 0 {
		t.Errorf("libvirt objects of the run left after the sweep: %s", strings.Join(left, ", "))
	}
	// The images pushed into the plane's registry go with it.
	if _, err := os.Stat(plane.RegistryDir(s.state)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("plane.Down left the registry's data %s (%v)", plane.RegistryDir(s.state), err)
	}
	_ = os.RemoveAll(s.state)
}

// deleteNamespaceObjects deletes the Clusters (foreground: Cluster API
// deletes their machines first), then any Machine, LibvirtMachine and
// LibvirtCluster left without a Cluster, and waits until none remain.
func (s *suite) deleteNamespaceObjects(ctx context.Context, timeout time.Duration) error {
	fg := client.PropagationPolicy(metav1.DeletePropagationForeground)
	clusters := &clusterv1.ClusterList{}
	if err := s.c.List(ctx, clusters, client.InNamespace(namespace)); err != nil {
		return err
	}
	for i := range clusters.Items {
		_ = client.IgnoreNotFound(s.c.Delete(ctx, &clusters.Items[i], fg))
	}
	deadline := time.Now().Add(timeout)
	for {
		left, err := s.namespaceObjects(ctx)
		if err != nil {
			return err
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still there after %s: %s", timeout, strings.Join(left, ", "))
		}
		// Orphans (e.g. a bad-input machine whose Cluster went first) are
		// deleted directly once the Clusters are gone.
		if len(clusters.Items) == 0 || time.Until(deadline) < timeout/2 {
			for _, list := range []client.ObjectList{&clusterv1.MachineList{}, &infrav1.LibvirtMachineList{}, &infrav1.LibvirtClusterList{}} {
				if s.c.List(ctx, list, client.InNamespace(namespace)) == nil {
					for _, o := range items(list) {
						_ = client.IgnoreNotFound(s.c.Delete(ctx, o))
					}
				}
			}
		}
		time.Sleep(2 * time.Second)
	}
}

// namespaceObjects names the Cluster API and provider objects left in the
// namespace.
func (s *suite) namespaceObjects(ctx context.Context) ([]string, error) {
	var left []string
	for _, list := range []client.ObjectList{&clusterv1.ClusterList{}, &infrav1.LibvirtClusterList{}, &clusterv1.MachineDeploymentList{},
		&clusterv1.MachineSetList{}, &clusterv1.MachineList{}, &infrav1.LibvirtMachineList{}} {
		if err := s.c.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return nil, err
		}
		for _, o := range items(list) {
			left = append(left, fmt.Sprintf("%T %s", o, o.GetName()))
		}
	}
	return left, nil
}

// items returns the members of a list.
func items(list client.ObjectList) []client.Object {
	objs, err := apimeta.ExtractList(list)
	if err != nil {
		panic(fmt.Sprintf("items of %T: %v", list, err))
	}
	out := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(client.Object))
	}
	return out
}

// saveLogs copies the logs of the plane in state into the artifacts
// directory, their names prefixed.
func (s *suite) saveLogs(state, prefix string) {
	for _, name := range []string{"manager.log", "serve.log"} {
		src, err := os.Open(filepath.Join(state, name))
		if err != nil {
			continue
		}
		dst, err := os.Create(filepath.Join(s.arts, prefix+name))
		if err == nil {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
		}
		_ = src.Close()
	}
}

// waitFor polls fn until it returns true, failing the test with fn's last
// status after timeout.
func (s *suite) waitFor(t *testing.T, what string, timeout time.Duration, fn func() (bool, string)) {
	t.Helper()
	if err := s.poll(t, what, timeout, fn); err != nil {
		t.Fatal(err)
	}
}

// waitWorkload is waitFor for conditions that ask the workload cluster:
// every 10 s, since under TCG each request costs its API server dearly.
func (s *suite) waitWorkload(t *testing.T, what string, timeout time.Duration, fn func() (bool, string)) {
	t.Helper()
	if err := s.pollEvery(t, what, timeout, workloadPollInterval, fn); err != nil {
		s.diagnoseWorkload(t)
		t.Fatal(err)
	}
}

// workloadCall runs one call to the workload cluster until it succeeds:
// a TCG control plane under load times requests out now and then, which
// is no finding of the phase that made the call.
func (s *suite) workloadCall(t *testing.T, what string, call func() error) {
	t.Helper()
	s.waitWorkload(t, what, workloadCallTimeout, func() (bool, string) {
		err := call()
		return err == nil, errString(err)
	})
}

// workloadCallTimeout bounds workloadCall's retries.
// 10 minutes: a saturated TCG control plane left requests unanswered for
// more than 5 (2026-11-27).
const workloadCallTimeout = 10 * time.Minute

// poll is waitFor returning the failure instead.
func (s *suite) poll(t *testing.T, what string, timeout time.Duration, fn func() (bool, string)) error {
	t.Helper()
	interval := pollInterval
	if s.selfHost.inside.Load() {
		// The management cluster is the workload cluster itself.
		interval = workloadPollInterval
	}
	return s.pollEvery(t, what, timeout, interval, fn)
}

// pollEvery is poll asking every interval.
func (s *suite) pollEvery(t *testing.T, what string, timeout, interval time.Duration, fn func() (bool, string)) error {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, status := fn()
		if ok {
			return nil
		}
		if status != last && status != "" {
			t.Logf("waiting for %s: %s", what, status)
			last = status
		}
		if time.Now().After(deadline) || s.ctx.Err() != nil {
			return fmt.Errorf("timed out after %s waiting for %s; last: %s", timeout, what, status)
		}
		time.Sleep(interval)
	}
}

// lm reads a LibvirtMachine; nil when it is gone.
func (s *suite) lm(name string) *infrav1.LibvirtMachine {
	lm := &infrav1.LibvirtMachine{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: name}, lm); err != nil {
		return nil
	}
	return lm
}

// libvirtCluster reads a LibvirtCluster, failing the test when it cannot.
func (s *suite) libvirtCluster(t *testing.T, name string) *infrav1.LibvirtCluster {
	t.Helper()
	lc := &infrav1.LibvirtCluster{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: name}, lc))
	return lc
}

// condition returns "Status/Reason: message" of obj's condition, or
// "absent".
func condition(obj conditions.Getter, condType string) (metav1.ConditionStatus, string, string) {
	c := conditions.Get(obj, condType)
	if c == nil {
		return "", "", "absent"
	}
	return c.Status, c.Reason, c.Message
}

// isTrue tells whether obj's condition is True.
func isTrue(obj conditions.Getter, condType string) bool {
	st, _, _ := condition(obj, condType)
	return st == metav1.ConditionTrue
}

// waitMachineCondition waits until the LibvirtMachine's condition is True.
func (s *suite) waitMachineCondition(t *testing.T, name, condType string, timeout time.Duration) *infrav1.LibvirtMachine {
	t.Helper()
	var got *infrav1.LibvirtMachine
	s.waitFor(t, name+" "+condType, timeout, func() (bool, string) {
		got = s.lm(name)
		if got == nil {
			return false, "not found"
		}
		st, reason, msg := condition(got, condType)
		return st == metav1.ConditionTrue, fmt.Sprintf("%s %s: %s", st, reason, msg)
	})
	return got
}

// deleteAndWait deletes obj and waits until it and every object in more
// are gone.
func (s *suite) deleteAndWait(t *testing.T, obj client.Object, timeout time.Duration, more ...client.Object) {
	t.Helper()
	if err := s.c.Delete(s.ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	s.waitGone(t, timeout, append([]client.Object{obj}, more...)...)
}

// waitGone waits until every object is gone from the API server.
func (s *suite) waitGone(t *testing.T, timeout time.Duration, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		s.waitFor(t, fmt.Sprintf("deletion of %T %s", o, o.GetName()), timeout, func() (bool, string) {
			err := s.c.Get(s.ctx, client.ObjectKeyFromObject(o), o)
			if apierrors.IsNotFound(err) {
				return true, ""
			}
			if err != nil {
				return false, err.Error()
			}
			return false, fmt.Sprintf("still there (finalizers %v)", o.GetFinalizers())
		})
	}
}

// clusterNetwork is the libvirt network of the cluster under test.
func (s *suite) clusterNetwork() string { return s.clusterNetworkOf(s.cut.infrastructure) }

// clusterNetworkOf is the libvirt network of LibvirtCluster cluster of the
// namespace.
func (s *suite) clusterNetworkOf(cluster string) string {
	lc := &infrav1.LibvirtCluster{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: cluster}, lc); err == nil && lc.Status.Network != nil {
		return lc.Status.Network.Name
	}
	return naming.ClusterNetworkName(namespace, cluster)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// errString is err's message, "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Message
	}
	return err.Error()
}

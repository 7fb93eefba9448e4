//go:build e2e

package e2e

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/registry"
)

var selfHosted = flag.Bool("e2e.self-hosted", false, "Cluster API's own way to production instead: a kubeadm cluster from the template, then the real clusterctl init into it from make clusterctl-repo's local repository, every image pulled through the plane's registry, the provider reaching libvirt through the plane's libvirt endpoint (`make test-e2e-self-hosted`)")

// envClusterctlRepo is the output of `make clusterctl-repo`: clusterctl.yaml,
// the local repository and the providers' images (oci/).
const envClusterctlRepo = "CAPL_TEST_CLUSTERCTL_REPO"

// providerNamespaces are the namespaces clusterctl init fills, with the
// Deployments each must have Available.
var providerNamespaces = map[string][]string{
	"cert-manager":                      {"cert-manager", "cert-manager-cainjector", "cert-manager-webhook"},
	"capi-system":                       {"capi-controller-manager"},
	"capi-kubeadm-bootstrap-system":     {"capi-kubeadm-bootstrap-controller-manager"},
	"capi-kubeadm-control-plane-system": {"capi-kubeadm-control-plane-controller-manager"},
	"capl-system":                       {"capl-controller-manager"},
}

// selfHostedScenario is `make test-e2e-self-hosted`'s: the kubeadm
// cluster `make up` makes, turned into a management cluster by the real
// clusterctl init, offline.
//
// Then the cluster manages itself, as Cluster API's SelfHostedSpec has it:
// the real clusterctl moves the cluster's own objects into it, the
// provider in its pod adopts every VM through the plane's libvirt
// endpoint, a worker added from inside joins, and the cluster moves back
// to the plane, which deletes it.
func (s *suite) selfHostedScenario(t *testing.T) {
	s.createKubeadm(t, 1)
	t.Run("kubeadm nodes ready", s.kubeadmReady)
	if !s.k8s.ready {
		return
	}
	if !t.Run("clusterctl init into the workload cluster", s.clusterctlInit) {
		t.Run("delete cluster", s.deleteCluster)
		return
	}
	adopted := t.Run("clusterctl move into itself", s.moveIntoItself)
	if s.selfHost.inside.Load() {
		if adopted {
			t.Run("scale workers 1 → 2 from inside", s.scaleFromInside)
		}
		// Back in any case: the plane deletes the cluster.
		t.Run("clusterctl move back to the plane", s.moveBack)
	}
	if !s.selfHost.inside.Load() {
		t.Run("delete cluster", s.deleteCluster)
	}
}

// selfHostState is what the self-hosted scenario learnt so far.
type selfHostState struct {
	// kubeconfig is the file of the workload cluster's admin kubeconfig,
	// for clusterctl.
	kubeconfig string
	// plane is the plane's client while the cluster manages itself (s.c
	// is then the workload cluster's).
	plane client.Client
	// inside is set while the cluster's objects are in the cluster
	// itself: the suite then asks its API server every
	// workloadPollInterval, and the recorder not at all.
	inside atomic.Bool
}

// moveIntoItself runs the real `clusterctl move` of the namespace from the
// plane into the workload cluster. The provider in the cluster must adopt
// every VM, network and reservation as they are, through the plane's
// libvirt endpoint, and the plane must keep nothing.
func (s *suite) moveIntoItself(t *testing.T) {
	s.needReady(t)
	s.selfHostedMove(t, true)
}

// moveBack moves the namespace from the cluster back to the plane, whose
// provider must adopt everything again, the new worker included.
func (s *suite) moveBack(t *testing.T) { s.selfHostedMove(t, false) }

// selfHostedMove runs the real `clusterctl move` of the namespace into the
// workload cluster (into) or back to the plane, makes the target s.c, and
// checks that the target's provider adopted everything as it was and that
// the source keeps nothing.
func (s *suite) selfHostedMove(t *testing.T, into bool) {
	before := s.readIdentities(t)
	runs := s.domainRuns(t)
	held := s.heldNames(t)
	from, to, where := s.plane.Kubeconfig, s.selfHost.kubeconfig, "into the cluster itself"
	target, source, sourceName := client.Client(nil), s.c, "the plane"
	if into {
		var err error
		target, err = s.managementClient(s.selfHost.kubeconfig)
		must(t, err)
	} else {
		from, to, where = to, from, "back to the plane"
		target, sourceName = s.selfHost.plane, "the workload cluster"
	}

	stop := s.rep.phase("self-hosted: clusterctl move " + where)
	took := s.runClusterctlMove(t, from, to, "e2e-clusterctl-move-"+strings.ReplaceAll(where, " ", "-")+".log")
	stop()
	if into {
		s.selfHost.plane = s.c
	}
	s.c = target
	s.selfHost.inside.Store(into)

	defer s.rep.phase("self-hosted: after the move " + where + ", every VM adopted (same identities, nothing restarted), the Cluster unpaused")()
	s.checkAdopted(t, "after clusterctl move "+where, before, runs, held)
	s.checkSourceEmpty(t, sourceName, source)
	s.rep.passed(t, "clusterctl move %s: %d identity lines unchanged, no domain restarted; clusterctl move took %s",
		where, len(before), took.Round(100*time.Millisecond))
}

// scaleFromInside scales the MachineDeployment 1 → 2 in the cluster
// itself: the new worker can only be the work of the provider in the
// cluster (the plane holds no object of the namespace), and it must join
// Ready with its providerID.
func (s *suite) scaleFromInside(t *testing.T) {
	defer s.rep.phase("self-hosted: scale workers 1 → 2 from inside, every node Ready with its providerID")()
	st := s.scaleWorkersAndJoin(t, 2)
	s.checkSourceEmpty(t, "the plane", s.selfHost.plane)
	t.Logf("scaled from inside: %s", st)
}

// managementClient is a client of the management cluster of kubeconfig
// with the suite's scheme, patient as the workload cluster's.
func (s *suite) managementClient(kubeconfig string) (client.Client, error) {
	return s.clientOf(kubeconfig, 20*time.Second)
}

// crdCreateTimeout bounds one CRD's create: under TCG the API server took
// longer than the workload client's 20 s to store Cluster API's larger
// CRDs (2026-11-28), and each retry of a create cut short by the client
// costs the server the whole work again.
const crdCreateTimeout = 3 * time.Minute

// clientOf is a client of the cluster of kubeconfig with the suite's
// scheme, whose requests wait up to timeout.
func (s *suite) clientOf(kubeconfig string, timeout time.Duration) (client.Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = timeout
	return client.New(cfg, client.Options{Scheme: s.c.Scheme()})
}

// clusterctlInit pushes the providers' images and the manager's into the
// plane's registry, gives the workload cluster the plane's libvirt client
// credentials, runs the real `clusterctl init --infrastructure libvirt`
// from the local repository and checks what it installed: every
// Deployment Available, each provider's webhook served with the
// certificate cert-manager issued and injected, and the provider's
// manager, in a pod on the worker, connected to the host's libvirtd.
func (s *suite) clusterctlInit(t *testing.T) {
	s.needReady(t)
	repo, managerImage := os.Getenv(envClusterctlRepo), os.Getenv(envManagerImage)
	if repo == "" || managerImage == "" {
		t.Fatalf("%s and %s must be set: make test-e2e-self-hosted builds them (make clusterctl-repo, make image)", envClusterctlRepo, envManagerImage)
	}
	if s.plane.Endpoints.RegistryURL == "" || s.plane.Endpoints.LibvirtClientDir == "" {
		t.Fatalf("the plane serves no registry (%q) or no libvirt endpoint (%q): another process holds their ports (see %s)",
			s.plane.Endpoints.RegistryURL, s.plane.Endpoints.LibvirtClientDir, filepath.Join(s.state, "serve.log"))
	}
	stop := s.rep.phase("self-hosted: push the providers' and the manager's images into the plane's registry")
	for _, dir := range []string{filepath.Join(repo, "oci"), managerImage} {
		refs, err := registry.PushLayout(s.ctx, s.plane.Endpoints.RegistryURL, dir)
		must(t, err)
		t.Logf("pushed %s", strings.Join(refs, ", "))
	}
	stop()

	// The libvirt URI the manager in the cluster uses: the cluster
	// network's gateway, where the plane's libvirt endpoint answers.
	lc, err := s.readClusterRefs()
	must(t, err)
	if lc.Status.Network == nil || lc.Status.Network.CIDR == "" {
		t.Fatalf("LibvirtCluster %s reports no network CIDR", lc.Name)
	}
	prefix, err := netip.ParsePrefix(lc.Status.Network.CIDR)
	must(t, err)
	gateway := prefix.Addr().Next()
	uri := fmt.Sprintf("qemu+tls://%s:%d/system", gateway, s.plane.Endpoints.LibvirtTLSPort)

	wc := s.k8s.wc
	_, kubeconfig, err := devplane.WorkloadClient(s.ctx, s.c, namespace, s.cut.name)
	must(t, err)
	// The scenario's later steps use it too.
	kubeconfigFile := filepath.Join(s.t.TempDir(), "workload.kubeconfig")
	must(t, os.WriteFile(kubeconfigFile, kubeconfig, 0o600))
	s.selfHost.kubeconfig = kubeconfigFile
	credentials := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "capl-system", Name: "capl-libvirt-tls"}, Data: map[string][]byte{}}
	for _, f := range []string{"cacert.pem", "clientcert.pem", "clientkey.pem"} {
		b, err := os.ReadFile(filepath.Join(s.plane.Endpoints.LibvirtClientDir, f))
		must(t, err)
		credentials.Data[f] = b
	}
	s.workloadCall(t, "creating namespace capl-system", func() error {
		return client.IgnoreAlreadyExists(wc.Create(s.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "capl-system"}}))
	})
	s.workloadCall(t, "creating Secret capl-libvirt-tls", func() error { return client.IgnoreAlreadyExists(wc.Create(s.ctx, credentials.DeepCopy())) })

	s.createCRDsOneByOne(t, filepath.Join(repo, "repository"))

	stop = s.rep.phase("self-hosted: clusterctl init (the real binary, offline), every provider's Deployment Available")
	cmd := exec.CommandContext(s.ctx, filepath.Join(s.bin, "clusterctl"), "init", "--config="+filepath.Join(repo, "clusterctl.yaml"),
		"--kubeconfig="+kubeconfigFile, "--infrastructure=libvirt", "--wait-providers", "--wait-provider-timeout=1800", "-v=3")
	cmd.Env = append(os.Environ(), "CLUSTERCTL_DISABLE_VERSIONCHECK=true", "XDG_CONFIG_HOME="+t.TempDir(), "LIBVIRT_URI="+uri)
	tuned := s.tuneClusterAPIForTCG(t)
	out, err := cmd.CombinedOutput()
	tuned()
	stop()
	_ = os.WriteFile(filepath.Join(s.arts, "e2e-clusterctl-init.log"), out, 0o644)
	if err != nil {
		t.Fatalf("clusterctl init: %v\n%s", err, out)
	}
	t.Logf("clusterctl init:\n%s", lastLines(string(out), 15))

	for ns, names := range providerNamespaces {
		for _, name := range names {
			d := &appsv1.Deployment{}
			s.workloadCall(t, "reading Deployment "+ns+"/"+name, func() error { return wc.Get(s.ctx, client.ObjectKey{Namespace: ns, Name: name}, d) })
			if !deploymentAvailable(d) {
				t.Errorf("Deployment %s/%s is not Available: %+v", ns, name, d.Status.Conditions)
			}
		}
	}
	s.checkInjectedWebhooks(t)
	s.checkManagerReachesLibvirt(t, uri)
}

// clusterAPIDeployments are Cluster API's controllers clusterctl init
// installs, by namespace and name.
var clusterAPIDeployments = []client.ObjectKey{
	{Namespace: "capi-system", Name: "capi-controller-manager"},
	{Namespace: "capi-kubeadm-bootstrap-system", Name: "capi-kubeadm-bootstrap-controller-manager"},
	{Namespace: "capi-kubeadm-control-plane-system", Name: "capi-kubeadm-control-plane-controller-manager"},
}

// tcgControllerTuning is what Cluster API's controllers need in a TCG
// cluster, as docs/quick-start.md gives it to users: leader leases of the length the
// cluster template gives kube-controller-manager there (a 15 s lease
// whose renewal took longer lost the leadership and the process, every
// minute: 2026-11-28), and probes that wait for a webhook server whose
// first TLS handshakes take seconds. Cluster API's manifests have no
// variables for them.
const tcgControllerTuning = `[
{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--leader-elect-lease-duration=180s"},
{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--leader-elect-renew-deadline=150s"},
{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--leader-elect-retry-period=20s"},
{"op":"replace","path":"/spec/template/spec/containers/0/livenessProbe/failureThreshold","value":30},
{"op":"replace","path":"/spec/template/spec/containers/0/livenessProbe/timeoutSeconds","value":10},
{"op":"replace","path":"/spec/template/spec/containers/0/readinessProbe/timeoutSeconds","value":10}]`

// tuneClusterAPIForTCG patches each of Cluster API's Deployments with
// tcgControllerTuning once clusterctl init created it, while init waits
// for them; the returned function stops it and reports which it patched.
func (s *suite) tuneClusterAPIForTCG(t *testing.T) func() {
	wc, err := s.clientOf(s.selfHost.kubeconfig, 30*time.Second)
	must(t, err)
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan []string)
	go func() {
		var patched []string
		pending := slices.Clone(clusterAPIDeployments)
		for len(pending) > 0 && ctx.Err() == nil {
			left := pending[:0]
			for _, key := range pending {
				d := &appsv1.Deployment{}
				err := wc.Get(ctx, key, d)
				if err == nil {
					err = wc.Patch(ctx, d, client.RawPatch(types.JSONPatchType, []byte(tcgControllerTuning)))
				}
				if err != nil {
					left = append(left, key)
					continue
				}
				patched = append(patched, key.Name)
			}
			pending = left
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
		done <- patched
	}()
	return func() {
		cancel()
		t.Logf("Cluster API's controllers tuned for TCG: %v", <-done)
	}
}

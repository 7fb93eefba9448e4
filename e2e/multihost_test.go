//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testipam"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// multiHostEndpoint is the multi-host scenario's control-plane endpoint:
// a free address of the LAN of hack/testbed-hosts.sh (outside its DHCP
// range, .100-.199), which the HAProxy VM on host a holds as a static
// address.
const multiHostEndpoint = "10.231.0.240"

// The worker's address comes from an IPAM pool of the LAN (testipam's
// controller plays the IPAM provider): outside the DHCP range, the LAN's
// router as gateway and DNS server. Its data disk is seen by serial.
const (
	multiHostWorkerAddress    = "10.231.0.210"
	multiHostLANGateway       = "10.231.0.1"
	multiHostLANNameserver    = "10.231.0.2"
	multiHostWorkerDataDisk   = "scratch"
	multiHostWorkerDataDiskGi = 2
)

// multiHostState is what the multi-host scenario holds.
type multiHostState struct {
	testbed      *testlibvirt.Testbed
	hostA, hostB *virt.Client
	uriA, uriB   string
}

// multiHostScenario is `make test-e2e-multihost`'s: a kubeadm cluster from
// the template over two libvirt hosts of hack/testbed-hosts.sh, control
// plane on host a and the worker on host b, their nodes on one LAN through
// the hosts' bridges; a Service answers across hosts; host b's libvirtd
// stops and comes back; the cluster is deleted and nothing is left on
// either host.
func (s *suite) multiHostScenario(t *testing.T) {
	stop := s.rep.phase("multi-host: start two libvirt hosts (hack/testbed-hosts.sh)")
	s.mh.testbed = testlibvirt.StartTestbed(t, "a", "b")
	stop()
	// The manager reaches host a over SSH and host b over TLS, each with a
	// credentialsRef Secret, as a homelab would; the test looks at the
	// hosts over TCP.
	s.mh.uriA, s.mh.uriB = s.mh.testbed.SSHURI("a"), s.mh.testbed.TLSURI("b")
	key, knownHosts := s.mh.testbed.SSHCredentials()
	cert, certKey, ca := s.mh.testbed.TLSCredentials()
	for name, data := range map[string]map[string][]byte{
		"capl-host-a": {hosts.SSHPrivateKeyKey: key, hosts.KnownHostsKey: knownHosts},
		"capl-host-b": {hosts.TLSCertKey: cert, hosts.TLSKeyKey: certKey, hosts.CACertKey: ca},
	} {
		must(t, s.c.Create(s.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Data: data}))
	}
	for _, h := range []struct {
		uri string
		dst **virt.Client
	}{{s.mh.testbed.URI("a"), &s.mh.hostA}, {s.mh.testbed.URI("b"), &s.mh.hostB}} {
		c, err := virt.Dial(s.ctx, h.uri, virt.WithReconnectBudget(5*time.Second))
		must(t, err)
		t.Cleanup(func() { _ = c.Close() })
		*h.dst = c
	}

	ipam := &testipam.Controller{Client: s.c, Namespace: namespace, Pools: map[string]*testipam.Range{
		"lan": {Next: netip.MustParseAddr(multiHostWorkerAddress), Bits: 24, Gateway: netip.MustParseAddr(multiHostLANGateway)},
	}}
	ipamCtx, stopIPAM := context.WithCancel(s.ctx)
	defer stopIPAM() // before the plane goes
	go ipam.Run(ipamCtx, t.Logf)

	s.createMultiHost(t)
	t.Run("kubeadm nodes ready across hosts", s.multiHostReady)
	if !s.k8s.ready {
		return
	}
	s.k8s.guestHost = s.mh.hostA
	t.Run("worker's pool address and data disk in the guest", s.multiHostWorkerGuest)
	t.Run("kubeadm service across hosts", s.kubeadmService)
	t.Run("host b unreachable and back", s.hostBUnreachable)
	t.Run("delete cluster across hosts", s.deleteMultiHost)
}

// createMultiHost renders the template as createKubeadm does and spreads
// it over the two hosts: failure domains with their URIs, the hosts'
// bridge, the endpoint the HAProxy VM holds on the LAN, images by file://
// URL (each host imports them into its own pool) and the workers in host
// b, each with an address from the LAN's IPAM pool and a data disk.
func (s *suite) createMultiHost(t *testing.T) {
	s.k8s.opts = kubeadmOptions(t, 1)
	s.cut = templateCut(s.k8s.opts)
	version := s.k8s.opts.KubernetesVersion
	must(t, devplane.RecordClusterScope(s.state, s.k8s.opts))
	imgs, err := devplane.ImageVolumes(s.k8s.opts)
	must(t, err)
	objs, err := devplane.RenderCluster(s.k8s.opts, devplane.ClusterVariables(s.k8s.opts, imgs))
	must(t, err)
	cni, err := devplane.CNIObjects(s.k8s.opts)
	must(t, err)
	image := map[string]any{"url": "file://" + imgs.Node.Path, "checksum": "sha256:" + imgs.Node.SHA256}
	for _, o := range objs {
		switch o.GetKind() {
		case "LibvirtCluster":
			must(t, unstructured.SetNestedMap(o.Object, map[string]any{"bridge": "br0"}, "spec", "network"))
			must(t, unstructured.SetNestedMap(o.Object, map[string]any{"url": "file://" + imgs.LoadBalancer.Path, "checksum": "sha256:" + imgs.LoadBalancer.SHA256},
				"spec", "loadBalancer", "image"))
			must(t, unstructured.SetNestedMap(o.Object, map[string]any{"host": multiHostEndpoint, "port": int64(6443)}, "spec", "controlPlaneEndpoint"))
			must(t, unstructured.SetNestedSlice(o.Object, []any{
				map[string]any{"name": "host-a", "uri": s.mh.uriA, "controlPlane": true, "credentialsRef": map[string]any{"name": "capl-host-a"}},
				map[string]any{"name": "host-b", "uri": s.mh.uriB, "credentialsRef": map[string]any{"name": "capl-host-b"}},
			}, "spec", "failureDomains"))
		case "LibvirtMachineTemplate":
			must(t, unstructured.SetNestedMap(o.Object, image, "spec", "template", "spec", "image"))
			if o.GetName() == s.k8s.opts.MachineDeploymentName() {
				must(t, unstructured.SetNestedMap(o.Object, map[string]any{
					"addressesFromPools": []any{map[string]any{"apiGroup": testipam.Group, "kind": testipam.Kind, "name": "lan"}},
					"nameservers":        []any{multiHostLANNameserver},
				}, "spec", "template", "spec", "network"))
				must(t, unstructured.SetNestedSlice(o.Object, []any{
					map[string]any{"name": multiHostWorkerDataDisk, "sizeGiB": int64(multiHostWorkerDataDiskGi)},
				}, "spec", "template", "spec", "dataDisks"))
			}
		case "MachineDeployment":
			must(t, unstructured.SetNestedField(o.Object, "host-b", "spec", "template", "spec", "failureDomain"))
		}
	}
	must(t, devplane.ApplyCluster(s.ctx, s.c, cni, objs))
	s.k8s.applied = time.Now()
	t.Logf("multi-host kubeadm cluster %s applied: control plane and HAProxy VM on %s, worker on %s, endpoint %s:6443",
		kubeadmName, s.mh.uriA, s.mh.uriB, multiHostEndpoint)
	s.rep.passed(t, "Multi-host: Kubernetes %s over two libvirt hosts of hack/testbed-hosts.sh (libvirtds in their own network and mount namespaces on this machine, bridges on one LAN with dnsmasq DHCP; host a reached over qemu+ssh, host b over qemu+tls, each with a credentialsRef Secret), control plane and the HAProxy VM (holding the endpoint %s as a static address on the LAN) in failure domain host-a, worker in host-b with its address from a Cluster API IPAM pool of the LAN (%s; the tests' minimal pool controller plays the IPAM provider, the in-cluster provider's module is not served here) and a %d GiB data disk %q; TCG tuning as make up.", version, multiHostEndpoint, multiHostWorkerAddress, multiHostWorkerDataDiskGi, multiHostWorkerDataDisk)
}

// multiHostReady waits for both nodes Ready and checks placement: each
// machine in its failure domain, its domain on that host only, its
// providerID the domain's UUID, its address on the LAN.
func (s *suite) multiHostReady(t *testing.T) {
	k := &s.k8s
	s.waitControlPlaneNode(t, "multi-host")
	s.rep.phaseSince("multi-host: apply → control-plane node Ready (host a)", k.applied)()
	if k.opts.StagedWorkers {
		must(t, devplane.ScaleWorkers(s.ctx, s.c, k.opts, k.opts.Workers))
	}
	s.waitNodes(t, kubeadmReadyTimeout)
	s.rep.phaseSince("multi-host: apply → both nodes Ready (control plane on host a, worker on host b)", k.applied)()
	k.ready = true

	// The HAProxy VM: on host a (the first control-plane failure domain),
	// holding the endpoint the nodes joined through.
	lb := naming.LoadBalancerDomainName(namespace, kubeadmName)
	if _, err := s.mh.hostA.DomainInfo(s.ctx, lb); err != nil {
		t.Errorf("HAProxy VM %s not on host a: %v", lb, err)
	}
	if _, err := s.mh.hostB.DomainInfo(s.ctx, lb); !virt.IsNotFound(err) {
		t.Errorf("HAProxy VM %s also on host b (%v)", lb, err)
	}
	lc := &infrav1.LibvirtCluster{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: kubeadmName}, lc))
	if lc.Status.LoadBalancer == nil || lc.Status.LoadBalancer.Address != multiHostEndpoint || lc.Spec.ControlPlaneEndpoint.Host != multiHostEndpoint {
		t.Errorf("endpoint %+v, load balancer %+v; want the HAProxy VM holding %s", lc.Spec.ControlPlaneEndpoint, lc.Status.LoadBalancer, multiHostEndpoint)
	}

	lms, err := s.clusterMachines(kubeadmName)
	must(t, err)
	for _, lm := range lms {
		_, cp := lm.Labels[clusterv1.MachineControlPlaneLabel]
		want, on, other := "host-b", s.mh.hostB, s.mh.hostA
		if cp {
			want, on, other = "host-a", s.mh.hostA, s.mh.hostB
		}
		if lm.Spec.FailureDomain != want || lm.Status.FailureDomain != want {
			t.Errorf("%s: spec.failureDomain %q, status.failureDomain %q; want %q", lm.Name, lm.Spec.FailureDomain, lm.Status.FailureDomain, want)
		}
		info, err := on.DomainInfo(s.ctx, lm.Status.Domain.Name)
		if err != nil || infrav1.ProviderIDPrefix+info.UUID != lm.Spec.ProviderID || info.State != "running" {
			t.Errorf("%s: domain on %s: %+v, %v; providerID %s", lm.Name, on.URI(), info, err, lm.Spec.ProviderID)
		}
		if _, err := other.DomainInfo(s.ctx, lm.Status.Domain.Name); !virt.IsNotFound(err) {
			t.Errorf("%s: domain also on %s (%v)", lm.Name, other.URI(), err)
		}
		if len(lm.Status.Addresses) == 0 || !strings.HasPrefix(lm.Status.Addresses[0].Address, "10.231.0.") {
			t.Errorf("%s: addresses %v, want one on the testbed LAN 10.231.0.0/24", lm.Name, lm.Status.Addresses)
		}
		t.Logf("%s (%s) on %s: %s, node address %v", lm.Name, want, on.URI(), lm.Spec.ProviderID, lm.Status.Addresses)
	}
}

// multiHostWorkerGuest reads the worker's own view of what its spec
// asked for, through the guest agent on host b: the pool's address with
// its prefix, the only one on the LAN (no DHCP), the pool's DNS server in
// resolv.conf, and the data disk by its serial at its size; the machine
// reports the address, and its claim is the machine's.
func (s *suite) multiHostWorkerGuest(t *testing.T) {
	s.needReady(t)
	worker := s.workerMachine(t)
	if len(worker.Status.Addresses) == 0 || worker.Status.Addresses[0].Address != multiHostWorkerAddress {
		t.Errorf("%s: status.addresses %v, want %s first", worker.Name, worker.Status.Addresses, multiHostWorkerAddress)
	}
	claim := &ipamv1.IPAddressClaim{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: naming.IPAddressClaimName(worker.Name, 0)}, claim))
	if ref := metav1.GetControllerOf(claim); ref == nil || ref.Kind != "LibvirtMachine" || ref.Name != worker.Name {
		t.Errorf("claim %s's controller %+v, want LibvirtMachine %s", claim.Name, ref, worker.Name)
	}
	domain := worker.Status.Domain.Name
	for _, c := range []struct {
		what string
		args []string
		want func(out string) bool
	}{
		// On the LAN the pool's address alone (flannel's are the pod network's).
		{"IPv4 addresses", []string{"ip", "-4", "-o", "addr", "show", "scope", "global"}, func(out string) bool {
			return strings.Count(out, " inet 10.231.0.") == 1 && strings.Contains(out, " inet "+multiHostWorkerAddress+"/24 ")
		}},
		{"resolv.conf", []string{"cat", "/etc/resolv.conf"}, func(out string) bool {
			return strings.Contains(out, "nameserver "+multiHostLANNameserver)
		}},
		{"data disk by serial", []string{"blockdev", "--getsize64", "/dev/disk/by-id/virtio-" + multiHostWorkerDataDisk}, func(out string) bool {
			return strings.TrimSpace(out) == fmt.Sprint(multiHostWorkerDataDiskGi<<30)
		}},
	} {
		res, err := s.mh.hostB.GuestExec(s.ctx, domain, c.args[0], c.args[1:], nil)
		if err != nil || res.ExitCode != 0 || !c.want(string(res.Stdout)) {
			t.Errorf("%s in the worker's guest (%s): %v, exit %d:\n%s%s", c.what, strings.Join(c.args, " "), err, res.ExitCode, res.Stdout, res.Stderr)
			continue
		}
		t.Logf("worker's guest, %s: %s", c.what, strings.TrimSpace(string(res.Stdout)))
	}
	s.rep.passed(t, "Multi-host: the worker's guest holds the pool's address %s/24, its only one on the LAN (no DHCP), resolves through the pool's DNS server %s, and sees its %d GiB data disk as /dev/disk/by-id/virtio-%s; its IPAddressClaim is the LibvirtMachine's.",
		multiHostWorkerAddress, multiHostLANNameserver, multiHostWorkerDataDiskGi, multiHostWorkerDataDisk)
}

// workerMachine is the multi-host cluster's worker LibvirtMachine.
func (s *suite) workerMachine(t *testing.T) *infrav1.LibvirtMachine {
	t.Helper()
	lms, err := s.clusterMachines(kubeadmName)
	must(t, err)
	for i := range lms {
		if _, cp := lms[i].Labels[clusterv1.MachineControlPlaneLabel]; !cp {
			return &lms[i]
		}
	}
	t.Fatal("no worker LibvirtMachine")
	return nil
}

// hostBUnreachable stops host b's libvirtd: the worker's machine reports
// HostUnreachable within a minute while host a's machine stays Ready and
// is reconciled; libvirtd back, the worker recovers with the same domain
// and its node stays Ready.
func (s *suite) hostBUnreachable(t *testing.T) {
	s.needReady(t)
	lms, err := s.clusterMachines(kubeadmName)
	must(t, err)
	var worker, cp string
	for _, lm := range lms {
		if _, ok := lm.Labels[clusterv1.MachineControlPlaneLabel]; ok {
			cp = lm.Name
		} else {
			worker = lm.Name
		}
	}
	before := s.lm(worker)
	stopping := time.Now()
	s.mh.testbed.Stop("b")
	stopped := time.Now()
	s.waitFor(t, "worker HostUnreachable", time.Minute, func() (bool, string) {
		st, reason, msg := condition(s.lm(worker), infrav1.DomainReadyCondition)
		return st == metav1.ConditionFalse && reason == infrav1.HostUnreachableReason, fmt.Sprintf("%s %s: %s", st, reason, msg)
	})
	s.rep.phaseSince("multi-host: host b's libvirtd gone → its machine HostUnreachable", stopped)()
	t.Logf("HostUnreachable %s after libvirtd exited (stopping took %s)", time.Since(stopped).Round(100*time.Millisecond), stopped.Sub(stopping).Round(100*time.Millisecond))
	// Host a's machine is reconciled meanwhile: a change to it is seen.
	lm := s.lm(cp)
	patch := client.MergeFrom(lm.DeepCopy())
	if lm.Annotations == nil {
		lm.Annotations = map[string]string{}
	}
	lm.Annotations["e2e.capl/poke"] = time.Now().Format(time.RFC3339Nano)
	must(t, s.c.Patch(s.ctx, lm, patch))
	if st, reason, msg := condition(s.lm(cp), infrav1.DomainReadyCondition); st != metav1.ConditionTrue {
		t.Errorf("control-plane machine on host a: DomainReady %s %s: %s", st, reason, msg)
	}
	time.Sleep(20 * time.Second)
	if st, reason, msg := condition(s.lm(cp), infrav1.DomainReadyCondition); st != metav1.ConditionTrue {
		t.Errorf("control-plane machine on host a while host b is down: DomainReady %s %s: %s", st, reason, msg)
	}
	restarted := time.Now()
	s.mh.testbed.Start("b")
	if err := s.poll(t, "worker DomainReady again", 2*time.Minute, func() (bool, string) {
		st, reason, msg := condition(s.lm(worker), infrav1.DomainReadyCondition)
		return st == metav1.ConditionTrue, fmt.Sprintf("%s %s: %s", st, reason, msg)
	}); err != nil {
		s.saveManagerGoroutines(t)
		t.Fatal(err)
	}
	s.rep.phaseSince("multi-host: host b's libvirtd back → its machine DomainReady", restarted)()
	after := s.lm(worker)
	if after.Spec.ProviderID != before.Spec.ProviderID || after.UID != before.UID {
		t.Errorf("worker replaced: providerID %s → %s", before.Spec.ProviderID, after.Spec.ProviderID)
	}
	info, err := s.mh.hostB.DomainInfo(s.ctx, after.Status.Domain.Name)
	if err != nil || infrav1.ProviderIDPrefix+info.UUID != after.Spec.ProviderID || info.State != "running" {
		t.Errorf("worker's domain after host b came back: %+v, %v", info, err)
	}
	s.waitNodes(t, 5*time.Minute)
}

// deleteMultiHost deletes the cluster and checks that nothing of it is
// left on either host (the base images the hosts imported stay, as on one
// host).
func (s *suite) deleteMultiHost(t *testing.T) {
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: kubeadmName}}
	start := time.Now()
	s.deleteAndWait(t, cluster, 15*time.Minute)
	s.rep.phaseSince("multi-host: cluster deleted → nothing left on either host", start)()
	for _, h := range []*virt.Client{s.mh.hostA, s.mh.hostB} {
		owned, err := h.ListOwned(s.ctx)
		must(t, err)
		for _, o := range owned {
			if o.Kind == virt.OwnedVolume && strings.HasPrefix(o.Name, naming.ImageVolumeName("")) {
				continue
			}
			t.Errorf("%s: %s %s/%s left behind", h.URI(), o.Kind, o.Pool, o.Name)
		}
	}
	if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(cluster), cluster); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("Cluster still there: %v", errors.Join(err))
	}
	claims := &ipamv1.IPAddressClaimList{}
	must(t, s.c.List(s.ctx, claims, client.InNamespace(namespace)))
	for _, c := range claims.Items {
		t.Errorf("IPAddressClaim %s outlived its machine", c.Name)
	}
}

// saveManagerGoroutines keeps the manager's goroutines (its pprof, which
// multiHostArgs turns on) in the artifacts, for a connection that hangs.
func (s *suite) saveManagerGoroutines(t *testing.T) {
	ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:16060/debug/pprof/goroutine?debug=2", nil)
	if err != nil {
		return
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Logf("manager goroutines: %v", err)
		return
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	path := filepath.Join(s.arts, "e2e-manager-goroutines.txt")
	if err := os.WriteFile(path, body, 0o644); err == nil {
		t.Logf("manager goroutines in %s", path)
	}
}

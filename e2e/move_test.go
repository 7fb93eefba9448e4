//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
)

const (
	// adoptTimeout bounds the second plane's wait to report every moved
	// object provisioned again: it only reads libvirt.
	adoptTimeout = 5 * time.Minute
	// restartTimeout bounds a whole cluster's boot after a power cut.
	restartTimeout = 30 * time.Minute
	// qemuPIDDir holds the pid file of each running domain's QEMU.
	qemuPIDDir = "/run/libvirt/qemu"
)

// moveState is what the move scenario learnt so far.
type moveState struct {
	// first is the plane the cluster was created on; s.plane is the second
	// once the cluster moved.
	first *plane.Plane
	// firstDown is set once the first plane went through plane.Down.
	firstDown bool
	// moved is set once clusterctl moved the cluster; later phases skip
	// without it.
	moved bool
}

// moveScenario is `make test-e2e-move`'s: bootstrap and pivot. A kubeadm
// cluster (one control plane, no worker) is created on the first plane
// and moved with the real clusterctl to a second plane on the same host;
// nothing in libvirt may change. The first plane is taken down (it must
// leave the moved cluster alone), the second scales the workers, then the
// host loses power: every VM is killed at once and libvirtd restarted, and
// the cluster must come back as it was. The second plane deletes it last.
func (s *suite) moveScenario(t *testing.T) {
	// etcd syncs its log here, unlike under the rest of TCGTuning: with
	// --unsafe-no-fsync its writes wait in the guest's page cache, and the
	// power cut left a bbolt database etcd could not open again ("fatal
	// error: fault" in bbolt's freepages, every restart). With fsync a
	// killed QEMU loses nothing that etcd synced: the writes are in the
	// host's page cache.
	s.k8s.durableEtcd = true
	s.createKubeadm(t, 0)
	t.Run("kubeadm nodes ready", s.kubeadmReady)
	if !s.k8s.ready {
		return
	}
	t.Run("clusterctl move to a second plane", s.clusterctlMove)
	if !s.move.moved {
		return
	}
	t.Run("down of the first plane", s.downFirstPlane)
	t.Run("scale workers from the second plane", s.scaleAfterMove)
	t.Run("host restart", s.hostRestart)
}

// identities are what a move and a restart must keep: each machine's
// providerID, domain UUID, MAC and addresses, the endpoint VM's, and the
// DHCP reservations of the cluster's network. Rendered as sorted lines so
// that a difference reads as one.
type identities []string

// readIdentities reads the identities from the current plane's objects
// and from libvirt, once every machine reports its domain and addresses.
func (s *suite) readIdentities(t *testing.T) identities {
	t.Helper()
	var out identities
	s.waitFor(t, "every LibvirtMachine and the LibvirtCluster provisioned with addresses", adoptTimeout, func() (bool, string) {
		out = nil
		lms, err := s.clusterMachines(kubeadmName)
		if err != nil {
			return false, err.Error()
		}
		for _, lm := range lms {
			if extraMachine(lm.Name) {
				continue
			}
			if !isTrue(&lm, infrav1.DomainReadyCondition) || len(lm.Status.Addresses) == 0 {
				st, reason, msg := condition(&lm, infrav1.DomainReadyCondition)
				return false, fmt.Sprintf("%s: DomainReady %s %s: %s, addresses %v", lm.Name, st, reason, msg, lm.Status.Addresses)
			}
			info, err := s.host.DomainInfo(s.ctx, naming.DomainName(lm.Namespace, lm.Name))
			if err != nil {
				return false, err.Error()
			}
			out = append(out, fmt.Sprintf("machine %s: providerID %s, domain %s, MAC %s, addresses %v",
				lm.Name, lm.Spec.ProviderID, strings.ToLower(info.UUID), info.MAC, lm.Status.Addresses))
		}
		lc := &infrav1.LibvirtCluster{}
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: kubeadmName}, lc); err != nil {
			return false, err.Error()
		}
		if !isTrue(lc, infrav1.LoadBalancerReadyCondition) || lc.Status.LoadBalancer == nil || lc.Status.Network == nil {
			st, reason, msg := condition(lc, infrav1.LoadBalancerReadyCondition)
			return false, fmt.Sprintf("LoadBalancerReady %s %s: %s", st, reason, msg)
		}
		info, err := s.host.DomainInfo(s.ctx, naming.LoadBalancerDomainName(namespace, kubeadmName))
		if err != nil {
			return false, err.Error()
		}
		out = append(out, fmt.Sprintf("endpoint %s:%d: VM %s, MAC %s, address %s", lc.Spec.ControlPlaneEndpoint.Host,
			lc.Spec.ControlPlaneEndpoint.Port, strings.ToLower(info.UUID), info.MAC, lc.Status.LoadBalancer.Address))
		hosts, err := dhcpReservations(s.uri, lc.Status.Network.Name)
		if err != nil {
			return false, err.Error()
		}
		out = append(out, hosts...)
		return true, ""
	})
	slices.Sort(out)
	return out
}

// compareIdentities reports every line of before missing after.
func compareIdentities(t *testing.T, what string, before, after identities) {
	t.Helper()
	for _, l := range before {
		if !slices.Contains(after, l) {
			t.Errorf("%s: %q is gone; now:\n%s", what, l, strings.Join(after, "\n"))
		}
	}
}

// dhcpReservations lists a network's DHCP host entries, "reservation MAC
// IP name".
func dhcpReservations(uri, network string) ([]string, error) {
	hosts, err := dhcpHosts(uri, network)
	var out []string
	for _, h := range hosts {
		out = append(out, fmt.Sprintf("reservation %s %s %s", h.MAC, h.IP, h.Name))
	}
	return out, err
}

// domainRuns maps the cluster's running domains to their libvirt IDs: a
// domain that was stopped or started again has another ID.
func (s *suite) domainRuns(t *testing.T) map[string]uint {
	t.Helper()
	conn, err := libvirt.NewConnect(s.uri)
	must(t, err)
	defer conn.Close()
	doms, err := conn.ListAllDomains(libvirt.CONNECT_LIST_DOMAINS_ACTIVE)
	must(t, err)
	out := map[string]uint{}
	prefix := naming.DomainName(namespace, kubeadmName)
	for _, d := range doms {
		name, err := d.GetName()
		if err == nil && strings.HasPrefix(name, prefix) {
			if id, err := d.GetID(); err == nil {
				out[name] = id
			}
		}
		_ = d.Free()
	}
	return out
}

// clusterctlMove starts a second plane and runs `clusterctl move` of the
// namespace to it. The second plane must adopt everything: no domain is
// stopped, redefined or added, every providerID, MAC, address and
// reservation stays, and the first plane keeps no object of the namespace.
func (s *suite) clusterctlMove(t *testing.T) {
	s.needReady(t)
	before := s.readIdentities(t)
	runs := s.domainRuns(t)
	held := s.heldNames(t)
	t.Logf("before the move:\n%s", strings.Join(before, "\n"))

	stop := s.rep.phase("move: start a second management plane")
	second, state := s.startSecondPlane(t)
	stop()

	stop = s.rep.phase("move: clusterctl move (the real binary) to the second plane")
	moveTook := s.runClusterctlMove(t, s.plane.Kubeconfig, second.Kubeconfig, "e2e-clusterctl-move.log")
	stop()
	s.move.first = s.plane
	s.plane, s.c, s.state = second, second.Client, state
	s.move.moved = true

	moved := time.Now()
	s.checkAdopted(t, "after clusterctl move", before, runs, held)
	s.rep.phaseSince("move: the second plane reports every moved object provisioned (from libvirt)", moved)()
	s.checkSourceEmpty(t, "the first plane", s.move.first.Client)
	s.rep.passed(t, "clusterctl move of a kubeadm cluster (1 control plane, HAProxy VM) between two planes on this host: "+
		"all %d identity lines (each machine's providerID, domain UUID, MAC and addresses, the endpoint VM's, each DHCP reservation) unchanged, "+
		"no domain restarted; clusterctl move took %s", len(before), moveTook.Round(100*time.Millisecond))
}

// runClusterctlMove runs the real `clusterctl move` of the namespace from
// one management cluster to another, saving its output as an artifact,
// and returns how long it took.
func (s *suite) runClusterctlMove(t *testing.T, from, to, artifact string) time.Duration {
	t.Helper()
	cmd := exec.CommandContext(s.ctx, filepath.Join(s.bin, "clusterctl"), "move", "--namespace="+namespace,
		"--kubeconfig="+from, "--to-kubeconfig="+to, "-v=3")
	cmd.Env = append(os.Environ(), "CLUSTERCTL_DISABLE_VERSIONCHECK=true", "XDG_CONFIG_HOME="+t.TempDir())
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	_ = os.WriteFile(filepath.Join(s.arts, artifact), out, 0o644)
	if err != nil {
		t.Fatalf("clusterctl move: %v\n%s", err, out)
	}
	return took
}

// checkAdopted checks, on the management cluster the namespace moved to
// (s.c), that its provider adopted everything: the identities read before
// the move are unchanged, no domain was stopped, redefined or added, and
// libvirt holds what it held; then that the moved Cluster runs unpaused
// with a node for every Machine.
func (s *suite) checkAdopted(t *testing.T, what string, before identities, runs map[string]uint, held []string) {
	t.Helper()
	after := s.readIdentities(t)
	compareIdentities(t, what, before, after)
	if got := s.domainRuns(t); fmt.Sprint(got) != fmt.Sprint(runs) {
		t.Errorf("%s: running domains (name → libvirt ID) were %v before, %v after: a domain was stopped or added", what, runs, got)
	}
	// Neither side's provider made or removed anything: the source lets
	// go, the target adopts.
	if now := s.heldNames(t); fmt.Sprint(now) != fmt.Sprint(held) {
		t.Errorf("%s: libvirt held %v before, %v after", what, held, now)
	}
	s.waitFor(t, "the moved Cluster unpaused and its Machines with nodes", adoptTimeout, func() (bool, string) {
		cl := &clusterv1.Cluster{}
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: kubeadmName}, cl); err != nil {
			return false, err.Error()
		}
		machines := &clusterv1.MachineList{}
		if err := s.c.List(s.ctx, machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: kubeadmName}); err != nil {
			return false, err.Error()
		}
		for _, m := range machines.Items {
			if !m.Status.NodeRef.IsDefined() {
				return false, fmt.Sprintf("Machine %s has no nodeRef yet", m.Name)
			}
		}
		return !ptr.Deref(cl.Spec.Paused, false) && len(machines.Items) > 0, fmt.Sprintf("paused %v, %d machines", cl.Spec.Paused, len(machines.Items))
	})
}

// checkSourceEmpty checks that the management cluster the namespace
// moved from keeps none of its Cluster API or provider objects.
func (s *suite) checkSourceEmpty(t *testing.T, what string, source client.Client) {
	t.Helper()
	for _, list := range []client.ObjectList{&clusterv1.ClusterList{}, &clusterv1.MachineList{}, &infrav1.LibvirtClusterList{}, &infrav1.LibvirtMachineList{}} {
		must(t, source.List(s.ctx, list, client.InNamespace(namespace)))
		if left := items(list); len(left) > 0 {
			t.Errorf("%s still holds %d %T after the move", what, len(left), list)
		}
	}
}

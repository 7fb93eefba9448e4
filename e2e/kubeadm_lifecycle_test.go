//go:build e2e

package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// kubeadmScale scales the MachineDeployment 1 → 2 → 1: the new worker joins
// Ready; on the way down the removed Machine's Node leaves the workload
// cluster.
func (s *suite) kubeadmScale(t *testing.T) {
	s.needReady(t)
	var before map[string]bool
	s.workloadCall(t, "listing the worker nodes", func() (err error) {
		before, err = s.kubeadmWorkerNodes()
		return err
	})
	stop := s.rep.phase("kubeadm: scale workers 1 → 2, new node Ready")
	s.setWorkers(t, 2)
	s.waitNodes(t, kubeadmJoinTimeout)
	stop()
	stop = s.rep.phase("kubeadm: scale workers 2 → 1, node drained and gone")
	s.setWorkers(t, 1)
	s.waitWorkload(t, "one worker Machine and one worker Node", deleteTimeout, func() (bool, string) {
		nodes, err := s.kubeadmWorkerNodes()
		if err != nil {
			return false, err.Error()
		}
		machines := s.mdMachines(t)
		return len(nodes) == 1 && len(machines) == 1, fmt.Sprintf("worker nodes %v, worker machines %v", keys(nodes), machines)
	})
	stop()
	after := s.waitNodes(t, 2*time.Minute)
	t.Logf("after 1 → 2 → 1 the machines with Ready nodes are %v (workers before: %v)", after.Joined, keys(before))
}

// kubeadmRemediation destroys the worker's domain behind the provider's
// back; the MachineHealthCheck must delete its Machine and a new one must
// join Ready.
func (s *suite) kubeadmRemediation(t *testing.T) {
	s.needReady(t)
	mhc := &clusterv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: s.cut.name + "-workers"}}
	mhc.Spec.ClusterName = s.cut.name
	mhc.Spec.Selector = metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineDeploymentNameLabel: s.cut.workers}}
	// A dead node's Ready turns Unknown; False is a live kubelet's
	// verdict, which a new node gives until its CNI pod runs: minutes under
	// TCG. With 30 s for False the MHC condemned the replacement while it
	// joined, and its MachineSet deleted it during the next phase.
	mhc.Spec.Checks.UnhealthyNodeConditions = []clusterv1.UnhealthyNodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To[int32](60)},
		{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To[int32](int32(kubeadmJoinTimeout.Seconds()))},
	}
	mhc.Spec.Checks.NodeStartupTimeoutSeconds = ptr.To[int32](int32(kubeadmJoinTimeout.Seconds()))
	must(t, s.c.Create(s.ctx, mhc))
	// Only this phase's: a node that a later phase's load makes miss a
	// heartbeat must not be remediated behind that phase's back.
	defer func() {
		if err := client.IgnoreNotFound(s.c.Delete(s.ctx, mhc)); err != nil {
			t.Errorf("deleting MachineHealthCheck %s: %v", mhc.Name, err)
		}
	}()
	s.waitFor(t, "the MachineHealthCheck to see the healthy worker", 5*time.Minute, func() (bool, string) {
		if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(mhc), mhc); err != nil {
			return false, err.Error()
		}
		return ptr.Deref(mhc.Status.CurrentHealthy, 0) == 1, fmt.Sprintf("expected %d, healthy %d", ptr.Deref(mhc.Status.ExpectedMachines, 0), ptr.Deref(mhc.Status.CurrentHealthy, 0))
	})
	machines := s.mdMachines(t)
	if len(machines) != 1 {
		t.Fatalf("want one worker Machine, have %v", machines)
	}
	victim := &clusterv1.Machine{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: machines[0]}, victim))
	lm := s.lm(victim.Spec.InfrastructureRef.Name)
	if lm == nil {
		t.Fatalf("LibvirtMachine of %s is gone", victim.Name)
	}
	start := time.Now()
	must(t, destroyDomain(s.uri, lm.Status.Domain.Name))
	t.Logf("destroyed and undefined domain %s of machine %s (node %s) behind the provider's back", lm.Status.Domain.Name, victim.Name, victim.Status.NodeRef.Name)
	s.waitFor(t, "the MachineHealthCheck to delete "+victim.Name, 10*time.Minute, func() (bool, string) {
		m := &clusterv1.Machine{}
		err := s.c.Get(s.ctx, client.ObjectKeyFromObject(victim), m)
		if err != nil {
			return client.IgnoreNotFound(err) == nil, err.Error()
		}
		return m.DeletionTimestamp != nil, "not deleted yet"
	})
	s.rep.phaseSince("kubeadm: worker domain destroyed → MachineHealthCheck deletes its Machine", start)()
	s.waitFor(t, "a new worker Machine", 5*time.Minute, func() (bool, string) {
		ms := s.mdMachines(t)
		return len(ms) == 1 && ms[0] != victim.Name, fmt.Sprintf("worker machines %v", ms)
	})
	s.waitNodes(t, kubeadmJoinTimeout)
	s.rep.phaseSince("kubeadm: worker domain destroyed → replacement node Ready (MHC remediation)", start)()
	// A Machine the MHC marked stays marked after the MHC goes: its
	// MachineSet would delete it behind the next phase's back.
	for _, name := range s.mdMachines(t) {
		m := &clusterv1.Machine{}
		must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: name}, m))
		if c := meta.FindStatusCondition(m.Status.Conditions, clusterv1.MachineOwnerRemediatedCondition); c != nil && c.Status == metav1.ConditionFalse {
			t.Errorf("the replacement %s is marked for remediation: %s %s: %s", name, c.Status, c.Reason, c.Message)
		}
	}
	if l := s.machineLeftovers(lm.Name, macSeed(lm), s.clusterNetwork()); len(l) > 0 {
		t.Errorf("the remediated machine %s left in libvirt: %s", lm.Name, strings.Join(l, ", "))
	}
}

// destroyDomain undefines and destroys a domain on a connection of its
// own, as someone at the host's console would. Undefined first: the
// provider restarts a provisioned domain that merely stopped, and when it
// did so between a destroy and the undefine, the undefine only made the
// running domain transient and the "dead" worker rebooted.
func destroyDomain(uri, name string) error {
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return err
	}
	defer conn.Close()
	dom, err := conn.LookupDomainByName(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	if err := dom.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM); err != nil {
		return err
	}
	return dom.Destroy() // a transient domain is gone once destroyed
}

// mdMachines names the kubeadm MachineDeployment's Machines not being deleted.
func (s *suite) mdMachines(t *testing.T) []string {
	t.Helper()
	list := &clusterv1.MachineList{}
	must(t, s.c.List(s.ctx, list, client.InNamespace(namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: s.cut.workers}))
	var out []string
	for _, m := range list.Items {
		if m.DeletionTimestamp == nil {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return out
}

// kubeadmWorkerNodes is the set of the workload cluster's worker nodes.
func (s *suite) kubeadmWorkerNodes() (map[string]bool, error) {
	nodes := &corev1.NodeList{}
	if err := s.k8s.wc.List(s.ctx, nodes); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, n := range nodes.Items {
		if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp {
			out[n.Name] = true
		}
	}
	return out, nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// nodeImageVersion is the Kubernetes version of a `make node-image` file.
func nodeImageVersion(path string) string {
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), "capl-node-"), ".qcow2")
}

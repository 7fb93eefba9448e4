//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// replaceControlPlane applies change to the KubeadmControlPlane and waits
// until its one machine was replaced, probing the endpoint meanwhile; the
// report gets the rollout's time and the endpoint's availability, and the
// old machine must leave nothing in libvirt. It returns the new Machine.
func (s *suite) replaceControlPlane(t *testing.T, name string, change func(*controlplanev1.KubeadmControlPlane)) *clusterv1.Machine {
	t.Helper()
	r := s.controlPlaneToReplace(t)
	stopProbe := s.probeEndpoint(s.kubeadmEndpoint(t))
	kcp := s.kubeadmControlPlane(t)
	patch := client.MergeFrom(kcp.DeepCopy())
	change(kcp)
	must(t, s.c.Patch(s.ctx, kcp, patch))
	start := time.Now()
	t.Logf("KubeadmControlPlane %s changed: %s", kcp.Name, name)
	replacement := s.waitControlPlaneReplaced(t, r)
	s.waitNodes(t, kubeadmJoinTimeout)
	s.recordRollout(t, name, start, stopProbe())
	r.checkLeftovers(t, s)
	s.checkKubeadmMachines(t)
	return replacement
}

// controlPlaneRollout is a rollout of the one control-plane machine about
// to start: the machine it is to replace.
type controlPlaneRollout struct {
	old     clusterv1.Machine
	oldLM   *infrav1.LibvirtMachine
	network string
}

// controlPlaneToReplace notes the one control-plane machine a rollout is
// to replace.
func (s *suite) controlPlaneToReplace(t *testing.T) *controlPlaneRollout {
	t.Helper()
	old := s.controlPlaneMachines(t)
	if len(old) != 1 {
		t.Fatalf("want one control-plane Machine before the rollout, have %d", len(old))
	}
	oldLM := s.lm(old[0].Spec.InfrastructureRef.Name)
	if oldLM == nil {
		t.Fatalf("LibvirtMachine %s of %s is gone", old[0].Spec.InfrastructureRef.Name, old[0].Name)
	}
	return &controlPlaneRollout{old: old[0], oldLM: oldLM, network: s.clusterNetwork()}
}

// waitControlPlaneReplaced waits until the KubeadmControlPlane replaced
// r's machine by a new one, up to date and ready, and returns it.
func (s *suite) waitControlPlaneReplaced(t *testing.T, r *controlPlaneRollout) *clusterv1.Machine {
	t.Helper()
	var replacement *clusterv1.Machine
	kcp := s.kubeadmControlPlane(t)
	// KubeadmControlPlane adds a machine only while every control-plane
	// component and etcd member reports healthy, which a loaded TCG
	// control plane may not for minutes: the wait says which is not.
	s.waitFor(t, "a new control-plane Machine", 20*time.Minute, func() (bool, string) {
		for _, m := range s.controlPlaneMachines(t) {
			if m.Name != r.old.Name {
				replacement = &m
				return true, ""
			}
		}
		if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(kcp), kcp); err != nil {
			return false, err.Error()
		}
		return false, "only " + r.old.Name + "; KubeadmControlPlane " + conditionsLine(kcp.Status.Conditions,
			controlplanev1.KubeadmControlPlaneEtcdClusterHealthyCondition, controlplanev1.KubeadmControlPlaneControlPlaneComponentsHealthyCondition)
	})
	s.waitFor(t, "the control-plane rollout: "+r.old.Name+" gone, "+replacement.Name+" up to date and ready", rolloutTimeout, func() (bool, string) {
		if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(kcp), kcp); err != nil {
			return false, err.Error()
		}
		machines := s.controlPlaneMachines(t)
		names := make([]string, 0, len(machines))
		for _, m := range machines {
			names = append(names, m.Name)
		}
		st := kcp.Status
		done := len(machines) == 1 && machines[0].Name == replacement.Name &&
			ptr.Deref(st.UpToDateReplicas, 0) == 1 && ptr.Deref(st.ReadyReplicas, 0) == 1 && ptr.Deref(st.Replicas, 0) == 1
		return done, fmt.Sprintf("machines %v; KubeadmControlPlane replicas %d, up to date %d, ready %d; %s", names,
			ptr.Deref(st.Replicas, 0), ptr.Deref(st.UpToDateReplicas, 0), ptr.Deref(st.ReadyReplicas, 0), s.bootstrapLine(replacement))
	})
	return replacement
}

// checkLeftovers fails t for anything of r's replaced machine still in
// libvirt.
func (r *controlPlaneRollout) checkLeftovers(t *testing.T, s *suite) {
	t.Helper()
	if l := s.machineLeftovers(r.oldLM.Name, macSeed(r.oldLM), r.network); len(l) > 0 {
		t.Errorf("the replaced control-plane machine %s left in libvirt: %s", r.oldLM.Name, strings.Join(l, ", "))
	}
}

// replaceWorkers applies change to the MachineDeployment and waits until
// each of its machines was replaced, with a Deployment guarded by a
// PodDisruptionBudget running on the workers and the endpoint probed
// (guardWorkers, waitWorkersReplaced).
func (s *suite) replaceWorkers(t *testing.T, name string, change func(*clusterv1.MachineDeployment)) {
	t.Helper()
	w := s.guardWorkers(t)
	stopProbe := s.probeEndpoint(s.kubeadmEndpoint(t))
	md := s.machineDeployment(t)
	patch := client.MergeFrom(md.DeepCopy())
	change(md)
	must(t, s.c.Patch(s.ctx, md, patch))
	start := time.Now()
	t.Logf("MachineDeployment %s changed: %s", md.Name, name)
	s.waitWorkersReplaced(t, w, name, start, stopProbe)
}

// workerRollout is a rollout of the workers about to start: the machines
// it is to replace, and the guarded Deployment running meanwhile.
type workerRollout struct {
	old          map[string]*infrav1.LibvirtMachine // by Machine
	network      string
	stopWorkload func() (minAvailable int32, samples int)
}

// guardWorkers notes the workers a rollout is to replace and starts a
// Deployment guarded by a PodDisruptionBudget on them (guardedWorkload).
func (s *suite) guardWorkers(t *testing.T) *workerRollout {
	t.Helper()
	w := &workerRollout{old: map[string]*infrav1.LibvirtMachine{}, network: s.clusterNetwork()}
	for _, m := range s.mdMachines(t) {
		machine := &clusterv1.Machine{}
		must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: m}, machine))
		if lm := s.lm(machine.Spec.InfrastructureRef.Name); lm != nil {
			w.old[m] = lm
		}
	}
	w.stopWorkload = s.guardedWorkload(t)
	return w
}

// waitWorkersReplaced waits until every worker of w was replaced and the
// MachineDeployment is up to date and available; at least one pod of the
// guarded Deployment must have stayed available throughout. The report
// gets the rollout's time since start and what stopProbe saw of the
// endpoint, and the old machines must leave nothing in libvirt.
func (s *suite) waitWorkersReplaced(t *testing.T, w *workerRollout, name string, start time.Time, stopProbe func() endpointAvailability) {
	t.Helper()
	old, network, stopWorkload := w.old, w.network, w.stopWorkload
	md := s.machineDeployment(t)
	s.waitFor(t, "the workers' rollout", rolloutTimeout, func() (bool, string) {
		machines := s.mdMachines(t)
		for _, m := range machines {
			if old[m] != nil {
				return false, fmt.Sprintf("old worker %s still there (workers %v)", m, machines)
			}
		}
		if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(md), md); err != nil {
			return false, err.Error()
		}
		st := md.Status
		want := ptr.Deref(md.Spec.Replicas, 1)
		return len(machines) == int(want) && ptr.Deref(st.UpToDateReplicas, 0) == want && ptr.Deref(st.AvailableReplicas, 0) == want,
			fmt.Sprintf("workers %v; MachineDeployment up to date %d, available %d of %d", machines, ptr.Deref(st.UpToDateReplicas, 0), ptr.Deref(st.AvailableReplicas, 0), want)
	})
	s.waitNodes(t, kubeadmJoinTimeout)
	s.recordRollout(t, name, start, stopProbe())
	minAvailable, samples := stopWorkload()
	t.Logf("the guarded Deployment kept at least %d available pods over %d samples", minAvailable, samples)
	if minAvailable < 1 {
		t.Errorf("the PodDisruptionBudget's Deployment had no available pod at some point of the workers' rollout (%d samples)", samples)
	}
	s.rep.passed(t, "%s: the Deployment guarded by a PodDisruptionBudget (minAvailable 1 of 2) kept at least %d pods available (%d samples every %s).",
		name, minAvailable, samples, workloadPollInterval)
	for m, lm := range old {
		if l := s.machineLeftovers(lm.Name, macSeed(lm), network); len(l) > 0 {
			t.Errorf("the replaced worker %s left in libvirt: %s", m, strings.Join(l, ", "))
		}
	}
	s.checkKubeadmMachines(t)
}

// recordRollout puts a rollout's time and endpoint availability into the
// report; an endpoint that never answered fails t.
func (s *suite) recordRollout(t *testing.T, name string, start time.Time, availability endpointAvailability) {
	t.Helper()
	took := time.Since(start)
	s.rep.phaseSince("kubeadm: rollout: "+name, start)()
	s.rep.addRollout(rolloutReport{Name: name, Seconds: took.Seconds(), endpointAvailability: availability})
	t.Logf("rollout %q took %s; endpoint: %s", name, took.Round(time.Second), availability)
	if availability.Answered == 0 {
		t.Errorf("the endpoint never answered during the rollout %q: %s", name, availability)
	}
}

// guardedWorkload runs a Deployment of two idle pods (on the workers, or the
// control plane while a lone worker drains) with a PodDisruptionBudget of one,
// and samples its available pods until the returned function is called,
// which removes both and returns the fewest available pods seen.
func (s *suite) guardedWorkload(t *testing.T) func() (minAvailable int32, samples int) {
	t.Helper()
	image := s.cniImage(t)
	labels := map[string]string{"app": "capl-guarded"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "capl-guarded"}}
	dep.Spec.Replicas = ptr.To[int32](2)
	dep.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	dep.Spec.Template.Labels = labels
	// Idle until told to stop (as PID 1, sh gets SIGTERM only with a trap).
	dep.Spec.Template.Spec.Containers = []corev1.Container{{Name: "idle", Image: image, ImagePullPolicy: corev1.PullNever,
		Command: []string{"/bin/sh", "-c", "trap 'exit 0' TERM; sleep infinity & wait"}}}
	// Under TCG a worker is replaced, not doubled (maxSurge 0): while the
	// only worker drains, the evicted pod has nowhere to go but the control
	// plane, and without it the budget would hold the drain for good.
	dep.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "capl-guarded"}}
	pdb.Spec.MinAvailable = ptr.To(intstr.FromInt32(1))
	pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	wc := s.k8s.wc
	for _, o := range []client.Object{dep, pdb} {
		s.workloadCall(t, "creating "+o.GetName(), func() error { return client.IgnoreAlreadyExists(wc.Create(s.ctx, o)) })
	}
	s.waitWorkload(t, "the guarded Deployment's two pods available", 10*time.Minute, func() (bool, string) {
		if err := wc.Get(s.ctx, client.ObjectKeyFromObject(dep), dep); err != nil {
			return false, err.Error()
		}
		return dep.Status.AvailableReplicas == 2, fmt.Sprintf("%d available", dep.Status.AvailableReplicas)
	})
	ctx, cancel := context.WithCancel(s.ctx)
	var (
		wg       sync.WaitGroup
		minAvail int32 = 2
		n        int
	)
	wg.Go(func() {
		for ctx.Err() == nil {
			d := &appsv1.Deployment{}
			if err := wc.Get(ctx, client.ObjectKeyFromObject(dep), d); err == nil {
				minAvail, n = min(minAvail, d.Status.AvailableReplicas), n+1
			}
			select {
			case <-ctx.Done():
			case <-time.After(workloadPollInterval):
			}
		}
	})
	return func() (int32, int) {
		cancel()
		wg.Wait()
		for _, o := range []client.Object{pdb, dep} {
			s.workloadCall(t, "deleting "+o.GetName(), func() error { return client.IgnoreNotFound(wc.Delete(s.ctx, o)) })
		}
		return minAvail, n
	}
}

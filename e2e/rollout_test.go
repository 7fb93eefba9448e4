//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
)

const (
	// rolloutTimeout bounds a control-plane rollout on the CI cluster: a
	// new machine boots next to the three VMs there, joins (twice, the
	// first join failing on purpose), and the old machine is drained and
	// deleted.
	rolloutTimeout = 50 * time.Minute
	// probeInterval is how often the endpoint is asked during a rollout.
	probeInterval = 3 * time.Second
	// faultLog is where the injected fault reports in the guest.
	faultLog = "/var/log/capl-e2e-fault.log"
)

// failFirstJoin, a preKubeadmCommand, stops the machine's first `kubeadm
// join` once the etcd member it added runs: the worst moment, with the
// member in the cluster and Cluster API's CA and keys in use. The
// template's join retry must resume the join from its etcd step with that
// member kept, or, if it comes to a clean retry, remove the member and
// restore the CA and keys that `kubeadm reset` deletes. It acts once per
// boot.
const failFirstJoin = `sh -c '(until [ -f /etc/kubernetes/manifests/etcd.yaml ] && curl -s -o /dev/null -m 5 http://127.0.0.1:2381/health; do sleep 1; done; ` +
	`pkill -x kubeadm && echo "capl-e2e: stopped the first kubeadm join once its etcd member ran") >>` + faultLog + ` 2>&1 &'`

// rolloutReport is one rollout's figures: how long it took and how the
// control-plane endpoint answered meanwhile.
type rolloutReport struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	endpointAvailability
}

// endpointAvailability is what a probe of /readyz through the endpoint
// saw: the share of probes answered 200 and the longest time without one.
type endpointAvailability struct {
	Probes            int     `json:"probes"`
	Answered          int     `json:"answered"`
	LongestGapSeconds float64 `json:"longestGapSeconds"`
}

func (a endpointAvailability) String() string {
	if a.Probes == 0 {
		return "no probes"
	}
	return fmt.Sprintf("%d of %d probes answered (%.1f%%), longest gap %.0f s", a.Answered, a.Probes,
		100*float64(a.Answered)/float64(a.Probes), a.LongestGapSeconds)
}

// probeEndpoint asks https://endpoint/readyz every probeInterval until the
// returned function is called, which returns what it saw. A gap runs from
// the last answered probe (or the start) to the next answered one (or the
// end).
func (s *suite) probeEndpoint(endpoint string) func() endpointAvailability {
	ctx, cancel := context.WithCancel(s.ctx)
	var (
		mu       sync.Mutex
		a        endpointAvailability
		lastGood = time.Now()
		wg       sync.WaitGroup
	)
	gap := func(now time.Time) {
		a.LongestGapSeconds = max(a.LongestGapSeconds, now.Sub(lastGood).Seconds())
	}
	wg.Go(func() {
		tick := time.NewTicker(probeInterval)
		defer tick.Stop()
		for {
			pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := devplane.Readyz(pctx, endpoint)
			pcancel()
			now := time.Now()
			mu.Lock()
			if ctx.Err() == nil {
				a.Probes++
				if err == nil {
					a.Answered++
					gap(now)
					lastGood = now
				}
			}
			mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return func() endpointAvailability {
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		gap(time.Now())
		return a
	}
}

// kubeadmControlPlaneRollout replaces the control-plane machine the way
// `clusterctl alpha rollout restart` does (spec.rollout.after on the
// KubeadmControlPlane), with the new machine's first `kubeadm join` made to
// fail once its etcd member runs (failFirstJoin). The template's join retry
// must recover it; the endpoint keeps answering throughout, the new node
// is Ready with our providerID, and the old machine leaves nothing in
// libvirt.
func (s *suite) kubeadmControlPlaneRollout(t *testing.T) {
	s.needReady(t)
	replacement := s.replaceControlPlane(t, "control plane, rollout.after, first join stopped once its etcd member ran",
		func(kcp *controlplanev1.KubeadmControlPlane) {
			kcp.Spec.Rollout.After = metav1.Now()
			kcp.Spec.KubeadmConfigSpec.PreKubeadmCommands = append(kcp.Spec.KubeadmConfigSpec.PreKubeadmCommands, failFirstJoin)
		})
	s.checkJoinRecovered(t, replacement)
}

// checkJoinRecovered reads, through the guest agent, that the fault stopped
// m's first join and that the join retry then joined: the retry's lines in
// cloud-init's output, without the missing-CA failure the old retry hit.
// Only these lines are looked for; the log is neither kept nor printed.
func (s *suite) checkJoinRecovered(t *testing.T, m *clusterv1.Machine) {
	lm := s.lm(m.Spec.InfrastructureRef.Name)
	if lm == nil || lm.Status.Domain == nil {
		t.Fatalf("LibvirtMachine %s of %s has no domain", m.Spec.InfrastructureRef.Name, m.Name)
	}
	read := func(path string) string {
		ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
		defer cancel()
		data, err := s.host.GuestReadFile(ctx, lm.Status.Domain.Name, path)
		if err != nil {
			t.Errorf("%s: reading %s through the guest agent: %v", lm.Name, path, err)
		}
		return string(data)
	}
	if fault := read(faultLog); !strings.Contains(fault, "capl-e2e: stopped the first kubeadm join") {
		t.Errorf("%s: the fault never stopped a join (%s: %q)", lm.Name, faultLog, fault)
	}
	out := read("/var/log/cloud-init-output.log")
	if !strings.Contains(out, "capl: kubeadm join failed; retry 1 of") {
		t.Errorf("%s: cloud-init's output lacks the join retry", lm.Name)
	}
	if !strings.Contains(out, "capl: resuming the control-plane join at etcd-join") && !strings.Contains(out, "capl: removed the etcd member of") {
		t.Errorf("%s: the retry neither resumed the join nor removed the failed join's etcd member", lm.Name)
	}
	if strings.Contains(out, "couldn't load the certificate file /etc/kubernetes/pki/ca.crt") {
		t.Errorf("%s: a retry ran without the cluster's CA", lm.Name)
	}
}

// controlPlaneMachines are the kubeadm cluster's control-plane Machines
// not being deleted, oldest first.
func (s *suite) controlPlaneMachines(t *testing.T) []clusterv1.Machine {
	t.Helper()
	list := &clusterv1.MachineList{}
	must(t, s.c.List(s.ctx, list, client.InNamespace(namespace), client.MatchingLabels{
		clusterv1.ClusterNameLabel: s.cut.name, clusterv1.MachineControlPlaneLabel: "",
	}))
	out := slices.DeleteFunc(list.Items, func(m clusterv1.Machine) bool { return m.DeletionTimestamp != nil })
	slices.SortFunc(out, func(a, b clusterv1.Machine) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	return out
}

// bootstrapLine is m's LibvirtMachine's BootstrapSucceeded condition, for
// progress lines.
func (s *suite) bootstrapLine(m *clusterv1.Machine) string {
	lm := s.lm(m.Spec.InfrastructureRef.Name)
	if lm == nil {
		return m.Name + ": no LibvirtMachine"
	}
	st, reason, msg := condition(lm, infrav1.BootstrapSucceededCondition)
	return fmt.Sprintf("%s BootstrapSucceeded %s %s: %s", m.Name, st, reason, msg)
}

// kubeadmEndpoint is the kubeadm cluster's control-plane endpoint.
func (s *suite) kubeadmEndpoint(t *testing.T) string {
	lc := s.libvirtCluster(t, s.cut.infrastructure)
	return fmt.Sprintf("%s:%d", lc.Spec.ControlPlaneEndpoint.Host, lc.Spec.ControlPlaneEndpoint.Port)
}

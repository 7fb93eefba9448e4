package devplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// DemoStatus is how far the provider has brought a cluster.
type DemoStatus struct {
	// ClusterProvisioned is the LibvirtCluster's status.initialization.provisioned.
	ClusterProvisioned bool
	// ClusterIssue is what the LibvirtCluster waits for, while not provisioned.
	ClusterIssue string
	// Endpoint is the control-plane endpoint host:port, once published.
	Endpoint string
	// Machines is how many Machines the cluster should have: control-plane
	// Machines plus the MachineDeployments' replicas.
	Machines int
	// Provisioned lists the LibvirtMachines that report provisioned;
	// Pending the others, each with its Ready condition's reason.
	Provisioned, Pending []string
}

// Done tells whether the cluster and all its machines are provisioned.
// A cluster always has a control-plane machine: none yet is not done.
func (s DemoStatus) Done() bool {
	return s.ClusterProvisioned && s.Machines > 0 && len(s.Pending) == 0 && len(s.Provisioned) >= s.Machines
}

// String is a one-line progress report.
func (s DemoStatus) String() string {
	lc := "pending (" + s.ClusterIssue + ")"
	if s.ClusterProvisioned {
		lc = "provisioned, endpoint " + s.Endpoint
	}
	line := fmt.Sprintf("LibvirtCluster %s; LibvirtMachines provisioned %d/%d", lc, len(s.Provisioned), s.Machines)
	if len(s.Pending) > 0 {
		line += " (pending: " + strings.Join(s.Pending, ", ") + ")"
	}
	return line
}

// desiredWorkers is how many worker Machines cl should have: each
// MachineDeployment's replicas, except that a topology's replicas count
// as the Cluster has them. The topology controller carries a change of
// them (ScaleWorkers) to the MachineDeployment a reconcile later, or makes
// the MachineDeployment then: counted from the MachineDeployments alone, a
// wait right after a scale-up found every Machine of the old count joined
// and ended before the new worker existed.
func desiredWorkers(cl *clusterv1.Cluster, mds []clusterv1.MachineDeployment) int {
	replicas := map[string]int{}
	for _, md := range mds {
		key := "MachineDeployment " + md.Name
		if name, ok := md.Labels[clusterv1.ClusterTopologyMachineDeploymentNameLabel]; ok {
			key = "topology " + name
		}
		if md.Spec.Replicas != nil {
			replicas[key] = int(*md.Spec.Replicas)
		}
	}
	for _, md := range cl.Spec.Topology.Workers.MachineDeployments {
		if md.Replicas != nil {
			replicas["topology "+md.Name] = int(*md.Replicas)
		}
	}
	workers := 0
	for _, n := range replicas {
		workers += n
	}
	return workers
}

// ClusterStatus reads the status of cluster namespace/name.
func ClusterStatus(ctx context.Context, c client.Client, namespace, name string) (DemoStatus, error) {
	var s DemoStatus
	cl := &clusterv1.Cluster{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cl); err != nil {
		return s, err
	}
	lc, err := LibvirtClusterOf(ctx, c, cl)
	if err != nil {
		return s, err
	}
	s.ClusterProvisioned = lc.Status.Initialization.IsProvisioned()
	if !s.ClusterProvisioned {
		s.ClusterIssue = firstIssue(lc.Status.Conditions)
	}
	if ep := lc.Spec.ControlPlaneEndpoint; ep.Host != "" {
		s.Endpoint = fmt.Sprintf("%s:%d", ep.Host, ep.Port)
	}
	inCluster := client.MatchingLabels{clusterv1.ClusterNameLabel: name}
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, client.InNamespace(namespace), inCluster); err != nil {
		return s, err
	}
	controlPlane := 0
	for _, m := range machines.Items {
		if _, ok := m.Labels[clusterv1.MachineControlPlaneLabel]; ok {
			controlPlane++
		}
	}
	// A control-plane provider creates its Machines one by one: once the
	// Cluster reports how many it wants, count that. Workers come from the
	// specs (desiredWorkers), not the Cluster's status, which lags a
	// scaling by a reconcile.
	if cp := cl.Status.ControlPlane; cp != nil && cp.DesiredReplicas != nil {
		controlPlane = int(*cp.DesiredReplicas)
	}
	var mds clusterv1.MachineDeploymentList
	if err := c.List(ctx, &mds, client.InNamespace(namespace), inCluster); err != nil {
		return s, err
	}
	s.Machines = controlPlane + desiredWorkers(cl, mds.Items)
	var lms infrav1.LibvirtMachineList
	if err := c.List(ctx, &lms, client.InNamespace(namespace), inCluster); err != nil {
		return s, err
	}
	for _, lm := range lms.Items {
		if lm.Status.Initialization.IsProvisioned() {
			s.Provisioned = append(s.Provisioned, lm.Name)
			continue
		}
		s.Pending = append(s.Pending, lm.Name+": "+firstIssue(lm.Status.Conditions))
	}
	slices.Sort(s.Provisioned)
	slices.Sort(s.Pending)
	return s, nil
}

// LibvirtClusterOf reads the LibvirtCluster of cl: the one its
// infrastructureRef names. A ClusterClass's topology controller names it
// with a random suffix and sets the reference only once it made it.
func LibvirtClusterOf(ctx context.Context, c client.Client, cl *clusterv1.Cluster) (*infrav1.LibvirtCluster, error) {
	ref := cl.Spec.InfrastructureRef
	if !ref.IsDefined() {
		return nil, fmt.Errorf("cluster %s/%s has no infrastructureRef yet", cl.Namespace, cl.Name)
	}
	lc := &infrav1.LibvirtCluster{}
	return lc, c.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: ref.Name}, lc)
}

// WaitProvisioned waits until the LibvirtCluster of cluster namespace/name
// and every LibvirtMachine of the cluster report provisioned, calling progress with
// each changed status.
func WaitProvisioned(ctx context.Context, c client.Client, namespace, name string, progress func(DemoStatus)) (DemoStatus, error) {
	last := ""
	var lastErr error
	for {
		s, err := ClusterStatus(ctx, c, namespace, name)
		lastErr = err
		if err == nil {
			if line := s.String(); line != last {
				progress(s)
				last = line
			}
			if s.Done() {
				return s, nil
			}
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				last += "; reading it: " + lastErr.Error()
			}
			return s, fmt.Errorf("cluster %s/%s not provisioned: %w (last: %s)", namespace, name, ctx.Err(), last)
		case <-time.After(2 * time.Second):
		}
	}
}

// firstIssue is the first condition that is not True, as "Type: Reason",
// skipping the Ready summary and Paused: it names the step a resource is at.
func firstIssue(conds []metav1.Condition) string {
	for _, c := range conds {
		if c.Type != clusterv1.ReadyCondition && c.Type != clusterv1.PausedCondition && c.Status != metav1.ConditionTrue {
			return c.Type + ": " + c.Reason
		}
	}
	if c := apimeta.FindStatusCondition(conds, clusterv1.ReadyCondition); c != nil && c.Status != metav1.ConditionTrue {
		return c.Reason
	}
	return "no conditions yet"
}

// WaitEndpoint waits until https://<endpoint>/readyz answers 200, i.e. the
// HAProxy VM forwards to a control-plane machine whose (stand-in) API
// server runs, and returns the body (the machine's hostname).
func WaitEndpoint(ctx context.Context, endpoint string) (string, error) {
	for {
		host, err := Readyz(ctx, endpoint)
		if err == nil {
			return host, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s did not answer: %w (last: %v)", endpoint, ctx.Err(), err)
		case <-time.After(2 * time.Second):
		}
	}
}

// Readyz asks https://<endpoint>/readyz once, over a fresh connection (so
// HAProxy picks a server anew), and returns the body of a 200 answer: the
// hostname of the demo's stand-in API server that answered. Its
// certificate is self-signed in the guest (see examples/demo), so it is not
// verified.
func Readyz(ctx context.Context, endpoint string) (string, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // self-signed in the guest
		DisableKeepAlives: true,
	}}
	url := "https://" + endpoint + "/readyz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return strings.TrimSpace(string(body)), nil
}

package devplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/kubeconfig"
)

// CNINamespace and CNIPodLabels find the CNI's pods of templates/cni-flannel.yaml.
const CNINamespace = "kube-flannel"

// CNIPodLabels select the CNI's pods in CNINamespace.
var CNIPodLabels = client.MatchingLabels{"app": "flannel"}

// NodesStatus is how far a kubeadm cluster's nodes have come: what
// `capl-dev up` and the e2e suite wait for.
type NodesStatus struct {
	// Machines is how many Machines the cluster should have (control
	// plane replicas plus MachineDeployment replicas); Joined lists the
	// Machines whose Node is Ready with the Machine's providerID and that
	// the Machine's status.nodeRef names.
	Machines int
	Joined   []string
	// Waiting explains, one entry per Machine not joined, what is missing.
	Waiting []string
	// CNIPods and CNIRunning count the CNI's pods, all and Running.
	CNIPods, CNIRunning int
}

// Done tells whether every Machine joined and every CNI pod runs.
func (s NodesStatus) Done() bool {
	return s.Machines > 0 && len(s.Joined) == s.Machines && len(s.Waiting) == 0 &&
		s.CNIPods >= s.Machines && s.CNIRunning == s.CNIPods
}

// String is a one-line progress report.
func (s NodesStatus) String() string {
	line := fmt.Sprintf("nodes Ready with their Machine's providerID %d/%d, CNI pods Running %d/%d", len(s.Joined), s.Machines, s.CNIRunning, s.CNIPods)
	if len(s.Waiting) > 0 {
		line += " (" + strings.Join(s.Waiting, "; ") + ")"
	}
	return line
}

// WorkloadClient is a client of cluster namespace/name's API server, from
// the kubeconfig Secret the control-plane provider wrote, with the
// kubeconfig itself.
func WorkloadClient(ctx context.Context, c client.Client, namespace, name string) (client.Client, []byte, error) {
	data, err := kubeconfig.FromSecret(ctx, c, client.ObjectKey{Namespace: namespace, Name: name})
	if err != nil {
		return nil, nil, err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return nil, nil, err
	}
	cfg.Timeout = 20 * time.Second
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	wc, err := client.New(cfg, client.Options{Scheme: scheme})
	return wc, data, err
}

// ReadNodesStatus compares the Machines of cluster namespace/name with the
// Nodes the workload client wc sees.
func ReadNodesStatus(ctx context.Context, c, wc client.Client, namespace, name string) (NodesStatus, error) {
	var s NodesStatus
	prov, err := ClusterStatus(ctx, c, namespace, name)
	if err != nil {
		return s, err
	}
	s.Machines = prov.Machines
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: name}); err != nil {
		return s, err
	}
	var nodes corev1.NodeList
	if err := wc.List(ctx, &nodes); err != nil {
		return s, fmt.Errorf("listing the workload cluster's nodes: %w", err)
	}
	byName := map[string]*corev1.Node{}
	for i := range nodes.Items {
		byName[nodes.Items[i].Name] = &nodes.Items[i]
	}
	for _, m := range machines.Items {
		if why := machineNodeIssue(&m, byName); why != "" {
			s.Waiting = append(s.Waiting, m.Name+": "+why)
			continue
		}
		s.Joined = append(s.Joined, m.Name)
	}
	slices.Sort(s.Joined)
	slices.Sort(s.Waiting)
	var pods corev1.PodList
	if err := wc.List(ctx, &pods, client.InNamespace(CNINamespace), CNIPodLabels); err != nil {
		return s, fmt.Errorf("listing the CNI's pods: %w", err)
	}
	for _, p := range pods.Items {
		s.CNIPods++
		if p.Status.Phase == corev1.PodRunning {
			s.CNIRunning++
		}
	}
	return s, nil
}

// machineNodeIssue says what keeps Machine m from having joined, or "".
func machineNodeIssue(m *clusterv1.Machine, nodes map[string]*corev1.Node) string {
	if m.Spec.ProviderID == "" {
		return "no providerID yet"
	}
	if !m.Status.NodeRef.IsDefined() {
		for _, n := range nodes {
			if n.Spec.ProviderID == m.Spec.ProviderID {
				return "node " + n.Name + " registered, no nodeRef yet"
			}
		}
		return "no node yet"
	}
	n := nodes[m.Status.NodeRef.Name]
	switch {
	case n == nil:
		return "nodeRef " + m.Status.NodeRef.Name + " names no node"
	case n.Spec.ProviderID != m.Spec.ProviderID:
		return fmt.Sprintf("node %s has providerID %q, the Machine %q", n.Name, n.Spec.ProviderID, m.Spec.ProviderID)
	case !NodeReady(n):
		return "node " + n.Name + " not Ready"
	}
	return ""
}

// NodeReady tells whether a Node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitControlPlaneNode waits until a control-plane node of cluster
// namespace/name is Ready, asking every 10 s on one workload client.
func WaitControlPlaneNode(ctx context.Context, c client.Client, namespace, name string, progress func(string)) error {
	var wc client.Client
	last := ""
	for {
		line, ready := "", false
		var err error
		if wc == nil {
			if wc, _, err = WorkloadClient(ctx, c, namespace, name); err != nil {
				line = "workload kubeconfig: " + err.Error()
				wc = nil
			}
		}
		if wc != nil {
			ready, line, err = controlPlaneNodeReady(ctx, wc)
			if err != nil {
				line = err.Error()
			}
		}
		if ready {
			return nil
		}
		if line != last {
			progress(line)
			last = line
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster %s/%s: no control-plane node Ready: %w (last: %s)", namespace, name, ctx.Err(), last)
		case <-time.After(10 * time.Second):
		}
	}
}

// ControlPlaneLabel marks control-plane nodes (kubeadm sets it).
const ControlPlaneLabel = "node-role.kubernetes.io/control-plane"

// controlPlaneNodeReady tells whether a control-plane node is Ready, with a
// progress line.
func controlPlaneNodeReady(ctx context.Context, wc client.Client) (bool, string, error) {
	nodes := &corev1.NodeList{}
	if err := wc.List(ctx, nodes, client.HasLabels{ControlPlaneLabel}); err != nil {
		return false, "", fmt.Errorf("listing the workload cluster's nodes: %w", err)
	}
	for i := range nodes.Items {
		if NodeReady(&nodes.Items[i]) {
			return true, "control-plane node " + nodes.Items[i].Name + " Ready", nil
		}
	}
	return false, fmt.Sprintf("%d control-plane nodes registered, none Ready yet", len(nodes.Items)), nil
}

// WaitNodes waits until every Machine of cluster namespace/name has a Ready
// Node with its providerID and the CNI's pods run, calling progress with
// each changed status (or error). It returns the workload kubeconfig. It
// keeps one workload client (one kept-alive connection) and asks every
// 10 s: under TCG a TLS handshake costs the guest's API server seconds.
func WaitNodes(ctx context.Context, c client.Client, namespace, name string, progress func(string)) (NodesStatus, []byte, error) {
	last := ""
	report := func(line string) {
		if line != last {
			progress(line)
			last = line
		}
	}
	var wc client.Client
	var kubeconfig []byte
	var s NodesStatus
	for {
		var err error
		if wc == nil {
			if wc, kubeconfig, err = WorkloadClient(ctx, c, namespace, name); err != nil {
				err = fmt.Errorf("workload kubeconfig: %w", err)
			}
		}
		if err == nil {
			s, err = ReadNodesStatus(ctx, c, wc, namespace, name)
		}
		if err != nil {
			report(err.Error())
		} else {
			report(s.String())
			if s.Done() {
				return s, kubeconfig, nil
			}
		}
		select {
		case <-ctx.Done():
			return s, nil, fmt.Errorf("cluster %s/%s: nodes not Ready: %w (last: %s)", namespace, name, ctx.Err(), last)
		case <-time.After(10 * time.Second):
		}
	}
}

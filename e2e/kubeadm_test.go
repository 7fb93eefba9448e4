//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// The kubeadm scenario's cluster: templates/cluster-template.yaml rendered
// as `make up` renders it, one control-plane machine and one worker.
const (
	kubeadmName = "k8s"
	// kubeadmReadyTimeout bounds apply → every node Ready: under TCG on 2
	// cores, booting two VMs and kubeadm init and join take most of it.
	kubeadmReadyTimeout = 45 * time.Minute
	// kubeadmJoinTimeout bounds a new worker's boot and kubeadm join.
	kubeadmJoinTimeout = 25 * time.Minute
)

// kubeadmState is what the kubeadm scenario learnt so far.
type kubeadmState struct {
	opts    devplane.ClusterOptions
	applied time.Time
	// wc is the workload cluster's client, once its kubeconfig exists.
	wc client.Client
	// ready is set once every node was Ready; later phases skip without it.
	ready bool
	// durableEtcd keeps etcd's fsync that TCGTuning turns off, so that the
	// control plane survives its VM being killed.
	durableEtcd bool
	// guestHost runs the control-plane node's domain when that is not the
	// suite's own host (the multi-host scenario).
	guestHost virt.GuestHost
	// workerWithin, when set, is how soon after apply the control-plane
	// node must be Ready for the staged workers to join (workersFit).
	workerWithin time.Duration
	// noWorkers is set when they did not: the control plane schedules
	// pods instead.
	noWorkers bool
}

// createKubeadm renders the template and the CNI's ClusterResourceSet as
// `make up` does, with one control-plane machine and workers, and applies
// them.
func (s *suite) createKubeadm(t *testing.T, workers int32) {
	o := kubeadmOptions(t, workers)
	version := o.KubernetesVersion
	if s.k8s.durableEtcd {
		o.EtcdUnsafeNoFsync = "false"
	}
	if o.HostEtcd {
		var err error
		o, err = devplane.PlaceEtcd(s.ctx, s.c, o)
		must(t, err)
	}
	objs := s.renderCluster(t, o)
	s.cut = templateCut(o)
	for _, u := range objs {
		if u.GetKind() == "LibvirtMachineTemplate" && u.GetName() == s.cut.workers {
			tmpl := &infrav1.LibvirtMachineTemplate{}
			must(t, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, tmpl))
			s.cut.machineSpec = tmpl.Spec.Template.Spec
		}
	}
	if s.cut.machineSpec.Image.Volume == nil {
		t.Fatalf("the template rendered no LibvirtMachineTemplate %s with an image volume", s.cut.workers)
	}
	must(t, s.c.Create(s.ctx, extraBootstrap()))
	s.applyCluster(t, objs)
	t.Logf("kubeadm cluster %s applied (%d objects from the template, Kubernetes %s)", kubeadmName, len(objs), version)
	s.rep.mu.Lock()
	s.rep.KubeadmCluster = fmt.Sprintf("Kubernetes %s, domain type %s (TCG) with CPU %s and a %d MiB translation cache, on %d host cores; "+
		"control plane 2 vCPU / 4096 MiB, workers %d vCPU / 2048 MiB created once the control-plane node is Ready, "+
		"leader election %s (lease %s, renew %s), etcd unsafe-no-fsync %s, static pod probes timeout %ss, liveness %s and startup %s failures, "+
		"API server readiness every %ss, node monitor grace period %s, etcd progress notifications every %s, heartbeat %s ms, election timeout %s ms, "+
		"%d CoreDNS replicas, %s (devplane.ClusterOptions.TCGTuning, as make up does under TCG).",
		version, s.k8s.opts.DomainType, cmp.Or(s.k8s.opts.CPUModel, "mode maximum"), s.k8s.opts.TCGCacheMiB, s.cores, s.k8s.opts.WorkerCPUs,
		cmp.Or(s.k8s.opts.LeaderElect, "true"), s.k8s.opts.LeaderElectLease, s.k8s.opts.LeaderElectRenew, cmp.Or(s.k8s.opts.EtcdUnsafeNoFsync, "false"),
		s.k8s.opts.ProbeTimeout, s.k8s.opts.LivenessFailures, s.k8s.opts.StartupFailures,
		cmp.Or(s.k8s.opts.APIServerReadinessPeriod, "1"), cmp.Or(s.k8s.opts.NodeMonitorGracePeriod, "50s"),
		cmp.Or(s.k8s.opts.EtcdProgressNotifyInterval, "5s"), cmp.Or(s.k8s.opts.EtcdHeartbeatIntervalMS, "100"),
		cmp.Or(s.k8s.opts.EtcdElectionTimeoutMS, "1000"), cmp.Or(s.k8s.opts.CoreDNSReplicas, 2), etcdPlacement(s.k8s.opts))
	s.rep.mu.Unlock()
}

// etcdPlacement says where the etcd of a cluster of o runs, for the report.
func etcdPlacement(o devplane.ClusterOptions) string {
	if o.HostEtcd {
		return fmt.Sprintf("etcd on the host (port %d, served by the plane)", o.HostEtcdPort)
	}
	return "an etcd member in each control-plane machine"
}

// templateCut is the cluster under test of cluster-template.yaml rendered
// with o, whose objects are named after the Cluster; the suite's own
// machines get extraBootstrapSecret.
func templateCut(o devplane.ClusterOptions) clusterUnderTest {
	return clusterUnderTest{name: o.Name, infrastructure: o.Name, controlPlane: o.Name + "-control-plane", workers: o.MachineDeploymentName(),
		bootstrapSecret: extraBootstrapSecret, controlPlaneMachines: o.ControlPlane, workerMachines: o.Workers}
}

// renderCluster makes o the kubeadm cluster's options, imports the images
// it names into its pool and renders it as `make up` does.
func (s *suite) renderCluster(t *testing.T, o devplane.ClusterOptions) []*unstructured.Unstructured {
	t.Helper()
	s.k8s.opts, s.k8s.wc, s.k8s.ready, s.k8s.noWorkers = o, nil, false, false
	if filepath.Dir(s.image) != o.ImageDir {
		t.Fatalf("the node image (in %s) and the HAProxy image must share a directory (%s)", o.ImageDir, filepath.Dir(s.image))
	}
	must(t, devplane.RecordClusterScope(s.state, o))
	stop := s.rep.phase("kubeadm: import node and load-balancer images into the pool")
	imgs, err := devplane.SeedImages(s.ctx, s.host, o)
	stop()
	must(t, err)
	objs, err := devplane.RenderCluster(o, devplane.ClusterVariables(o, imgs))
	must(t, err)
	return objs
}

// applyCluster applies the rendered cluster and the CNI's
// ClusterResourceSet (which stays when it exists).
func (s *suite) applyCluster(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	cni, err := devplane.CNIObjects(s.k8s.opts)
	must(t, err)
	must(t, devplane.ApplyCluster(s.ctx, s.c, cni, objs))
	s.k8s.applied = time.Now()
}

// kubeadmOptions are the options of the scenarios' kubeadm cluster:
// templates/cluster-template.yaml and flannel rendered as `make up` renders
// them under TCG, one control-plane machine and workers, the node image
// the suite was given (the upgrade scenario's older one when set).
func kubeadmOptions(t *testing.T, workers int32) devplane.ClusterOptions {
	nodeImage := testlibvirt.NodeImage(t)
	if *upgrade {
		nodeImage = nodeImageFrom(t)
	}
	version := nodeImageVersion(nodeImage)
	root, err := filepath.Abs("..")
	must(t, err)
	return devplane.ClusterOptions{
		Namespace: namespace, Name: kubeadmName, ControlPlane: 1, Workers: workers,
		KubernetesVersion: version,
		Template:          filepath.Join(root, "templates", "cluster-template.yaml"),
		CNI:               filepath.Join(root, "templates", "cni-flannel.yaml"),
		ImageDir:          filepath.Dir(nodeImage),
		DomainType:        string(infrav1.DomainTypeQEMU),
		StoragePool:       e2ePool,
		// The upgrade rolls the control plane out, which with a stacked
		// etcd does not complete on a 2-core TCG host: its etcd runs on
		// the host, as capl-dev up's does under TCG (docs/tcg.md).
		HostEtcd: *upgrade,
	}.TCGTuning()
}

// extraBootstrapSecret is the bootstrap data of the machines the suite
// adds to the kubeadm cluster itself (bad input, faults): a cloud-config
// that joins nothing, so that a guest that boots before its machine is
// deleted stays out of the workload cluster.
const extraBootstrapSecret = extraPrefix + "bootstrap"

func extraBootstrap() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: extraBootstrapSecret,
			Labels: map[string]string{clusterv1.ClusterNameLabel: kubeadmName}},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"format": []byte("cloud-config"), "value": []byte("#cloud-config\nruncmd:\n- [mkdir, -p, /run/cluster-api]\n- [touch, /run/cluster-api/bootstrap-success.complete]\n")},
	}
}

// kubeadmReady waits for the load balancer, the first control-plane node
// and every node, recording each as a figure with the workers' join cost,
// and checks that Nodes and Machines agree.
func (s *suite) kubeadmReady(t *testing.T) {
	joining := s.clusterReady(t, "kubeadm cluster", kubeadmPhasePrefix)
	if !s.k8s.noWorkers {
		s.recordJoinCost(t, joining)
	}
	s.k8s.ready = true
	s.checkKubeadmMachines(t)
	s.waitWorkloadSettled(t)
}

// How the workload API server counts as settled: settledAnswers /readyz in
// a row, settleInterval apart, each answered 200 within settleAnswerTime.
const (
	settledAnswers   = 3
	settleAnswerTime = 5 * time.Second
	settleInterval   = 15 * time.Second
	settleTimeout    = 20 * time.Minute
)

// waitWorkloadSettled waits, once every node is Ready, until the workload
// API server answers promptly. Under TCG on 2 host cores the control plane
// is saturated for minutes after its nodes turn Ready (flannel, CoreDNS,
// kube-controller-manager's first syncs, Cluster API's health probes that
// time out, disconnect and reconnect, each reconnect listing again): on
// 2026-11-27 it left requests unanswered for more than 5 minutes right
// after Ready, here and in CI, and the checks that came next failed on
// timeouts rather than on what they check.
func (s *suite) waitWorkloadSettled(t *testing.T) {
	t.Helper()
	_, kubeconfig, err := devplane.WorkloadClient(s.ctx, s.c, namespace, s.cut.name)
	must(t, err)
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	must(t, err)
	cfg.Timeout = settleAnswerTime
	hc, err := rest.HTTPClientFor(cfg)
	must(t, err)
	start, inARow := time.Now(), 0
	err = s.pollEvery(t, "the workload API server to settle", settleTimeout, settleInterval, func() (bool, string) {
		began := time.Now()
		resp, err := hc.Get(strings.TrimSuffix(cfg.Host, "/") + "/readyz")
		if err != nil {
			inARow = 0
			return false, fmt.Sprintf("/readyz: %v", err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			inARow = 0
			return false, fmt.Sprintf("/readyz: %s after %s", resp.Status, time.Since(began).Round(time.Millisecond))
		}
		inARow++
		return inARow >= settledAnswers, fmt.Sprintf("%d of %d prompt answers in a row", inARow, settledAnswers)
	})
	if err != nil {
		s.diagnoseWorkload(t)
		t.Fatal(err)
	}
	s.rep.phaseSince(kubeadmPhasePrefix+"all nodes Ready → workload API server settled (3 prompt /readyz in a row, 15 s apart)", start)()
}

// clusterReady waits until the kubeadm cluster's load balancer serves, its
// first control-plane node is Ready (then it scales staged workers) and
// every node is Ready, recording each as a figure named after
// phasePrefix; what prefixes the progress lines. It returns the CPU
// snapshot taken when the workers started to boot, and fills in the names
// of the cluster under test that Cluster API chose.
func (s *suite) clusterReady(t *testing.T, what, phasePrefix string) cpuSnapshot {
	t.Helper()
	k := &s.k8s
	s.waitFor(t, what+": load balancer serving", kubeadmReadyTimeout, func() (bool, string) {
		lc, err := s.readClusterRefs()
		if err != nil {
			return false, err.Error()
		}
		st, reason, msg := condition(lc, infrav1.LoadBalancerReadyCondition)
		return st == metav1.ConditionTrue, fmt.Sprintf("LoadBalancerReady %s %s: %s", st, reason, msg)
	})
	s.rep.phaseSince(phasePrefix+"apply → load balancer serving", k.applied)()
	s.waitControlPlaneNode(t, what)
	s.rep.phaseSince(phasePrefix+"apply → first control-plane node Ready", k.applied)()
	joining := s.snapshotCPU(t)
	if k.opts.StagedWorkers && s.workersFit(t, time.Since(k.applied)) {
		must(t, devplane.ScaleWorkers(s.ctx, s.c, k.opts, k.opts.Workers))
	}
	s.waitNodes(t, kubeadmReadyTimeout)
	s.rep.phaseSince(fmt.Sprintf("%sapply → all nodes Ready (1 control plane + %d workers)", phasePrefix, s.cut.workerMachines), k.applied)()
	md, err := devplane.WorkerMachineDeployment(s.ctx, s.c, k.opts)
	must(t, err)
	s.cut.workers = md.Name
	return joining
}

// workersFit tells whether the staged workers join, given how long after
// apply the control-plane node was Ready. A host whose control plane took
// longer than workerWithin is too slow under TCG for a worker's join to
// fit CI's time (on 2026-11-29: control-plane node Ready 16 minutes after
// apply, the worker's join 16 to 22 more, docs/tcg.md): the workers stay
// at zero and the control plane schedules pods, as issue 26 allows, and
// the report says so with the figure.
func (s *suite) workersFit(t *testing.T, controlPlaneReady time.Duration) bool {
	t.Helper()
	within := s.k8s.workerWithin
	if within == 0 || controlPlaneReady <= within {
		return true
	}
	s.k8s.noWorkers, s.cut.workerMachines = true, 0
	s.untaintControlPlane(t)
	s.rep.note("no worker joined: the control-plane node was Ready %s after apply, past -e2e.worker-within %s, so this host's TCG is too slow for a worker's join to fit the run; "+
		"the control plane schedules pods (its NoSchedule taint removed) and the Service check's pod runs on it", controlPlaneReady.Round(time.Second), within)
	t.Logf("control-plane node Ready %s after apply, past %s: no worker joins, the control plane schedules pods", controlPlaneReady.Round(time.Second), within)
	return false
}

// untaintControlPlane removes kubeadm's NoSchedule taint from the
// workload cluster's control-plane nodes, as a single-node cluster has it.
func (s *suite) untaintControlPlane(t *testing.T) {
	t.Helper()
	s.workloadCall(t, "removing the control plane's NoSchedule taint", func() error {
		nodes := &corev1.NodeList{}
		if err := s.k8s.wc.List(s.ctx, nodes); err != nil {
			return err
		}
		for i := range nodes.Items {
			n := &nodes.Items[i]
			kept := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(taint corev1.Taint) bool {
				return taint.Key == controlPlaneRole && taint.Effect == corev1.TaintEffectNoSchedule
			})
			if len(kept) == len(n.Spec.Taints) {
				continue
			}
			patch := client.MergeFrom(n.DeepCopy())
			n.Spec.Taints = kept
			if err := s.k8s.wc.Patch(s.ctx, n, patch); err != nil {
				return err
			}
		}
		return nil
	})
}

// controlPlaneRole is the label and the taint kubeadm puts on
// control-plane nodes.
const controlPlaneRole = "node-role.kubernetes.io/control-plane"

// readClusterRefs reads the LibvirtCluster and KubeadmControlPlane names
// of the cluster under test from its Cluster into s.cut (the topology
// controller names them) and returns the LibvirtCluster.
func (s *suite) readClusterRefs() (*infrav1.LibvirtCluster, error) {
	cl := &clusterv1.Cluster{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: s.cut.name}, cl); err != nil {
		return nil, err
	}
	if !cl.Spec.ControlPlaneRef.IsDefined() {
		return nil, fmt.Errorf("cluster %s has no controlPlaneRef yet", cl.Name)
	}
	lc, err := devplane.LibvirtClusterOf(s.ctx, s.c, cl)
	if err != nil {
		return nil, err
	}
	s.cut.infrastructure, s.cut.controlPlane = lc.Name, cl.Spec.ControlPlaneRef.Name
	return lc, nil
}

// waitControlPlaneNode waits for the workload cluster's kubeconfig, keeps
// its client, and waits for the first control-plane node to be Ready;
// what prefixes the progress lines.
func (s *suite) waitControlPlaneNode(t *testing.T, what string) {
	t.Helper()
	s.waitFor(t, what+": workload kubeconfig", kubeadmReadyTimeout, func() (bool, string) {
		wc, _, err := devplane.WorkloadClient(s.ctx, s.c, namespace, s.cut.name)
		if err != nil {
			return false, err.Error()
		}
		s.k8s.wc = wc
		return true, ""
	})
	ctx, cancel := context.WithTimeout(s.ctx, kubeadmReadyTimeout)
	defer cancel()
	must(t, devplane.WaitControlPlaneNode(ctx, s.c, namespace, s.cut.name, func(line string) { t.Logf("%s: %s", what, line) }))
}

// waitNodes waits until every Machine of the kubeadm cluster has a Ready
// Node with its providerID and nodeRef, and the CNI runs on every node.
func (s *suite) waitNodes(t *testing.T, timeout time.Duration) devplane.NodesStatus {
	t.Helper()
	var last devplane.NodesStatus
	s.waitWorkload(t, "kubeadm cluster: every Machine's node Ready with its providerID", timeout, func() (bool, string) {
		if s.k8s.wc == nil {
			return false, "no workload client"
		}
		st, err := devplane.ReadNodesStatus(s.ctx, s.c, s.k8s.wc, namespace, s.cut.name)
		if err != nil {
			return false, err.Error()
		}
		last = st
		return st.Done(), st.String()
	})
	return last
}

// checkKubeadmMachines checks what the contract promises on every machine:
// providerID libvirt:///<UUID of the running domain>, the Node's
// providerID and addresses, and the LibvirtMachine's conditions.
func (s *suite) checkKubeadmMachines(t *testing.T) {
	lms, err := s.clusterMachines(s.cut.name)
	must(t, err)
	nodes := &corev1.NodeList{}
	s.workloadCall(t, "listing the workload cluster's nodes", func() error { return s.k8s.wc.List(s.ctx, nodes) })
	byProviderID := map[string]*corev1.Node{}
	for i := range nodes.Items {
		byProviderID[nodes.Items[i].Spec.ProviderID] = &nodes.Items[i]
	}
	for i := range lms {
		lm := &lms[i]
		checkConditions(t, "LibvirtMachine "+lm.Name, lm.Status.Conditions, infrav1.DomainReadyCondition, infrav1.BootstrapSucceededCondition)
		info, err := s.host.DomainInfo(s.ctx, lm.Status.Domain.Name)
		if err != nil {
			t.Errorf("%s: domain %s: %v", lm.Name, lm.Status.Domain.Name, err)
			continue
		}
		want := infrav1.ProviderIDPrefix + strings.ToLower(info.UUID)
		if lm.Spec.ProviderID != want {
			t.Errorf("%s: spec.providerID %q, the domain's UUID gives %q", lm.Name, lm.Spec.ProviderID, want)
		}
		n := byProviderID[want]
		if n == nil {
			t.Errorf("%s: no Node has providerID %s", lm.Name, want)
			continue
		}
		var internal []string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		for _, a := range lm.Status.Addresses {
			if a.Type == clusterv1.MachineInternalIP && !slices.Contains(internal, a.Address) {
				t.Errorf("%s: InternalIP %s is not among node %s's %v", lm.Name, a.Address, n.Name, internal)
			}
		}
		t.Logf("%s: node %s Ready, providerID %s, InternalIP %v", lm.Name, n.Name, want, internal)
	}
}

// needReady skips a phase when the cluster never became Ready.
func (s *suite) needReady(t *testing.T) {
	if !s.k8s.ready {
		t.Skip("the kubeadm cluster never had all nodes Ready")
	}
}

package devplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/cmd/clusterctl/client/yamlprocessor"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// CNILabel is the Cluster label templates/cluster-template.yaml sets; the
// ClusterResourceSet of CNIObjects applies the CNI to clusters carrying it.
const CNILabel = "cni"

// ClusterOptions shape the Kubernetes cluster `capl-dev up` renders from
// templates/cluster-template.yaml, or a Cluster of the ClusterClass of
// templates/clusterclass-libvirt.yaml (ClusterClass).
type ClusterOptions struct {
	// Namespace and Name of the Cluster.
	Namespace, Name string
	// ControlPlane is the KubeadmControlPlane's replicas; Workers the
	// MachineDeployment's.
	ControlPlane, Workers int32
	// KubernetesVersion is the version the node image was built for.
	KubernetesVersion string
	// Template is the path of the cluster template; CNI that of the CNI
	// manifest the ClusterResourceSet applies.
	Template, CNI string
	// ClusterClass is the path of the ClusterClass file (and its
	// templates) the topology Cluster of Template uses, e.g.
	// templates/clusterclass-libvirt.yaml with
	// templates/cluster-template-topology.yaml; empty for a template
	// without a ClusterClass. It is rendered with the same variables, as
	// clusterctl renders a flavour's ClusterClass.
	ClusterClass string
	// ImageDir holds the node image (NodeImageFileFor) and HAProxyImageFile.
	ImageDir string
	// NodeImage is the node image file when it is not ImageDir's
	// NodeImageFileFor(KubernetesVersion) (capl-dev's --node-image).
	NodeImage string
	// DomainType of every VM; TCGCacheMiB the node VMs' TCG translation
	// cache (ignored for kvm).
	DomainType  string
	TCGCacheMiB int32
	// CPUModel, when set, gives every VM of a plain template's cluster (its
	// machines and its HAProxy VM) cpuMode custom with this model instead
	// of the domain type's default CPU mode; empty keeps the default, and
	// so does a ClusterClass's cluster (RenderCluster).
	CPUModel string
	// WorkerCPUs and ControlPlaneCPUs override the template's vCPUs of
	// workers and of control-plane machines when set. One control-plane
	// vCPU skips kubeadm's NumCPU preflight check (setOneCPUControlPlane),
	// which asks for 2.
	WorkerCPUs, ControlPlaneCPUs int32
	// ControlPlaneCPUShares and WorkerCPUShares are the machines' CPU
	// weights (cpuShares) when set.
	ControlPlaneCPUShares, WorkerCPUShares int32
	// ProbeTimeout, LivenessFailures and StartupFailures override the
	// template's control-plane static pod probes (kubeadm's defaults).
	ProbeTimeout, LivenessFailures, StartupFailures string
	// EtcdUnsafeNoFsync, "true", stops etcd syncing its log to disk
	// (throwaway clusters on slow disks).
	EtcdUnsafeNoFsync string
	// ControlPlaneDrainTimeout is how many seconds a removed control-plane
	// machine is drained before it is deleted anyway; empty keeps the
	// template's (until its pods are gone).
	ControlPlaneDrainTimeout string
	// NodeDeletionTimeout is how many seconds, from a machine's deletion,
	// Cluster API tries to delete its Node; empty keeps the template's
	// (Cluster API's 10).
	NodeDeletionTimeout string
	// LeaderElect, "false", switches off the controller manager's and
	// scheduler's leader election; LeaderElectLease and LeaderElectRenew
	// override its timing. Empty keeps the template's.
	LeaderElect, LeaderElectLease, LeaderElectRenew string
	// APIServerReadinessPeriod is the seconds between the API server's
	// readiness probes; empty keeps the template's.
	APIServerReadinessPeriod string
	// NodeMonitorGracePeriod is how long the controller manager waits for
	// a node's heartbeat before marking it NotReady; empty keeps the
	// template's.
	NodeMonitorGracePeriod string
	// EtcdProgressNotifyInterval is how often etcd sends each watch a
	// progress notification; EtcdHeartbeatIntervalMS and
	// EtcdElectionTimeoutMS are its raft timing. Empty keeps the template's
	// (kubeadm's and etcd's defaults).
	EtcdProgressNotifyInterval, EtcdHeartbeatIntervalMS, EtcdElectionTimeoutMS string
	// CoreDNSReplicas overrides kubeadm's 2 CoreDNS replicas when set.
	CoreDNSReplicas int32
	// APIServerCPURequest and EtcdCPURequest are the control plane's
	// static pods' CPU requests, which set their CPU weights inside the
	// guest; ControlPlaneSystemCPUWeight is the control-plane node's
	// system.slice weight (the kubelet, containerd and its shims). Empty
	// keeps the template's (kubeadm's 250m and 100m, systemd's 100).
	APIServerCPURequest, EtcdCPURequest, ControlPlaneSystemCPUWeight string
	// WorkerMaxSurge and WorkerMaxUnavailable are the MachineDeployment's
	// rolling update; empty keeps Cluster API's (1 and 0).
	WorkerMaxSurge, WorkerMaxUnavailable string
	// StagedWorkers renders the MachineDeployment with no replicas; the
	// caller scales it to Workers once the first control-plane node is
	// Ready (ScaleWorkers). Under TCG on a small host a worker booting and
	// joining while the control plane's components start starves them into
	// a restart loop.
	StagedWorkers bool
	// StoragePool is the cluster's storage pool, at /var/lib/libvirt/<name>;
	// empty means the provider's default.
	StoragePool string
	// HostEtcd renders the cluster with its etcd on this host (the plane
	// runs it, plane.HostEtcdPortAnnotation) serving the guests on
	// HostEtcdPort (PlaceEtcd finds it), instead of an etcd member in
	// each control-plane machine: setHostEtcd. Plain templates only.
	HostEtcd     bool
	HostEtcdPort int
	// EtcdFollowsCluster makes HostEtcd the TCG profile's default rather
	// than a demand: a Cluster that exists keeps its etcd where it was
	// made (PlaceEtcd).
	EtcdFollowsCluster bool
}

// NodeTCGCacheMiB is the TCG translation cache of node VMs, QEMU's own
// default made explicit: a node keeps translating code at rest (every
// process it starts is translated afresh), and with 512 MiB the control
// plane's cache filled and was flushed every two minutes, costing a tenth
// more CPU at rest (docs/tcg.md); 2048 MiB measured no better.
const NodeTCGCacheMiB = 1024

// TCGCPUModel is the guest CPU model of the TCG profile. Under maximum, Go's
// crypto and runtime take the code paths of every feature TCG emulates
// (SHA-NI, BMI2, ADX, AVX2), which on some hosts cost several times what
// Westmere's plainer paths do: on the 2-core host of 2026-11-29 a guest did
// 56 TLS handshakes a second under Westmere and 17 under maximum, and 6 471
// JSON round trips against 4 550; on the host of 2026-11-25 the two were
// even but for Go's SHA-256 (docs/tcg.md). Westmere (x86-64-v2 with AES-NI)
// boots the node and HAProxy images; distributions built for x86-64-v3 need
// maximum.
const TCGCPUModel = "Westmere"

// NodeImageFileFor is the file name of `make node-image` for a Kubernetes
// version.
func NodeImageFileFor(kubernetesVersion string) string {
	return "capl-node-" + kubernetesVersion + ".qcow2"
}

func (o ClusterOptions) pool() (name, path string) {
	name = o.StoragePool
	if name == "" {
		name = infrav1.DefaultStoragePoolName
	}
	return name, filepath.Join("/var/lib/libvirt", name)
}

// ClusterVariables are the template variables for o, as clusterctl's
// flags and a user's environment would set them.
func ClusterVariables(o ClusterOptions, imgs ClusterImages) map[string]string {
	poolName, poolPath := o.pool()
	vars := map[string]string{
		"CLUSTER_NAME":                o.Name,
		"NAMESPACE":                   o.Namespace,
		"KUBERNETES_VERSION":          o.KubernetesVersion,
		"CONTROL_PLANE_MACHINE_COUNT": strconv.Itoa(int(o.ControlPlane)),
		"WORKER_MACHINE_COUNT":        strconv.Itoa(int(o.Workers)),
		"LIBVIRT_IMAGE_VOLUME":        imgs.Node.Volume,
		"LIBVIRT_LB_IMAGE_VOLUME":     imgs.LoadBalancer.Volume,
		"LIBVIRT_DOMAIN_TYPE":         o.DomainType,
		"LIBVIRT_STORAGE_POOL":        poolName,
		"LIBVIRT_STORAGE_POOL_PATH":   poolPath,
	}
	if o.TCGCacheMiB > 0 {
		vars["LIBVIRT_TCG_CACHE_MIB"] = strconv.Itoa(int(o.TCGCacheMiB))
	}
	for name, value := range map[string]int32{
		"LIBVIRT_WORKER_MACHINE_CPUS":        o.WorkerCPUs,
		"LIBVIRT_CONTROL_PLANE_MACHINE_CPUS": o.ControlPlaneCPUs,
		"LIBVIRT_CONTROL_PLANE_CPU_SHARES":   o.ControlPlaneCPUShares,
		"LIBVIRT_WORKER_CPU_SHARES":          o.WorkerCPUShares,
		"LIBVIRT_COREDNS_REPLICAS":           o.CoreDNSReplicas,
	} {
		if value > 0 {
			vars[name] = strconv.Itoa(int(value))
		}
	}
	for name, value := range map[string]string{
		"LIBVIRT_PROBE_TIMEOUT_SECONDS":                    o.ProbeTimeout,
		"LIBVIRT_LIVENESS_PROBE_FAILURE_THRESHOLD":         o.LivenessFailures,
		"LIBVIRT_STARTUP_PROBE_FAILURE_THRESHOLD":          o.StartupFailures,
		"LIBVIRT_ETCD_UNSAFE_NO_FSYNC":                     o.EtcdUnsafeNoFsync,
		"LIBVIRT_LEADER_ELECT":                             o.LeaderElect,
		"LIBVIRT_LEADER_ELECT_LEASE_DURATION":              o.LeaderElectLease,
		"LIBVIRT_LEADER_ELECT_RENEW_DEADLINE":              o.LeaderElectRenew,
		"LIBVIRT_API_SERVER_READINESS_PERIOD_SECONDS":      o.APIServerReadinessPeriod,
		"LIBVIRT_NODE_MONITOR_GRACE_PERIOD":                o.NodeMonitorGracePeriod,
		"LIBVIRT_ETCD_PROGRESS_NOTIFY_INTERVAL":            o.EtcdProgressNotifyInterval,
		"LIBVIRT_ETCD_HEARTBEAT_INTERVAL_MS":               o.EtcdHeartbeatIntervalMS,
		"LIBVIRT_ETCD_ELECTION_TIMEOUT_MS":                 o.EtcdElectionTimeoutMS,
		"LIBVIRT_WORKER_MAX_SURGE":                         o.WorkerMaxSurge,
		"LIBVIRT_WORKER_MAX_UNAVAILABLE":                   o.WorkerMaxUnavailable,
		"LIBVIRT_API_SERVER_CPU_REQUEST":                   o.APIServerCPURequest,
		"LIBVIRT_ETCD_CPU_REQUEST":                         o.EtcdCPURequest,
		"LIBVIRT_CONTROL_PLANE_SYSTEM_CPU_WEIGHT":          o.ControlPlaneSystemCPUWeight,
		"LIBVIRT_CONTROL_PLANE_NODE_DRAIN_TIMEOUT_SECONDS": o.ControlPlaneDrainTimeout,
		"LIBVIRT_NODE_DELETION_TIMEOUT_SECONDS":            o.NodeDeletionTimeout,
	} {
		if value != "" {
			vars[name] = value
		}
	}
	if o.StagedWorkers {
		vars["WORKER_MACHINE_COUNT"] = "0"
	}
	return vars
}

// RenderCluster renders the template at o.Template with vars by
// clusterctl's own variable rules (its yamlprocessor: ${VAR}, ${VAR:=default},
// an error naming every variable left unset). With o.ClusterClass the
// ClusterClass and its templates come first, rendered with the same
// variables and put into o.Namespace, as `clusterctl generate cluster`
// does for a flavour whose class is not installed: they must exist before
// the Cluster that names them.
func RenderCluster(o ClusterOptions, vars map[string]string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	if o.Topology() {
		class, err := renderFile(o.ClusterClass, vars)
		if err != nil {
			return nil, err
		}
		for _, u := range class {
			if u.GetNamespace() == "" {
				u.SetNamespace(o.Namespace)
			}
		}
		objs = class
	}
	cluster, err := renderFile(o.Template, vars)
	if err != nil {
		return nil, err
	}
	objs = append(objs, cluster...)
	// A ClusterClass's templates keep the domain type's default: with a
	// custom model in them, the topology controller stopped making the
	// infrastructure of the class's second cluster in envtest
	// (TestTopologyMatchesTemplate, 2026-11-29; not understood yet).
	if o.CPUModel != "" && !o.Topology() {
		if err := setCPUModel(objs, o.CPUModel); err != nil {
			return nil, err
		}
	}
	if o.ControlPlaneCPUs == 1 {
		if err := setOneCPUControlPlane(objs); err != nil {
			return nil, err
		}
	}
	if o.HostEtcd {
		if o.HostEtcdPort == 0 {
			return nil, errors.New("an etcd on the host needs its port (HostEtcdPort)")
		}
		if o.Topology() {
			return nil, errors.New("an etcd on the host is for plain templates only, not for a ClusterClass's Cluster")
		}
		if err := setHostEtcd(objs, o.HostEtcdPort); err != nil {
			return nil, err
		}
	}
	return objs, nil
}

// hardwarePaths are where each kind of a plain template's objects holds
// a VM's hardware (infrav1.VirtualHardware, inlined).
var hardwarePaths = map[string][]string{
	"LibvirtMachineTemplate": {"spec", "template", "spec"},
	"LibvirtCluster":         {"spec", "loadBalancer"},
}

// setCPUModel gives every VM hardware of objs cpuMode custom with model. It
// is not a template variable because the default it replaces depends on the
// domain type, which a template variable's default cannot.
func setCPUModel(objs []*unstructured.Unstructured, model string) error {
	for _, u := range objs {
		path, ok := hardwarePaths[u.GetKind()]
		if !ok || u.GetAPIVersion() != infrav1.GroupVersion.String() {
			continue
		}
		for field, value := range map[string]string{"cpuMode": string(infrav1.CPUModeCustom), "cpuModel": model} {
			if err := unstructured.SetNestedField(u.Object, value, append(slices.Clone(path), field)...); err != nil {
				return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
			}
		}
	}
	return nil
}

// renderFile renders the YAML file at path with vars (RenderCluster).
func renderFile(path string, vars map[string]string) ([]*unstructured.Unstructured, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out, err := yamlprocessor.NewSimpleProcessor().Process(raw, func(name string) (string, error) {
		if v, ok := vars[name]; ok {
			return v, nil
		}
		if v, ok := os.LookupEnv(name); ok {
			return v, nil
		}
		return "", fmt.Errorf("variable %s is not set", name)
	})
	if err != nil {
		return nil, fmt.Errorf("rendering %s: %w", path, err)
	}
	return decodeObjects(out)
}

// decodeObjects splits a multi-document YAML stream into objects, with
// integers as int64 the way the API machinery decodes them.
func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []*unstructured.Unstructured
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(js)) == 0 || string(bytes.TrimSpace(js)) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, err
		}
		objs = append(objs, u)
	}
}

// TCGTuning is what ClusterOptions change for a host without usable KVM:
// a large translation cache, a plainer guest CPU model (TCGCPUModel),
// 1-vCPU workers (a 2-core host keeps a core for the control plane),
// workers staged after the control plane, a
// leader election (none for one control-plane machine) and static pod
// probes that survive an API server answering in tens of seconds and
// probe it less often, node heartbeats allowed to come late, and an etcd
// that does not wait for the disk, CPU for the control plane first: on
// the host (its VM weighted 4:1 over workers) and inside it (the API
// server and etcd over the node agent and runtime). Set ControlPlane
// first.
func (o ClusterOptions) TCGTuning() ClusterOptions {
	o.TCGCacheMiB = NodeTCGCacheMiB
	o.CPUModel = TCGCPUModel
	o.WorkerCPUs = 1
	o.StagedWorkers = true
	o.LeaderElectLease, o.LeaderElectRenew = "180s", "150s"
	o.LeaderElect = tcgLeaderElect(o)
	// A rollout's old control-plane node, starved, left its evicted
	// CoreDNS pod Terminating and the rollout waited on the drain.
	o.ControlPlaneDrainTimeout = "300"
	// Cluster API deleted the old node of an upgrade's control plane with
	// one 10 s call, 7 minutes after the machine's deletion (its drain),
	// and the busy API server did not answer it: the Node stayed, NotReady
	// (docs/tcg.md). Counted from the deletion, 900 s leave ten minutes of
	// retries after the drain's 300.
	o.NodeDeletionTimeout = "900"
	o.ProbeTimeout, o.LivenessFailures, o.StartupFailures = "60", "60", "120"
	o.EtcdUnsafeNoFsync = "true"
	o.APIServerReadinessPeriod = "10"
	// A saturated control plane answers the kubelets' lease renewals
	// later than the default 50 s: its own node flapped NotReady all
	// through the kubeadm e2e's scale-up.
	o.NodeMonitorGracePeriod = "2m"
	// Idle CPU of the control plane, measured in docs/tcg.md: progress
	// notifications every 5 s woke etcd and the API server for every
	// watch; the second CoreDNS pod costs its own runtime shim and probes.
	o.EtcdProgressNotifyInterval = "60s"
	o.EtcdHeartbeatIntervalMS, o.EtcdElectionTimeoutMS = "500", "5000"
	o.CoreDNSReplicas = 1
	// A rollout's surge worker is a third VM beside the control plane and
	// the old worker: on a 2-core host it starved the control plane until
	// its node went Unknown (docs/upgrades.md). Replace, do not double.
	o.WorkerMaxSurge, o.WorkerMaxUnavailable = "0", "1"
	// On a slow host the control plane's new API server never finished
	// starting: its start-up hooks' TLS handshakes with itself waited on a
	// guest CPU that the kubelet, containerd, its shims and the scheduler
	// took first, the hooks gave up and the server exited, again and
	// again; weighted, it started within a minute (docs/tcg.md). On the
	// host, a worker booting beside a loaded control plane starved it
	// until its API server stopped answering (CI, 2026-11-29): weighted
	// 4:1 the control plane keeps most of the host while a worker joins,
	// which then takes longer; at 2:1 the join took 966 s instead of
	// 1 334 s but CoreDNS on the starved control plane stopped answering
	// the worker's pods (docs/tcg.md).
	o.APIServerCPURequest, o.EtcdCPURequest, o.ControlPlaneSystemCPUWeight = "1", "300m", "25"
	if o.ControlPlaneCPUs == 1 {
		// The kubelet admits a static pod only within the node's CPU: on
		// one vCPU the API server's 1 CPU left the controller manager
		// (200m) and the scheduler (100m) rejected for good. These keep
		// the API server first and leave room for the CNI's and CoreDNS's
		// 100m each.
		o.APIServerCPURequest, o.EtcdCPURequest = "400m", "100m"
	}
	o.ControlPlaneCPUShares, o.WorkerCPUShares = 4096, 1024
	return o
}

// tcgLeaderElect is the TCG profile's leader election of the controller
// manager and the scheduler: "false" (off) or "" (the template's, on).
func tcgLeaderElect(o ClusterOptions) string {
	if o.ControlPlane == 1 && !o.HostEtcd {
		// A renewal that misses its deadline restarts the component even
		// with nobody to hand over to; one control plane needs no election.
		// With etcd on the host a renewal no longer waits on the guest's
		// etcd, and a rollout's second control plane would otherwise run
		// a second controller manager and scheduler beside the first.
		return "false"
	}
	return ""
}

// Topology tells whether o renders a Cluster of a ClusterClass.
func (o ClusterOptions) Topology() bool { return o.ClusterClass != "" }

// TopologyWorkers is the name cluster-template-topology.yaml gives its
// MachineDeployment of workers in spec.topology.
const TopologyWorkers = "md-0"

// MachineDeploymentName is cluster-template.yaml's MachineDeployment of
// workers. A topology's is named by Cluster API (WorkerMachineDeployment).
func (o ClusterOptions) MachineDeploymentName() string { return o.Name + "-" + TopologyWorkers }

// WorkerMachineDeployment reads the cluster's MachineDeployment of workers:
// the template's, or the one Cluster API's topology controller made for
// TopologyWorkers, which it names with a random suffix (and creates only
// once the control plane has a Machine).
func WorkerMachineDeployment(ctx context.Context, c client.Client, o ClusterOptions) (*clusterv1.MachineDeployment, error) {
	md := &clusterv1.MachineDeployment{}
	if !o.Topology() {
		return md, c.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.MachineDeploymentName()}, md)
	}
	var mds clusterv1.MachineDeploymentList
	if err := c.List(ctx, &mds, client.InNamespace(o.Namespace), client.MatchingLabels{
		clusterv1.ClusterNameLabel: o.Name, clusterv1.ClusterTopologyMachineDeploymentNameLabel: TopologyWorkers,
	}); err != nil {
		return nil, err
	}
	if len(mds.Items) != 1 {
		return nil, fmt.Errorf("cluster %s/%s has %d MachineDeployments of topology %s, want 1", o.Namespace, o.Name, len(mds.Items), TopologyWorkers)
	}
	return &mds.Items[0], nil
}

// ScaleWorkers sets the replicas of the cluster's MachineDeployment: in
// the Cluster's topology when it has one, whose controller owns the
// MachineDeployment's replicas.
func ScaleWorkers(ctx context.Context, c client.Client, o ClusterOptions, replicas int32) error {
	if !o.Topology() {
		md, err := WorkerMachineDeployment(ctx, c, o)
		if err != nil {
			return err
		}
		patch := client.MergeFrom(md.DeepCopy())
		md.Spec.Replicas = &replicas
		return c.Patch(ctx, md, patch)
	}
	cl := &clusterv1.Cluster{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Name}, cl); err != nil {
		return err
	}
	patch := client.MergeFrom(cl.DeepCopy())
	mds := cl.Spec.Topology.Workers.MachineDeployments
	i := slices.IndexFunc(mds, func(md clusterv1.MachineDeploymentTopology) bool { return md.Name == TopologyWorkers })
	if i < 0 {
		return fmt.Errorf("cluster %s/%s has no MachineDeployment %s in its topology", o.Namespace, o.Name, TopologyWorkers)
	}
	mds[i].Replicas = &replicas
	return c.Patch(ctx, cl, patch)
}

// RecordClusterScope adds the cluster's namespace and storage pool to the
// plane's scope.json, so that Down removes its libvirt objects even when
// the plane is no longer running.
func RecordClusterScope(stateDir string, o ClusterOptions) error {
	pool, _ := o.pool()
	return plane.RecordScope(stateDir, []string{o.Namespace}, []string{pool})
}

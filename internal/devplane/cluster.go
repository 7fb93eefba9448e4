package devplane

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	addonsv1 "sigs.k8s.io/cluster-api/api/addons/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/cmd/clusterctl/client/yamlprocessor"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
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
	// WorkerCPUs overrides the template's worker vCPUs when set.
	WorkerCPUs int32
	// ControlPlaneCPUShares and WorkerCPUShares are the machines' CPU
	// weights (cpuShares) when set.
	ControlPlaneCPUShares, WorkerCPUShares int32
	// ProbeTimeout, LivenessFailures and StartupFailures override the
	// template's control-plane static pod probes (kubeadm's defaults).
	ProbeTimeout, LivenessFailures, StartupFailures string
	// EtcdUnsafeNoFsync, "true", stops etcd syncing its log to disk
	// (throwaway clusters on slow disks).
	EtcdUnsafeNoFsync string
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
	// StagedWorkers renders the MachineDeployment with no replicas; the
	// caller scales it to Workers once the first control-plane node is
	// Ready (ScaleWorkers). Under TCG on a small host a worker booting and
	// joining while the control plane's components start starves them into
	// a restart loop.
	StagedWorkers bool
	// StoragePool is the cluster's storage pool, at /var/lib/libvirt/<name>;
	// empty means the provider's default.
	StoragePool string
}

// NodeTCGCacheMiB is the TCG translation cache of node VMs, QEMU's own
// default made explicit: a node keeps translating code at rest (every
// process it starts is translated afresh), and with 512 MiB the control
// plane's cache filled and was flushed every two minutes, costing a tenth
// more CPU at rest (docs/tcg.md); 2048 MiB measured no better.
const NodeTCGCacheMiB = 1024

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

// ClusterImage is an image file of ClusterOptions.ImageDir and the volume
// it becomes in the cluster's pool.
type ClusterImage struct {
	// Path and SHA256 (hex) of the file.
	Path, SHA256 string
	// Volume is named as the provider names imported base images: after
	// the content, so an image rebuilt by `make node-image` gets a new
	// volume and Down removes them like any base image.
	Volume string
}

// ClusterImages are the node image and the load balancer's image.
type ClusterImages struct {
	Node, LoadBalancer ClusterImage
}

// NodeImagePath is the node image file of o: NodeImage, or the one of
// KubernetesVersion in ImageDir.
func (o ClusterOptions) NodeImagePath() string {
	if o.NodeImage != "" {
		return o.NodeImage
	}
	return filepath.Join(o.ImageDir, NodeImageFileFor(o.KubernetesVersion))
}

// ImageVolumes reads the node image (NodeImagePath) and the HAProxy image
// of o.ImageDir.
func ImageVolumes(o ClusterOptions) (ClusterImages, error) {
	node, err := clusterImage(filepath.Dir(o.NodeImagePath()), filepath.Base(o.NodeImagePath()))
	if err != nil {
		return ClusterImages{}, err
	}
	lb, err := clusterImage(o.ImageDir, HAProxyImageFile)
	return ClusterImages{Node: node, LoadBalancer: lb}, err
}

func clusterImage(dir, file string) (ClusterImage, error) {
	path := filepath.Join(dir, file)
	sum, err := fileSHA256(path)
	if err != nil {
		return ClusterImage{}, fmt.Errorf("cluster image: %w (build it with `make images node-image`)", err)
	}
	return ClusterImage{Path: path, SHA256: sum, Volume: naming.ImageVolumeName(sum)}, nil
}

// SeedImages imports the images of ImageVolumes into the cluster's storage
// pool, creating the pool. The template names its images as volumes, as
// image-builder users have them; this is how the one-host plane gets its
// files there. An image already imported is not copied again. Only files
// of o.ImageDir (and the node image's directory) are read: the import's
// source policy, the directories the caller names.
func SeedImages(ctx context.Context, host virt.Host, o ClusterOptions) (ClusterImages, error) {
	poolName, poolPath := o.pool()
	if err := host.EnsurePool(ctx, virt.PoolSpec{Name: poolName, Path: poolPath}); err != nil {
		return ClusterImages{}, err
	}
	imgs, err := ImageVolumes(o)
	if err != nil {
		return ClusterImages{}, err
	}
	for _, img := range []ClusterImage{imgs.Node, imgs.LoadBalancer} {
		if _, err := host.ImportImage(ctx, virt.ImageImport{Pool: poolName, Volume: img.Volume, Source: img.Path, SHA256: img.SHA256,
			Policy: virt.SourcePolicy{FileDirs: []string{o.ImageDir, filepath.Dir(o.NodeImagePath())}}}); err != nil {
			return ClusterImages{}, fmt.Errorf("importing %s into pool %s: %w", img.Path, poolName, err)
		}
	}
	return imgs, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
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
		"LIBVIRT_WORKER_MACHINE_CPUS":      o.WorkerCPUs,
		"LIBVIRT_CONTROL_PLANE_CPU_SHARES": o.ControlPlaneCPUShares,
		"LIBVIRT_WORKER_CPU_SHARES":        o.WorkerCPUShares,
		"LIBVIRT_COREDNS_REPLICAS":         o.CoreDNSReplicas,
	} {
		if value > 0 {
			vars[name] = strconv.Itoa(int(value))
		}
	}
	for name, value := range map[string]string{
		"LIBVIRT_PROBE_TIMEOUT_SECONDS":               o.ProbeTimeout,
		"LIBVIRT_LIVENESS_PROBE_FAILURE_THRESHOLD":    o.LivenessFailures,
		"LIBVIRT_STARTUP_PROBE_FAILURE_THRESHOLD":     o.StartupFailures,
		"LIBVIRT_ETCD_UNSAFE_NO_FSYNC":                o.EtcdUnsafeNoFsync,
		"LIBVIRT_LEADER_ELECT":                        o.LeaderElect,
		"LIBVIRT_LEADER_ELECT_LEASE_DURATION":         o.LeaderElectLease,
		"LIBVIRT_LEADER_ELECT_RENEW_DEADLINE":         o.LeaderElectRenew,
		"LIBVIRT_API_SERVER_READINESS_PERIOD_SECONDS": o.APIServerReadinessPeriod,
		"LIBVIRT_NODE_MONITOR_GRACE_PERIOD":           o.NodeMonitorGracePeriod,
		"LIBVIRT_ETCD_PROGRESS_NOTIFY_INTERVAL":       o.EtcdProgressNotifyInterval,
		"LIBVIRT_ETCD_HEARTBEAT_INTERVAL_MS":          o.EtcdHeartbeatIntervalMS,
		"LIBVIRT_ETCD_ELECTION_TIMEOUT_MS":            o.EtcdElectionTimeoutMS,
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
	return append(objs, cluster...), nil
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

// CNIObjects are a ConfigMap holding the CNI manifest at o.CNI and a
// ClusterResourceSet applying it once to every cluster of the namespace
// labelled CNILabel=flannel. The manifest stays out of the cluster template
// because its shell script is full of "$", which clusterctl's variable
// substitution would take for variables.
func CNIObjects(o ClusterOptions) ([]client.Object, error) {
	manifest, err := os.ReadFile(o.CNI)
	if err != nil {
		return nil, err
	}
	name := "cni-flannel"
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: name},
		Data:       map[string]string{filepath.Base(o.CNI): string(manifest)},
	}
	crs := &addonsv1.ClusterResourceSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: name},
		Spec: addonsv1.ClusterResourceSetSpec{
			ClusterSelector: metav1.LabelSelector{MatchLabels: map[string]string{CNILabel: "flannel"}},
			Resources:       []addonsv1.ResourceRef{{Kind: "ConfigMap", Name: name}},
			Strategy:        string(addonsv1.ClusterResourceSetStrategyApplyOnce),
		},
	}
	return []client.Object{cm, crs}, nil
}

// ApplyCluster creates the namespace, the CNI objects and the rendered
// cluster, leaving objects that exist as they are.
func ApplyCluster(ctx context.Context, c client.Client, cni []client.Object, cluster []*unstructured.Unstructured) error {
	objs := append([]client.Object{}, cni...)
	for _, u := range cluster {
		objs = append(objs, u)
	}
	return ApplyDemo(ctx, c, objs)
}

// FieldManager is the field manager of what ApplyClusterServerSide applies.
const FieldManager = "capl-dev"

// ApplyClusterServerSide applies the namespace, the CNI objects and the
// rendered cluster server-side as FieldManager, taking over fields other
// managers set: a second run with other replicas or variables converges
// the objects to them (a `kubectl scale` in between is undone), where
// ApplyCluster leaves existing objects as they are. What the webhooks
// refuse to change (a LibvirtMachineTemplate's spec, a cluster's network)
// fails with their message.
func ApplyClusterServerSide(ctx context.Context, c client.Client, cni []client.Object, cluster []*unstructured.Unstructured) error {
	var objs []*unstructured.Unstructured
	namespaces := map[string]bool{}
	for _, obj := range cni {
		u, err := toUnstructured(c, obj)
		if err != nil {
			return err
		}
		objs = append(objs, u)
	}
	objs = append(objs, cluster...)
	for _, u := range objs {
		if ns := u.GetNamespace(); ns != "" && !namespaces[ns] {
			namespaces[ns] = true
			n := &unstructured.Unstructured{}
			n.SetAPIVersion("v1")
			n.SetKind("Namespace")
			n.SetName(ns)
			if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(n), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
				return fmt.Errorf("applying namespace %s: %w", ns, err)
			}
		}
	}
	for _, u := range objs {
		u = u.DeepCopy()
		// Apply configurations carry no server-set fields.
		unstructured.RemoveNestedField(u.Object, "status")
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		u.SetResourceVersion("")
		u.SetManagedFields(nil)
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
	return nil
}

// toUnstructured converts a typed object with its kind from c's scheme.
func toUnstructured(c client.Client, obj client.Object) (*unstructured.Unstructured, error) {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return nil, err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// ClusterExists tells whether cluster namespace/name exists, so that a
// second run applies it as it is (no workers staged behind the control
// plane: they exist already, and a staged MachineDeployment of 0 would
// scale them away).
func ClusterExists(ctx context.Context, c client.Client, namespace, name string) (bool, error) {
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &clusterv1.Cluster{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// TCGTuning is what ClusterOptions change for a host without usable KVM:
// a large translation cache, 1-vCPU workers (a 2-core host keeps a core
// for the control plane), workers staged after the control plane, a
// leader election (none for one control-plane machine) and static pod
// probes that survive an API server answering in tens of seconds and
// probe it less often, node heartbeats allowed to come late, and an etcd
// that does not wait for the disk. Set ControlPlane first. CPU weights
// stay the host's: weighted 4:1 the control plane kept more CPU
// while a worker joined, but `make up` took 24m43s instead of 14m34s.
func (o ClusterOptions) TCGTuning() ClusterOptions {
	o.TCGCacheMiB = NodeTCGCacheMiB
	o.WorkerCPUs = 1
	o.StagedWorkers = true
	o.LeaderElectLease, o.LeaderElectRenew = "180s", "150s"
	if o.ControlPlane == 1 {
		// A renewal that misses its deadline restarts the component even
		// with nobody to hand over to; one control plane needs no election.
		o.LeaderElect = "false"
	}
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
	return o
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

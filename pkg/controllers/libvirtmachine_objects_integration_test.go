package controllers_test

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// createCluster creates a Cluster and its LibvirtCluster on the test pool;
// when provisioned, it plays the (not yet written) LibvirtCluster
// controller: status.network and initialization.provisioned are set through
// the status subresource, and the test waits for Cluster API to see them.
func (h *harness) createCluster(name string, provisioned bool) {
	h.t.Helper()
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name,
		Labels: map[string]string{clusterv1.ClusterNameLabel: name},
		// The test plays the cluster's infrastructure manager, so the
		// LibvirtCluster controller leaves it alone.
		Annotations: map[string]string{clusterv1.ManagedByAnnotation: "capl-machine-test"}}}
	lc.Spec.StoragePool = infrav1.StoragePool{Name: h.pool, Path: h.poolPath}
	must(h.t, h.c.Create(h.ctx, lc))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}
	cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtCluster", Name: name}
	must(h.t, h.c.Create(h.ctx, cluster))
	if provisioned {
		h.provisionCluster(name)
	}
}

func (h *harness) provisionCluster(name string) {
	h.t.Helper()
	lc := &infrav1.LibvirtCluster{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, lc))
	lc.Status.Network = &infrav1.NetworkStatus{Name: h.network.Name, Bridge: h.network.Bridge, CIDR: h.network.CIDR.String(), Managed: true}
	lc.Status.Initialization.Provisioned = ptr.To(true)
	lc.Status.Ready = true
	must(h.t, h.c.Status().Update(h.ctx, lc))
	h.waitFor("Cluster "+name+" infrastructure provisioned", time.Minute, func() (bool, string) {
		c := &clusterv1.Cluster{}
		if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, c); err != nil {
			return false, err.Error()
		}
		return ptr.Deref(c.Status.Initialization.InfrastructureProvisioned, false), "not yet"
	})
}

func (h *harness) setClusterPaused(name string, paused bool) {
	h.t.Helper()
	c := &clusterv1.Cluster{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, c))
	patch := client.MergeFrom(c.DeepCopy())
	c.Spec.Paused = ptr.To(paused)
	must(h.t, h.c.Patch(h.ctx, c, patch))
}

// machineOpts shape a test machine.
type machineOpts struct {
	cluster string
	// userData, when set, goes into the bootstrap Secret.
	userData string
	// format of the Secret; empty means cloud-config.
	format string
	// withData sets Machine.spec.bootstrap.dataSecretName at creation.
	withData bool
	// image overrides the default (the test image imported by URL).
	image         *infrav1.ImageSource
	failureDomain string
	// memoryMiB overrides the default 512.
	memoryMiB int32
	// dataDisks and hostDevices are the LibvirtMachine's.
	dataDisks   []infrav1.DataDisk
	hostDevices []infrav1.HostDevice
	// network is the LibvirtMachine's.
	network *infrav1.NetworkAttachment
	// annotations and finalizers go onto the LibvirtMachine as it is
	// created.
	annotations map[string]string
	finalizers  []string
}

// bootUserData makes cloud-init write the Node-identity file from the
// rendered instance-id (as a kubelet provider-id template would) and the
// Cluster API bootstrap sentinel.
func bootUserData() string {
	return `## template: jinja
#cloud-config
# ` + secretMarker + `
write_files:
- path: /run/capl-test/provider-id
  content: "libvirt:///{{ ds.meta_data.instance_id }}"
runcmd:
- [sh, -c, "mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete"]
`
}

// createMachine creates the bootstrap Secret, the LibvirtMachine and the
// Machine, as a MachineDeployment and a bootstrap provider would.
func (h *harness) createMachine(name string, o machineOpts) {
	h.t.Helper()
	labels := map[string]string{clusterv1.ClusterNameLabel: o.cluster}
	if o.userData == "" {
		o.userData = "#cloud-config\n# " + secretMarker + "\n"
	}
	format := o.format
	if format == "" {
		format = "cloud-config"
	}
	must(h.t, h.c.Create(h.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name + "-bootstrap", Labels: labels},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"value": []byte(o.userData), "format": []byte(format)},
	}))
	lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name, Labels: labels, Annotations: o.annotations, Finalizers: o.finalizers}}
	lm.Spec.Image = infrav1.ImageSource{URL: "file://" + h.image, Checksum: "sha256:" + h.imageSum}
	if o.image != nil {
		lm.Spec.Image = *o.image
	}
	lm.Spec.VirtualHardware = tcgHardware()
	if o.memoryMiB != 0 {
		lm.Spec.MemoryMiB = o.memoryMiB
	}
	lm.Spec.DiskSizeGiB = 4
	lm.Spec.DataDisks = o.dataDisks
	lm.Spec.HostDevices = o.hostDevices
	lm.Spec.Network = o.network
	must(h.t, h.c.Create(h.ctx, lm))

	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name, Labels: labels}}
	m.Spec.ClusterName = o.cluster
	m.Spec.FailureDomain = o.failureDomain
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachine", Name: name}
	if o.withData {
		m.Spec.Bootstrap.DataSecretName = ptr.To(name + "-bootstrap")
	}
	// No bootstrap provider runs: a Machine without data gets an empty
	// bootstrap (the typed client would drop it), and the test sets
	// dataSecretName later, as a bootstrap provider would.
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(m)
	must(h.t, err)
	obj := &unstructured.Unstructured{Object: u}
	obj.SetGroupVersionKind(clusterv1.GroupVersion.WithKind("Machine"))
	if !o.withData {
		must(h.t, unstructured.SetNestedMap(obj.Object, map[string]any{}, "spec", "bootstrap"))
	}
	must(h.t, h.c.Create(h.ctx, obj))
}

// setBootstrapData plays the bootstrap provider.
func (h *harness) setBootstrapData(name string) {
	h.t.Helper()
	m := h.machine(name)
	patch := client.MergeFrom(m.DeepCopy())
	m.Spec.Bootstrap.DataSecretName = ptr.To(name + "-bootstrap")
	must(h.t, h.c.Patch(h.ctx, m, patch))
}

func (h *harness) machine(name string) *clusterv1.Machine {
	h.t.Helper()
	m := &clusterv1.Machine{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, m))
	return m
}

func (h *harness) lm(name string) *infrav1.LibvirtMachine {
	h.t.Helper()
	lm := &infrav1.LibvirtMachine{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, lm))
	return lm
}

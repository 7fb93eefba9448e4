package webhooks

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// TestReferencesOnUpdate: an update is refused for a reference it
// introduces, but not for one the object already had (refused only since
// the operator changed the policy), so that such objects can still be
// finished and deleted.
func TestReferencesOnUpdate(t *testing.T) {
	ctx := context.Background()
	policy := defaultPolicy
	cw := &LibvirtCluster{refs: references{policy: &policy}}
	old := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "prod"}}
	old.Spec.StoragePool = infrav1.StoragePool{Name: "old", Path: "/srv/old"} // stored under another policy
	DefaultClusterSpec(&old.Spec)
	finalized := old.DeepCopy()
	finalized.Finalizers = []string{infrav1.ClusterFinalizer}
	_, err := cw.ValidateUpdate(ctx, old, finalized)
	checkFields(t, "unrelated update", err, nil)
	moved := old.DeepCopy()
	moved.Spec.StoragePool.Path = "/etc/old"
	_, err = cw.ValidateUpdate(ctx, old, moved)
	checkFields(t, "pool moved to /etc", err, []string{"spec.storagePool.path"})

	mw := &LibvirtMachine{refs: references{policy: &policy}}
	oldM := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "cp-0"}}
	oldM.Spec.Image = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: importedImg}}
	DefaultMachineSpec(&oldM.Spec)
	forged := oldM.DeepCopy()
	forged.Annotations = map[string]string{scope.NetworkAnnotation: "network:" + networkA}
	_, err = mw.ValidateUpdate(ctx, oldM, forged)
	checkFields(t, "network annotation forged on update", err, []string{"metadata.annotations" + networkKey})
	recorded := oldM.DeepCopy()
	recorded.Annotations = map[string]string{scope.NetworkAnnotation: "network:" + ownNetwork, scope.PoolAnnotation: "capi-libvirt"}
	_, err = mw.ValidateUpdate(ctx, oldM, recorded)
	checkFields(t, "the provider recording its placement", err, nil)

	// Once recorded, the placement is where deletion looks: no edit, even
	// to another allowed pool or network, and no removal.
	repointed := recorded.DeepCopy()
	repointed.Annotations[scope.PoolAnnotation] = "images"
	_, err = mw.ValidateUpdate(ctx, recorded, repointed)
	checkFields(t, "recorded pool changed before a delete", err, []string{"metadata.annotations" + poolKey})
	stripped := recorded.DeepCopy()
	stripped.Annotations = nil
	_, err = mw.ValidateUpdate(ctx, recorded, stripped)
	checkFields(t, "recorded placement removed", err, []string{"metadata.annotations" + poolKey, "metadata.annotations" + networkKey})
	recordedC := old.DeepCopy()
	recordedC.Annotations = map[string]string{scope.PoolAnnotation: "old"}
	repointedC := recordedC.DeepCopy()
	repointedC.Annotations[scope.PoolAnnotation] = "capi-libvirt"
	_, err = cw.ValidateUpdate(ctx, recordedC, repointedC)
	checkFields(t, "cluster's recorded pool changed", err, []string{"metadata.annotations" + poolKey})
}

// TestMachineDataDiskReferences: a data disk's pool must be one the
// operator allows, and the data disks count with the root disk against
// --max-machine-disk; a template is judged the same.
func TestMachineDataDiskReferences(t *testing.T) {
	capped := strictPolicy
	capped.Machine = tenancy.Limits{DiskGiB: 50}
	for _, tc := range []struct {
		name   string
		policy tenancy.Policy
		disks  []infrav1.DataDisk
		want   []string
	}{
		{"in the machine's pool", strictPolicy, []infrav1.DataDisk{{Name: "etcd", SizeGiB: 10}}, nil},
		{"in an allowed pool", strictPolicy, []infrav1.DataDisk{{Name: "etcd", SizeGiB: 10, Pool: "tenants"}}, nil},
		{"in a pool not allowed", strictPolicy, []infrav1.DataDisk{{Name: "etcd", SizeGiB: 10}, {Name: "data", SizeGiB: 1, Pool: "default"}},
			[]string{"spec.dataDisks[1].pool"}},
		{"root and data disks within the largest disk", capped, []infrav1.DataDisk{{Name: "etcd", SizeGiB: 30}}, nil},
		{"root and data disks beyond it", capped, []infrav1.DataDisk{{Name: "etcd", SizeGiB: 20}, {Name: "data", SizeGiB: 11}},
			[]string{"spec.diskSizeGiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkMachineAndTemplate(t, tc.policy, func(s *infrav1.LibvirtMachineSpec) { s.DataDisks = tc.disks }, tc.want)
		})
	}
}

// TestMachineHostDeviceReferences: a machine (and a template) names host
// devices by the operator's aliases only; an alias the operator did not
// list, or a raw PCI address, is refused at its index.
func TestMachineHostDeviceReferences(t *testing.T) {
	devices, err := tenancy.ParseHostDevices([]string{"gpu0=0000:65:00.0/nvidia.com/gpu", "nic0=0000:17:00.1"})
	must(t, err)
	withDevices := strictPolicy
	withDevices.HostDevices = devices
	for _, tc := range []struct {
		name    string
		policy  tenancy.Policy
		devices []infrav1.HostDevice
		want    []string
	}{
		{"allowed aliases", withDevices, []infrav1.HostDevice{{Name: "gpu0"}, {Name: "nic0"}}, nil},
		{"an alias not listed", withDevices, []infrav1.HostDevice{{Name: "gpu0"}, {Name: "gpu1"}}, []string{"spec.hostDevices[1].name"}},
		{"a raw address", withDevices, []infrav1.HostDevice{{Name: "0000:65:00.0"}}, []string{"spec.hostDevices[0].name"}},
		{"none allowed", strictPolicy, []infrav1.HostDevice{{Name: "gpu0"}}, []string{"spec.hostDevices[0].name"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkMachineAndTemplate(t, tc.policy, func(s *infrav1.LibvirtMachineSpec) { s.HostDevices = tc.devices }, tc.want)
		})
	}
}

// checkMachineAndTemplate creates a LibvirtMachine whose spec set makes,
// and a LibvirtMachineTemplate of that spec, under policy: each is refused
// at the paths want lists (a template's below spec.template), or not.
func checkMachineAndTemplate(t *testing.T, policy tenancy.Policy, set func(*infrav1.LibvirtMachineSpec), want []string) {
	t.Helper()
	ctx := context.Background()
	m := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "m-0"}}
	m.Spec.Image = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: importedImg}}
	set(&m.Spec)
	w := &LibvirtMachine{refs: references{policy: &policy}}
	must(t, w.Default(ctx, m))
	_, err := w.ValidateCreate(ctx, m)
	checkFields(t, "LibvirtMachine", err, want)

	tmpl := &infrav1.LibvirtMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "m"}}
	tmpl.Spec.Template.Spec = m.Spec
	_, err = (&LibvirtMachineTemplate{refs: references{policy: &policy}}).ValidateCreate(ctx, tmpl)
	checkFields(t, "LibvirtMachineTemplate", err, templatePaths(want))
}

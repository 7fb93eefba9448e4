package datadisk_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/datadisk"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestDataDisksAttachedBySerial: each data disk becomes an empty qcow2
// volume of its size, in its own pool or the machine's, attached to the
// domain in order with its name as serial; deletion removes them all.
func TestDataDisksAttachedBySerial(t *testing.T) {
	f := servicetest.NewFixture(t)
	f.LM.Spec.DataDisks = []infrav1.DataDisk{{Name: "etcd", SizeGiB: 5}, {Name: "longhorn", SizeGiB: 50, Pool: "fast"}}
	f.Host.Pools["fast"] = virt.PoolSpec{Name: "fast"}
	s, p := servicetest.Provision(t, f)
	if err := servicetest.Reconcile(s, infrav1.DiskReadyCondition, p.DataDisks); err != nil {
		t.Fatal(err)
	}
	domainName := naming.DomainName("ns", "m0")
	want := map[string]uint64{"pool/" + naming.DataDiskVolumeName(domainName, "etcd"): 5 << 30, "fast/" + naming.DataDiskVolumeName(domainName, "longhorn"): 50 << 30}
	for key, size := range want {
		if v, ok := f.Host.Volumes[key]; !ok || v.CapacityBytes != size || v.Format != virt.FormatQCOW2 {
			t.Errorf("volume %s = %+v (exists %v), want an empty qcow2 of %d bytes", key, v, ok, size)
		}
	}
	if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain); err != nil {
		t.Fatal(err)
	}
	got := f.Host.Specs[domainName].DataDisks
	if len(got) != 2 || got[0].Serial != "etcd" || got[1].Serial != "longhorn" || got[1].Path != "/pools/fast/"+naming.DataDiskVolumeName(domainName, "longhorn") {
		t.Errorf("domain's data disks %+v, want etcd then longhorn by their volumes' paths", got)
	}

	// Deleted in any later reconcile, from the spec alone.
	if err := datadisk.New(f.Scope().VM, s.Host).Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	for key := range want {
		if _, ok := f.Host.Volumes[key]; ok {
			t.Errorf("volume %s outlived the machine", key)
		}
	}
}

// TestDataDiskFailuresBecomeReasons: what stops a data disk is said on
// DiskReady, and the domain is not defined without it.
func TestDataDiskFailuresBecomeReasons(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(*servicetest.Fixture)
		reason string
	}{
		{"pool missing", func(f *servicetest.Fixture) {
			f.LM.Spec.DataDisks = []infrav1.DataDisk{{Name: "d", SizeGiB: 1, Pool: "nope"}}
		}, infrav1.StoragePoolNotFoundReason},
		{"pool full", func(f *servicetest.Fixture) {
			f.LM.Spec.DataDisks = []infrav1.DataDisk{{Name: "d", SizeGiB: 1}}
			f.Host.Errs["EnsureDataVolume"] = fmt.Errorf("%w: no space left on device", virt.ErrPoolFull)
		}, infrav1.PoolFullReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			tc.setup(f)
			s, p := servicetest.Provision(t, f)
			err := servicetest.Reconcile(s, infrav1.DiskReadyCondition, p.DataDisks)
			if _, ok := services.AsRequeue(err); !ok {
				t.Fatalf("err = %v, want a requeue", err)
			}
			servicetest.WantCondition(t, f.LM, infrav1.DiskReadyCondition, metav1.ConditionFalse, tc.reason)
			if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain); !errors.Is(err, domain.ErrVolumesUnknown) {
				t.Errorf("domain step without its data disks = %v, want the volumes unknown", err)
			}
			if len(f.Host.Domains) != 0 {
				t.Error("a domain was defined without its data disks")
			}
		})
	}
}

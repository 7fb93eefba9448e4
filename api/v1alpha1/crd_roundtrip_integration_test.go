package v1alpha1_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func objectMeta(kind string, i int) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: fmt.Sprintf("roundtrip-%s-%d", kind, i), Namespace: namespace,
		Labels: map[string]string{"app": "roundtrip"}, Annotations: map[string]string{"note": "roundtrip"}}
}

// roundTrip creates a copy of obj, writes its status through the status
// subresource when the kind has one, and reads the object back into into.
func roundTrip(ctx context.Context, t *testing.T, obj, into client.Object, hasStatus bool) {
	t.Helper()
	sent := obj.DeepCopyObject().(client.Object)
	if err := env.Client.Create(ctx, sent); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sent) })
	if hasStatus {
		// Create ignores status; copy it onto what the server returned.
		withStatus := obj.DeepCopyObject().(client.Object)
		withStatus.SetResourceVersion(sent.GetResourceVersion())
		if err := env.Client.Status().Update(ctx, withStatus); err != nil {
			t.Fatalf("status update %T %s: %v", obj, obj.GetName(), err)
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), into); err != nil {
		t.Fatalf("get %T %s: %v", obj, obj.GetName(), err)
	}
}

// normalize clears what the API server sets, so that the object sent and
// the object read back compare equal when nothing was lost.
func normalize(obj client.Object) {
	obj.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
	obj.SetUID("")
	obj.SetResourceVersion("")
	obj.SetGeneration(0)
	obj.SetCreationTimestamp(metav1.Time{})
	obj.SetManagedFields(nil)
}

// roundTripCoverage returns the fields of the objects' spec and status
// (JSON paths, "[]" for list elements) that no object sets to a non-zero
// value, leaving out exempt ones.
func roundTripCoverage(objs []client.Object, exempt []string) []string {
	set := map[string]bool{}
	all := map[string]bool{}
	for _, o := range objs {
		v := reflect.ValueOf(o).Elem()
		for _, f := range []string{"Spec", "Status"} {
			if fv := v.FieldByName(f); fv.IsValid() {
				name := strings.ToLower(f)
				leafPaths(fv.Type(), name, all)
				setPaths(fv, name, set)
			}
		}
	}
	var missing []string
	for p := range all {
		if !set[p] && !slices.Contains(exempt, p) {
			missing = append(missing, p)
		}
	}
	slices.Sort(missing)
	return missing
}

var timeType = reflect.TypeOf(metav1.Time{})

// jsonName is the JSON name of a struct field; "" for an inlined one.
func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "" && !f.Anonymous {
		return f.Name
	}
	return name
}

func join(path, name string) string {
	if name == "" {
		return path
	}
	return path + "." + name
}

// leafPaths adds every leaf field path of t under path to out.
func leafPaths(t reflect.Type, path string, out map[string]bool) {
	switch {
	case t == timeType:
		out[path] = true
	case t.Kind() == reflect.Pointer:
		leafPaths(t.Elem(), path, out)
	case t.Kind() == reflect.Slice:
		leafPaths(t.Elem(), path+"[]", out)
	case t.Kind() == reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); f.IsExported() {
				leafPaths(f.Type, join(path, jsonName(f)), out)
			}
		}
	default: // scalars and maps
		out[path] = true
	}
}

// setPaths adds the leaf field paths under path that v sets to a non-zero
// value to out.
func setPaths(v reflect.Value, path string, out map[string]bool) {
	switch {
	case v.Type() == timeType:
		if !v.IsZero() {
			out[path] = true
		}
	case v.Kind() == reflect.Pointer:
		if !v.IsNil() {
			setPaths(v.Elem(), path, out)
		}
	case v.Kind() == reflect.Slice:
		for i := range v.Len() {
			setPaths(v.Index(i), path+"[]", out)
		}
	case v.Kind() == reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				setPaths(v.Field(i), join(path, jsonName(f)), out)
			}
		}
	default:
		if !v.IsZero() {
			out[path] = true
		}
	}
}

const validChecksum = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func validMachine(name string) *infrav1.LibvirtMachine {
	return &infrav1.LibvirtMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: infrav1.LibvirtMachineSpec{
			Image: infrav1.ImageSource{URL: "https://images.example/debian-12.qcow2", Checksum: validChecksum},
			VirtualHardware: infrav1.VirtualHardware{
				CPUs: 2, MemoryMiB: 1024, DomainType: infrav1.DomainTypeQEMU, CPUMode: infrav1.CPUModeMaximum,
				TCGTranslationCacheMiB: 128,
				CPUShares:              2048,
			},
			DiskSizeGiB: 20,
			Network:     &infrav1.NetworkAttachment{Bridge: "br0"},
		},
	}
}

func validCluster(name string) *infrav1.LibvirtCluster {
	return &infrav1.LibvirtCluster{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: infrav1.LibvirtClusterSpec{
			Network: infrav1.ClusterNetwork{CIDR: "192.168.150.0/24"},
			LoadBalancer: infrav1.LoadBalancer{
				Type:            infrav1.LoadBalancerHAProxy,
				Image:           &infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "capl-debian-12-haproxy.qcow2"}},
				VirtualHardware: infrav1.VirtualHardware{CPUs: 1, MemoryMiB: 512},
			},
			StoragePool:    infrav1.StoragePool{Name: "capi-libvirt", Path: "/var/lib/libvirt/capi-libvirt"},
			FailureDomains: []infrav1.FailureDomainSpec{{Name: "host-a", ControlPlane: ptr.To(true)}},
		},
	}
}

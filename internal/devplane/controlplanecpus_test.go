package devplane

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestSetOneCPUControlPlane: the control plane's kubeadm init and join
// both skip the NumCPU check once, in a plain template's
// KubeadmControlPlane and a ClusterClass's KubeadmControlPlaneTemplate,
// keeping the checks already skipped; objects without either are refused.
func TestSetOneCPUControlPlane(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kind    string
		spec    []string
		ignored []string
		want    []string
		wantErr string
	}{
		{name: "KubeadmControlPlane", kind: "KubeadmControlPlane", spec: []string{"spec", "kubeadmConfigSpec"}, want: []string{"NumCPU"}},
		{name: "template with checks skipped", kind: "KubeadmControlPlaneTemplate", spec: []string{"spec", "template", "spec", "kubeadmConfigSpec"},
			ignored: []string{"Mem"}, want: []string{"Mem", "NumCPU"}},
		{name: "already skipped", kind: "KubeadmControlPlane", spec: []string{"spec", "kubeadmConfigSpec"}, ignored: []string{"NumCPU"}, want: []string{"NumCPU"}},
		{name: "no control plane", kind: "MachineDeployment", spec: []string{"spec"}, wantErr: "needs a KubeadmControlPlane"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{}}
			u.SetKind(tc.kind)
			u.SetName("k8s")
			for _, configuration := range []string{"initConfiguration", "joinConfiguration"} {
				path := append(slices.Clone(tc.spec), configuration, "nodeRegistration", "ignorePreflightErrors")
				if err := unstructured.SetNestedStringSlice(u.Object, tc.ignored, path...); err != nil {
					t.Fatal(err)
				}
			}
			err := setOneCPUControlPlane([]*unstructured.Unstructured{u})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("setOneCPUControlPlane: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, configuration := range []string{"initConfiguration", "joinConfiguration"} {
				path := append(slices.Clone(tc.spec), configuration, "nodeRegistration", "ignorePreflightErrors")
				if got, _, _ := unstructured.NestedStringSlice(u.Object, path...); !slices.Equal(got, tc.want) {
					t.Errorf("%s ignores %q, want %q", configuration, got, tc.want)
				}
			}
		})
	}
}

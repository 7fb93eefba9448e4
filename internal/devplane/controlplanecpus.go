package devplane

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// numCPUPreflightCheck is kubeadm's preflight check that a control-plane
// node has at least 2 CPUs.
const numCPUPreflightCheck = "NumCPU"

// kubeadmConfigSpecPaths are where a control plane's kubeadm configuration
// sits in the objects of a plain template and of a ClusterClass.
var kubeadmConfigSpecPaths = map[string][]string{
	"KubeadmControlPlane":         {"spec", "kubeadmConfigSpec"},
	"KubeadmControlPlaneTemplate": {"spec", "template", "spec", "kubeadmConfigSpec"},
}

// setOneCPUControlPlane lets kubeadm init and join a control-plane machine
// of one vCPU: it adds numCPUPreflightCheck to both their ignored preflight
// errors. Under TCG on 2 host cores one vCPU caps a control plane at one
// core, leaving the other to a machine that joins beside it; measured, it
// shortened a control-plane rollout by 13 % and doubled `make up`, so it
// is an option, not the profile's default (docs/tcg.md). It is not a
// template variable: an empty list entry is not a valid preflight check
// name.
func setOneCPUControlPlane(objs []*unstructured.Unstructured) error {
	patched := 0
	for _, u := range objs {
		spec, ok := kubeadmConfigSpecPaths[u.GetKind()]
		if !ok {
			continue
		}
		for _, configuration := range []string{"initConfiguration", "joinConfiguration"} {
			path := append(slices.Clone(spec), configuration, "nodeRegistration", "ignorePreflightErrors")
			ignored, _, err := unstructured.NestedStringSlice(u.Object, path...)
			if err != nil {
				return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
			}
			if slices.Contains(ignored, numCPUPreflightCheck) {
				continue
			}
			if err := unstructured.SetNestedStringSlice(u.Object, append(ignored, numCPUPreflightCheck), path...); err != nil {
				return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
			}
		}
		patched++
	}
	if patched == 0 {
		return fmt.Errorf("a control plane of one vCPU needs a KubeadmControlPlane or a KubeadmControlPlaneTemplate in the template")
	}
	return nil
}

//go:build e2e

package e2e

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// checkInjectedWebhooks checks that every provider's webhook
// configuration carries a CA bundle, the one cert-manager's cainjector put
// there from the provider's serving certificate, and that the API server
// calls this provider's webhook through it: a LibvirtMachine too large for
// the operator's caps is refused by the webhook itself.
func (s *suite) checkInjectedWebhooks(t *testing.T) {
	wc := s.k8s.wc
	vwcs := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	s.workloadCall(t, "listing validating webhook configurations", func() error { return wc.List(s.ctx, vwcs) })
	var seen []string
	for _, v := range vwcs.Items {
		if v.Annotations["cert-manager.io/inject-ca-from"] == "" {
			continue
		}
		seen = append(seen, v.Name)
		for _, w := range v.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				t.Errorf("webhook %s of %s has no CA bundle: cert-manager's cainjector did not inject %s", w.Name, v.Name, v.Annotations["cert-manager.io/inject-ca-from"])
			}
		}
	}
	slices.Sort(seen)
	t.Logf("validating webhook configurations injected by cert-manager: %v", seen)
	if !slices.Contains(seen, "capl-validating-webhook-configuration") {
		t.Errorf("no validating webhook configuration of this provider among %v", seen)
	}

	huge := &unstructured.Unstructured{}
	huge.SetAPIVersion(infrav1.GroupVersion.String())
	huge.SetKind("LibvirtMachine")
	huge.SetNamespace("default")
	huge.SetName("capl-webhook-probe")
	huge.Object["spec"] = map[string]any{"cpus": int64(512), "memoryMiB": int64(1024), "image": map[string]any{"volume": map[string]any{"pool": "p", "name": "v"}}}
	var refusal error
	s.workloadCall(t, "creating a LibvirtMachine of 512 vCPUs (dry run)", func() error {
		refusal = wc.Create(s.ctx, huge, client.DryRunAll)
		if refusal == nil || !strings.Contains(refusal.Error(), "denied the request") {
			return fmt.Errorf("want the webhook's refusal, got %v", refusal)
		}
		return nil
	})
	t.Logf("the provider's webhook, called by the workload API server with cert-manager's CA: %v", refusal)
}

// checkManagerReachesLibvirt checks that the manager in the cluster runs
// without restarts and that the plane's libvirt endpoint relayed its
// connection: the endpoint logs each client it let in.
func (s *suite) checkManagerReachesLibvirt(t *testing.T, uri string) {
	wc := s.k8s.wc
	pods := &corev1.PodList{}
	s.workloadCall(t, "listing the provider's pods", func() error { return wc.List(s.ctx, pods, client.InNamespace("capl-system")) })
	var node string
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount > 0 || !c.Ready {
				t.Errorf("pod %s: container %s ready %v after %d restarts (%+v)", p.Name, c.Name, c.Ready, c.RestartCount, c.LastTerminationState)
			}
		}
		node = p.Spec.NodeName
	}
	if node == "" {
		t.Fatalf("no pod of the provider in capl-system")
	}
	log, err := os.ReadFile(filepath.Join(s.state, "serve.log"))
	must(t, err)
	var connected []string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "libvirt-tls: ") && strings.HasSuffix(line, "(capl-manager) connected") {
			connected = append(connected, line)
		}
	}
	if len(connected) == 0 {
		t.Fatalf("the plane's libvirt endpoint let no manager in (%s), yet the provider's pod on %s is ready", uri, node)
	}
	t.Logf("the provider's manager on %s reaches libvirt at %s: %s", node, uri, connected[len(connected)-1])
}

// deploymentAvailable tells whether d's Available condition is True.
func deploymentAvailable(d *appsv1.Deployment) bool {
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// createCRDsOneByOne creates, before clusterctl init does, the CRDs of every
// components file of the local repository but cert-manager's, one at a
// time, each Established before the next; clusterctl then finds them
// and only adds its labels. A CRD costs an API server a burst of work
// (its schema's OpenAPI, its validation rules, a storage, every client's
// discovery); under TCG, clusterctl's dozens at once left the cluster's
// one control plane unanswering for ten minutes on a 2-core host
// (2026-11-27) until its liveness probe restarted it.
func (s *suite) createCRDsOneByOne(t *testing.T, repository string) {
	// Not cert-manager's: clusterctl tells whether cert-manager is
	// installed by creating its test Issuer and Certificate, which its
	// CRDs alone accept; it then installs no cert-manager, and every
	// provider waits for a serving certificate no one issues (2026-11-28:
	// the providers' pods ContainerCreating for 11 minutes, "secret
	// capl-webhook-service-cert not found"). clusterctl creates its six.
	var files []string
	must(t, filepath.WalkDir(repository, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || strings.HasPrefix(d.Name(), "cluster-template") || d.Name() == "metadata.yaml":
		case strings.Contains(path, "cert-manager"):
		default:
			files = append(files, path)
		}
		return err
	}))
	var crds []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		must(t, err)
		objs, err := plane.DecodeYAML(data)
		must(t, err)
		for _, o := range objs {
			if o.GetKind() == "CustomResourceDefinition" {
				crds = append(crds, o)
			}
		}
	}
	if len(crds) == 0 {
		t.Fatalf("no CustomResourceDefinition in %v", files)
	}
	defer s.rep.phase(fmt.Sprintf("self-hosted: the providers' %d CRDs created one at a time, each Established before the next", len(crds)))()
	wc := s.k8s.wc
	patient, err := s.clientOf(s.selfHost.kubeconfig, crdCreateTimeout)
	must(t, err)
	for _, crd := range crds {
		start := time.Now()
		s.workloadCall(t, "creating CRD "+crd.GetName(), func() error { return client.IgnoreAlreadyExists(patient.Create(s.ctx, crd.DeepCopy())) })
		s.waitWorkload(t, "CRD "+crd.GetName()+" Established", 10*time.Minute, func() (bool, string) {
			// Unstructured: the workload client's scheme is client-go's.
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(crd.GroupVersionKind())
			if err := wc.Get(s.ctx, client.ObjectKey{Name: crd.GetName()}, got); err != nil {
				return false, err.Error()
			}
			conditions, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conditions {
				if c, ok := c.(map[string]any); ok && c["type"] == string(apiextensionsv1.Established) {
					return c["status"] == string(apiextensionsv1.ConditionTrue), fmt.Sprint(c["message"])
				}
			}
			return false, "no Established condition yet"
		})
		t.Logf("CRD %s Established in %s", crd.GetName(), time.Since(start).Round(time.Second))
	}
}

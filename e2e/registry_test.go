//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/registry"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// envManagerImage is the OCI image layout of `make image` (its oci/
// directory), which `make test-e2e` builds and passes.
const envManagerImage = "CAPL_TEST_MANAGER_IMAGE_DIR"

// managerImageFromRegistry pushes the manager image of `make image` into
// the plane's registry and runs it on the worker as a Pod, `/manager
// --help`, pulled (ImagePullPolicy Always) by the node's containerd
// through its mirror of every registry, the plane's registry at its
// gateway (images/node: capl-registry-mirror). The image's name is its
// release name (ghcr.io/…), which no guest could reach otherwise.
//
// It runs alone: beside the fault rounds (whose machines boot next to the
// cluster's) the unpack in the worker's TCG guest left the 2-core CI
// host's control plane unanswering for more than 20 minutes (2026-11-27,
// in CI and here).
func (s *suite) managerImageFromRegistry(t *testing.T) {
	s.needReady(t)
	dir := os.Getenv(envManagerImage)
	if dir == "" {
		t.Fatalf("%s is unset: make test-e2e builds the manager image (make image) and passes its oci/ directory", envManagerImage)
	}
	if s.plane.Endpoints.RegistryURL == "" {
		t.Fatalf("the plane serves no registry: port %d is taken by another process (see %s)", registry.DefaultPort, filepath.Join(s.state, "serve.log"))
	}
	stop := s.rep.phase("registry: push the manager image into the plane's registry")
	refs, err := registry.PushLayout(s.ctx, s.plane.Endpoints.RegistryURL, dir)
	stop()
	must(t, err)
	image := refs[0]
	digest, err := layoutDigest(dir)
	must(t, err)

	wc := s.k8s.wc
	workers, worker := &corev1.NodeList{}, ""
	s.workloadCall(t, "listing the workload cluster's nodes", func() error { return wc.List(s.ctx, workers) })
	for _, n := range workers.Items {
		if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp {
			worker = n.Name
		}
	}
	if worker == "" {
		t.Fatalf("no worker among %v", nodeNames(workers))
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "capl-manager-help"},
		Spec: corev1.PodSpec{
			NodeName:      worker,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "manager", Image: image, ImagePullPolicy: corev1.PullAlways,
				Args: []string{"--help"},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
				},
			}},
		},
	}
	s.workloadCall(t, "creating Pod "+pod.Name, func() error { return client.IgnoreAlreadyExists(wc.Create(s.ctx, pod)) })
	defer s.rep.phase("registry: the manager image pulled through the node's mirror and run on the worker")()
	s.checkManagerPod(t, pod, image, digest, worker)
}

// checkManagerPod waits for the Pod of managerImageFromRegistry to exit 0
// and checks that it ran the pushed image through the worker's mirror.
func (s *suite) checkManagerPod(t *testing.T, pod *corev1.Pod, image, digest, worker string) {
	wc := s.k8s.wc
	s.waitWorkload(t, "the manager Pod to run and exit", 10*time.Minute, func() (bool, string) {
		if err := wc.Get(s.ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false, err.Error()
		}
		if pod.Status.Phase == corev1.PodFailed {
			t.Fatalf("Pod %s failed: %s", pod.Name, podStatusLine(pod))
		}
		return pod.Status.Phase == corev1.PodSucceeded, podStatusLine(pod)
	})
	cs := pod.Status.ContainerStatuses
	if len(cs) != 1 || !strings.HasSuffix(cs[0].ImageID, "@"+digest) {
		t.Fatalf("the Pod ran image %s, want the pushed %s@%s", podStatusLine(pod), image, digest)
	}

	// What the guest says: the mirror the unit wrote, and the usage the
	// manager printed.
	domain := s.domainOfNode(t, worker)
	var guests virt.GuestHost = s.host
	if s.k8s.guestHost != nil {
		guests = s.k8s.guestHost
	}
	hosts := s.guestOutput(t, guests, domain, "/bin/cat", "/etc/containerd/certs.d/_default/hosts.toml")
	if !strings.Contains(hosts, fmt.Sprintf(":%d\"]", registry.DefaultPort)) {
		t.Fatalf("the worker's containerd mirror is not the plane's registry:\n%s", hosts)
	}
	id := strings.TrimPrefix(cs[0].ContainerID, "containerd://")
	usage := s.guestOutput(t, guests, domain, "/usr/local/bin/crictl", "logs", id)
	if !strings.Contains(usage, "-libvirt-uri") {
		t.Fatalf("the manager's --help printed no --libvirt-uri:\n%s", usage)
	}
	t.Logf("%s (%s) pulled by %s through its mirror (%s) and run: exit 0, %d bytes of usage", image, digest, worker, strings.Join(strings.Fields(hosts), " "), len(usage))
	s.workloadCall(t, "deleting Pod "+pod.Name, func() error { return client.IgnoreNotFound(wc.Delete(s.ctx, pod)) })
}

// guestOutput runs a command in domain's guest and returns its stdout
// and stderr; the test fails when it does not exit 0.
func (s *suite) guestOutput(t *testing.T, guests virt.GuestHost, domain, path string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	res, err := guests.GuestExec(ctx, domain, path, args, nil)
	if err != nil {
		t.Fatalf("%s %v in %s: %v", path, args, domain, err)
	}
	out := string(res.Stdout) + string(res.Stderr)
	if res.ExitCode != 0 {
		t.Fatalf("%s %v in %s: exit %d: %s", path, args, domain, res.ExitCode, out)
	}
	return out
}

// podStatusLine is a Pod's phase and its container's state.
func podStatusLine(pod *corev1.Pod) string {
	line := string(pod.Status.Phase)
	for _, c := range pod.Status.ContainerStatuses {
		state, _ := json.Marshal(c.State)
		line += fmt.Sprintf(" %s image %s (%s) state %s", c.Name, c.Image, c.ImageID, state)
	}
	return line
}

// layoutDigest is the digest of the one image an OCI image layout holds.
func layoutDigest(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		return "", err
	}
	var index struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(b, &index); err != nil {
		return "", err
	}
	if len(index.Manifests) != 1 {
		return "", fmt.Errorf("%s holds %d images, want the manager's alone", dir, len(index.Manifests))
	}
	return index.Manifests[0].Digest, nil
}

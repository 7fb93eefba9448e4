//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// echoServer is a pod that answers any TCP connection on port 8080 with an
// HTTP response naming itself and the address cluster DNS gives it for the
// kubernetes Service: the pod reaches CoreDNS, and CoreDNS the API server,
// through Service addresses. It runs in the kube-proxy image, one of the
// images the node image carries (there is no registry), whose Debian base
// has perl.
const echoServer = `use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalPort => 8080, Listen => 16, ReuseAddr => 1) or die "listen: $!";
while (my $c = $s->accept) {
  my $l = <$c>;
  my $ip = gethostbyname("kubernetes.default.svc.cluster.local");
  my $a = $ip ? join(".", unpack("C4", $ip)) : "unresolved";
  print $c "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n$ENV{POD_NAME} $a\n";
  close $c
}`

// kubeadmService runs a pod on the worker and reaches it through a Service
// from the control-plane node: kube-proxy and the CNI carry traffic across
// nodes, and the pod resolves the kubernetes Service through cluster DNS.
// When no worker joined (workersFit) the pod runs on the control-plane
// node, which then reaches it through the Service on its own node.
func (s *suite) kubeadmService(t *testing.T) {
	s.needReady(t)
	phase := "kubeadm: pod on the worker reached through a Service from the control plane"
	if s.k8s.noWorkers {
		phase = "kubeadm: pod on the control-plane node (no worker) reached through a Service from it"
	}
	defer s.rep.phase(phase)()
	wc := s.k8s.wc
	nodes := &corev1.NodeList{}
	s.workloadCall(t, "listing the workload cluster's nodes", func() error { return wc.List(s.ctx, nodes) })
	var worker, cpNode string
	for _, n := range nodes.Items {
		if _, cp := n.Labels[controlPlaneRole]; cp {
			cpNode = n.Name
		} else {
			worker = n.Name
		}
	}
	if worker == "" && s.k8s.noWorkers {
		worker = cpNode
	}
	if worker == "" || cpNode == "" {
		t.Fatalf("want a control-plane node and a worker, nodes are %v", nodeNames(nodes))
	}
	labels := map[string]string{"app": "capl-echo"}
	image := "registry.k8s.io/kube-proxy:" + s.k8s.opts.KubernetesVersion
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "capl-echo"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{corev1.LabelHostname: worker},
					Containers: []corev1.Container{{
						Name: "echo", Image: image, ImagePullPolicy: corev1.PullNever,
						Command: []string{"perl", "-e", echoServer},
						Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
							FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
						Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
					}},
				},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "capl-echo"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	for _, obj := range []client.Object{dep, svc} {
		s.workloadCall(t, "creating "+obj.GetName(), func() error { return client.IgnoreAlreadyExists(wc.Create(s.ctx, obj)) })
	}
	var pod corev1.Pod
	s.waitWorkload(t, "echo pod Running on "+worker, 10*time.Minute, func() (bool, string) {
		pods := &corev1.PodList{}
		if err := wc.List(s.ctx, pods, client.InNamespace("default"), client.MatchingLabels(labels)); err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName == worker {
				pod = p
				return true, ""
			}
		}
		return false, podsLine(pods)
	})
	s.workloadCall(t, "reading Service "+svc.Name, func() error { return wc.Get(s.ctx, client.ObjectKeyFromObject(svc), svc) })
	apiService := &corev1.Service{}
	s.workloadCall(t, "reading Service kubernetes", func() error {
		return wc.Get(s.ctx, client.ObjectKey{Namespace: "default", Name: "kubernetes"}, apiService)
	})
	want := pod.Name + " " + apiService.Spec.ClusterIP
	url := fmt.Sprintf("http://%s/", svc.Spec.ClusterIP)
	cpDomain := s.domainOfNode(t, cpNode)
	var guests virt.GuestHost = s.host
	if s.k8s.guestHost != nil {
		guests = s.k8s.guestHost
	}
	var answer string
	s.waitWorkload(t, "the echo Service answering on the control-plane node", 5*time.Minute, func() (bool, string) {
		ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
		defer cancel()
		res, err := guests.GuestExec(ctx, cpDomain, "/usr/bin/curl", []string{"-sS", "-m", "10", url}, nil)
		if err != nil {
			return false, err.Error()
		}
		answer = strings.TrimSpace(string(res.Stdout))
		return res.ExitCode == 0 && answer == want, fmt.Sprintf("curl %s: exit %d, %q (want %q) %s", url, res.ExitCode, answer, want, strings.TrimSpace(string(res.Stderr)))
	})
	t.Logf("pod %s (%s on %s) answered through Service %s from %s, resolving the kubernetes Service to %s through cluster DNS",
		pod.Name, pod.Status.PodIP, worker, url, cpNode, apiService.Spec.ClusterIP)
}

// domainOfNode is the libvirt domain of the Machine whose Node is node.
func (s *suite) domainOfNode(t *testing.T, node string) string {
	t.Helper()
	machines := &clusterv1.MachineList{}
	must(t, s.c.List(s.ctx, machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: s.cut.name}))
	for _, m := range machines.Items {
		if m.Status.NodeRef.Name == node {
			lm := s.lm(m.Spec.InfrastructureRef.Name)
			if lm == nil {
				t.Fatalf("machine %s: LibvirtMachine %s is gone", m.Name, m.Spec.InfrastructureRef.Name)
			}
			return lm.Status.Domain.Name
		}
	}
	t.Fatalf("no Machine has node %s", node)
	return ""
}

func nodeNames(nodes *corev1.NodeList) []string {
	var out []string
	for _, n := range nodes.Items {
		out = append(out, n.Name)
	}
	return out
}

func podsLine(pods *corev1.PodList) string {
	var out []string
	for _, p := range pods.Items {
		out = append(out, fmt.Sprintf("%s %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName))
	}
	if len(out) == 0 {
		return "no pods yet"
	}
	return strings.Join(out, ", ")
}

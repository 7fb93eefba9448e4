package templates_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

const image = "ubuntu-2404-kube-v1.33.1.qcow2"

// flavors are the templates clusterctl offers, with the variables they
// need.
var flavors = map[string]map[string]string{
	"":         {"LIBVIRT_IMAGE_VOLUME": image},
	"topology": {"LIBVIRT_IMAGE_VOLUME": image},
	"kube-vip": {"LIBVIRT_IMAGE_VOLUME": image, "LIBVIRT_CONTROL_PLANE_ENDPOINT_HOST": "192.168.1.240"},
}

// clusterctlVariables are the variables clusterctl itself sets from its
// flags; every other variable of a template is the provider's.
var clusterctlVariables = []string{"CLUSTER_NAME", "NAMESPACE", "KUBERNETES_VERSION", "CONTROL_PLANE_MACHINE_COUNT", "WORKER_MACHINE_COUNT"}

// TestVariables checks that every template variable is clusterctl's own or
// prefixed LIBVIRT_, and that only the image (and kube-vip's address) are
// required.
func TestVariables(t *testing.T) {
	requireEnv(t)
	variable := regexp.MustCompile(`^\s+- ([A-Z0-9_]+)`)
	for flavor, vars := range flavors {
		t.Run("flavor="+flavor, func(t *testing.T) {
			args := []string{"generate", "cluster", "demo", "--infrastructure", "libvirt:" + releaseVersion, "--list-variables", "--target-namespace", "default"}
			if flavor != "" {
				args = append(args, "--flavor", flavor)
			}
			out := string(clusterctl(t, nil, args...))
			required, _, _ := strings.Cut(strings.TrimPrefix(out, "Required Variables:"), "Optional Variables:")
			for _, line := range strings.Split(out, "\n") {
				m := variable.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				name := m[1]
				if !strings.HasPrefix(name, "LIBVIRT_") && !slices.Contains(clusterctlVariables, name) {
					t.Errorf("variable %s is neither clusterctl's nor prefixed LIBVIRT_", name)
				}
				if strings.HasPrefix(name, "LIBVIRT_") && strings.Contains(required, "- "+name+"\n") {
					if _, given := vars[name]; !given {
						t.Errorf("variable %s is required", name)
					}
				}
			}
			t.Logf("clusterctl --list-variables:\n%s", out)
		})
	}
}

// TestClusterctlReadsComponents has clusterctl process the provider's
// components from the local override as `clusterctl init` does (variables,
// namespace, image overrides), and describe them.
func TestClusterctlReadsComponents(t *testing.T) {
	requireEnv(t)
	generate := []string{"generate", "provider", "--infrastructure", "libvirt:" + releaseVersion}
	for uri, vars := range map[string]map[string]string{
		"qemu:///system":              nil,
		"qemu+ssh://capl@host/system": {"LIBVIRT_URI": "qemu+ssh://capl@host/system"},
	} {
		out := string(clusterctl(t, vars, generate...))
		if !strings.Contains(out, "--libvirt-uri="+uri+"\n") {
			t.Errorf("components with %v lack --libvirt-uri=%s", vars, uri)
		}
		if strings.Contains(out, "${") {
			t.Errorf("components with %v keep a variable", vars)
		}
	}
	desc := string(clusterctl(t, nil, append(generate, "--describe")...))
	if !strings.Contains(desc, "LIBVIRT_URI") {
		t.Errorf("clusterctl --describe lists no LIBVIRT_URI:\n%s", desc)
	}
}

// TestRenderedTemplatesAreAccepted renders every flavor, with default and
// with non-default variables, and creates every object with a server-side
// dry-run: the CRDs' schemas, Cluster API's webhooks and the provider's
// webhooks all accept them. The objects the API server returns show the
// provider's defaults applied.
func TestRenderedTemplatesAreAccepted(t *testing.T) {
	requireEnv(t)
	tcg := map[string]string{
		"LIBVIRT_DOMAIN_TYPE":                      "qemu",
		"LIBVIRT_CONTROL_PLANE_MACHINE_CPUS":       "1",
		"LIBVIRT_CONTROL_PLANE_MACHINE_MEMORY_MIB": "1536",
		"LIBVIRT_WORKER_MACHINE_CPUS":              "1",
		"LIBVIRT_WORKER_MACHINE_MEMORY_MIB":        "1024",
		"LIBVIRT_DISK_SIZE_GIB":                    "10",
		"LIBVIRT_STORAGE_POOL":                     "ci",
		"LIBVIRT_STORAGE_POOL_PATH":                "/srv/ci",
		"LIBVIRT_POD_CIDR":                         "172.20.0.0/16",
		"LIBVIRT_SERVICE_CIDR":                     "172.21.0.0/16",
		// devplane.ClusterOptions.TCGTuning's, and CPU weights.
		"LIBVIRT_TCG_CACHE_MIB":                       "1024",
		"LIBVIRT_CONTROL_PLANE_CPU_SHARES":            "4096",
		"LIBVIRT_WORKER_CPU_SHARES":                   "1024",
		"LIBVIRT_WORKER_DATA_DISKS":                   "[{name: longhorn, sizeGiB: 100}, {name: scratch, sizeGiB: 10, pool: ci}]",
		"LIBVIRT_WORKER_ADDRESS_POOLS":                "[{apiGroup: ipam.cluster.x-k8s.io, kind: InClusterIPPool, name: lan}]",
		"LIBVIRT_WORKER_NAMESERVERS":                  "[192.168.1.1]",
		"LIBVIRT_WORKER_HOST_DEVICES":                 "[{name: gpu0}]",
		"LIBVIRT_ETCD_UNSAFE_NO_FSYNC":                "true",
		"LIBVIRT_ETCD_PROGRESS_NOTIFY_INTERVAL":       "60s",
		"LIBVIRT_ETCD_HEARTBEAT_INTERVAL_MS":          "500",
		"LIBVIRT_ETCD_ELECTION_TIMEOUT_MS":            "5000",
		"LIBVIRT_LEADER_ELECT":                        "false",
		"LIBVIRT_LEADER_ELECT_LEASE_DURATION":         "180s",
		"LIBVIRT_LEADER_ELECT_RENEW_DEADLINE":         "150s",
		"LIBVIRT_NODE_MONITOR_GRACE_PERIOD":           "2m",
		"LIBVIRT_PROBE_TIMEOUT_SECONDS":               "60",
		"LIBVIRT_LIVENESS_PROBE_FAILURE_THRESHOLD":    "60",
		"LIBVIRT_STARTUP_PROBE_FAILURE_THRESHOLD":     "120",
		"LIBVIRT_API_SERVER_READINESS_PERIOD_SECONDS": "10",
		"LIBVIRT_COREDNS_REPLICAS":                    "1",
		"LIBVIRT_WORKER_MAX_SURGE":                    "0",
		"LIBVIRT_WORKER_MAX_UNAVAILABLE":              "1",
		"LIBVIRT_API_SERVER_CPU_REQUEST":              "1",
		"LIBVIRT_ETCD_CPU_REQUEST":                    "300m",
		"LIBVIRT_CONTROL_PLANE_SYSTEM_CPU_WEIGHT":     "25",
	}
	cases := []struct {
		name, flavor string
		vars         map[string]string
		kinds        []string
		check        func(t *testing.T, objs map[string][]*unstructured.Unstructured)
	}{{
		name: "default", flavor: "",
		kinds: []string{"Cluster", "LibvirtCluster", "KubeadmControlPlane", "LibvirtMachineTemplate", "MachineDeployment", "KubeadmConfigTemplate"},
		check: func(t *testing.T, objs map[string][]*unstructured.Unstructured) {
			lc := objs["LibvirtCluster"][0]
			expect(t, lc, "HAProxy", "spec", "loadBalancer", "type")
			expect(t, lc, int64(1), "spec", "loadBalancer", "cpus")
			expect(t, lc, "host-passthrough", "spec", "loadBalancer", "cpuMode")
			expect(t, lc, int64(6443), "spec", "controlPlaneEndpoint", "port")
			for _, mt := range objs["LibvirtMachineTemplate"] {
				expect(t, mt, image, "spec", "template", "spec", "image", "volume", "name")
				expect(t, mt, "host-passthrough", "spec", "template", "spec", "cpuMode")
			}
			kcp := objs["KubeadmControlPlane"][0]
			expect(t, kcp, "cloud-config", "spec", "kubeadmConfigSpec", "format")
			args, _, _ := unstructured.NestedSlice(kcp.Object, "spec", "kubeadmConfigSpec", "joinConfiguration", "nodeRegistration", "kubeletExtraArgs")
			want := map[string]any{"name": "provider-id", "value": "libvirt:///{{ ds.meta_data.instance_id }}"}
			if len(args) != 1 || fmt.Sprint(args[0]) != fmt.Sprint(want) {
				t.Errorf("kubeletExtraArgs: %v, want [%v]", args, want)
			}
		},
	}, {
		name: "default under TCG with small machines", flavor: "", vars: tcg,
		kinds: []string{"Cluster", "LibvirtCluster", "KubeadmControlPlane", "LibvirtMachineTemplate", "MachineDeployment", "KubeadmConfigTemplate"},
		check: func(t *testing.T, objs map[string][]*unstructured.Unstructured) {
			lc := objs["LibvirtCluster"][0]
			expect(t, lc, "maximum", "spec", "loadBalancer", "cpuMode")
			expect(t, lc, "ci", "spec", "storagePool", "name")
			withDevices := 0
			for _, mt := range objs["LibvirtMachineTemplate"] {
				expect(t, mt, "qemu", "spec", "template", "spec", "domainType")
				expect(t, mt, "maximum", "spec", "template", "spec", "cpuMode")
				expect(t, mt, int64(10), "spec", "template", "spec", "diskSizeGiB")
				if devices, _, _ := unstructured.NestedSlice(mt.Object, "spec", "template", "spec", "hostDevices"); len(devices) > 0 {
					withDevices++
					if fmt.Sprint(devices) != "[map[name:gpu0]]" {
						t.Errorf("%s: hostDevices %v, want [{name: gpu0}]", mt.GetName(), devices)
					}
				}
			}
			if withDevices != 1 {
				t.Errorf("%d LibvirtMachineTemplates pass host devices through, want the workers' alone", withDevices)
			}
		},
	}, {
		name: "kube-vip", flavor: "kube-vip",
		kinds: []string{"Cluster", "LibvirtCluster", "KubeadmControlPlane", "LibvirtMachineTemplate", "MachineDeployment", "KubeadmConfigTemplate"},
		check: func(t *testing.T, objs map[string][]*unstructured.Unstructured) {
			lc := objs["LibvirtCluster"][0]
			expect(t, lc, "None", "spec", "loadBalancer", "type")
			expect(t, lc, "192.168.1.240", "spec", "controlPlaneEndpoint", "host")
			expect(t, lc, "br0", "spec", "network", "bridge")
			if _, found, _ := unstructured.NestedFieldNoCopy(lc.Object, "spec", "loadBalancer", "cpus"); found {
				t.Error("type None got load-balancer cpus")
			}
			manifest := renderedFile(t, objs["KubeadmControlPlane"][0], []string{"spec", "kubeadmConfigSpec"}, "/etc/kubernetes/manifests/kube-vip.yaml")
			if !strings.Contains(manifest, `value: "192.168.1.240"`) {
				t.Errorf("kube-vip manifest does not announce the endpoint:\n%s", manifest)
			}
		},
	}, {
		name: "topology", flavor: "topology",
		kinds: []string{"ClusterClass", "LibvirtClusterTemplate", "KubeadmControlPlaneTemplate", "LibvirtMachineTemplate", "KubeadmConfigTemplate", "Cluster"},
	}, {
		name: "topology under TCG", flavor: "topology", vars: tcg,
		kinds: []string{"ClusterClass", "LibvirtClusterTemplate", "KubeadmControlPlaneTemplate", "LibvirtMachineTemplate", "KubeadmConfigTemplate", "Cluster"},
	}}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, fmt.Sprintf("render-%d", i))
			vars := map[string]string{}
			for k, v := range flavors[tc.flavor] {
				vars[k] = v
			}
			for k, v := range tc.vars {
				vars[k] = v
			}
			objs := generate(t, tc.flavor, "demo", ns, vars)
			byKind := map[string][]*unstructured.Unstructured{}
			for _, o := range objs {
				if err := c.Create(ctx(t), o, client.DryRunAll); err != nil {
					t.Fatalf("%s %s refused: %v", o.GetKind(), o.GetName(), err)
				}
				byKind[o.GetKind()] = append(byKind[o.GetKind()], o)
			}
			for _, k := range tc.kinds {
				if len(byKind[k]) == 0 {
					t.Errorf("no %s rendered", k)
				}
			}
			if tc.check != nil {
				tc.check(t, byKind)
			}
			checkKubeadmRetry(t, byKind)
			surge, unavailable := int64(1), int64(0)
			if tc.vars["LIBVIRT_WORKER_MAX_SURGE"] != "" {
				surge, unavailable = 0, 1
			}
			checkWorkerRollout(t, byKind, surge, unavailable)
		})
	}
}

// checkWorkerRollout checks the rolling update of the workers' MachineDeployment,
// or of the topology's that Cluster API makes from it.
func checkWorkerRollout(t *testing.T, objs map[string][]*unstructured.Unstructured, surge, unavailable int64) {
	t.Helper()
	var strategy map[string]any
	if mds := objs["MachineDeployment"]; len(mds) > 0 {
		strategy, _, _ = unstructured.NestedMap(mds[0].Object, "spec", "rollout", "strategy")
	} else {
		mds, _, _ := unstructured.NestedSlice(objs["Cluster"][0].Object, "spec", "topology", "workers", "machineDeployments")
		if len(mds) != 1 {
			t.Fatalf("topology has %d MachineDeployments, want 1", len(mds))
		}
		strategy, _, _ = unstructured.NestedMap(mds[0].(map[string]any), "rollout", "strategy")
	}
	want := fmt.Sprint(map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxSurge": surge, "maxUnavailable": unavailable}})
	if fmt.Sprint(strategy) != want {
		t.Errorf("workers' rollout strategy %v, want %v", strategy, want)
	}
}

// TestTopology runs Cluster API's ClusterClass and topology controllers on
// the rendered ClusterClass: they create the cluster's LibvirtCluster,
// control plane, machine templates and MachineDeployment with the
// variables patched in, and when a variable changes they compute the
// difference with server-side-apply dry-runs through the provider's
// webhooks and rotate the affected LibvirtMachineTemplate.
func TestTopology(t *testing.T) {
	requireEnv(t)
	ns := namespace(t, "topology")
	objs := generate(t, "topology", "topo", ns, map[string]string{"LIBVIRT_IMAGE_VOLUME": image, "LIBVIRT_DOMAIN_TYPE": "qemu"})
	var cluster *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Cluster" {
			cluster = o
			continue
		}
		if err := c.Create(ctx(t), o); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	start := time.Now()
	class := &clusterv1.ClusterClass{}
	eventually(t, "the ClusterClass's variables are published", func() error {
		if err := c.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: "libvirt"}, class); err != nil {
			return err
		}
		if class.Status.ObservedGeneration != class.Generation || len(class.Status.Variables) == 0 {
			return fmt.Errorf("ClusterClass observedGeneration %d of %d, %d variables: %s",
				class.Status.ObservedGeneration, class.Generation, len(class.Status.Variables), conditions(class.Status.Conditions))
		}
		return nil
	})
	t.Logf("BENCH ClusterClass reconciled in %v", time.Since(start).Round(time.Millisecond))

	if err := c.Create(ctx(t), cluster); err != nil {
		t.Fatalf("Cluster: %v", err)
	}
	start = time.Now()
	lc := &infrav1.LibvirtCluster{}
	kcp := &controlplanev1.KubeadmControlPlane{}
	cpTemplate := &infrav1.LibvirtMachineTemplate{}
	eventually(t, "the topology controller creates the LibvirtCluster and the control plane", func() error {
		cl := &clusterv1.Cluster{}
		if err := c.Get(ctx(t), client.ObjectKeyFromObject(cluster), cl); err != nil {
			return err
		}
		if !cl.Spec.InfrastructureRef.IsDefined() || !cl.Spec.ControlPlaneRef.IsDefined() {
			return fmt.Errorf("Cluster refs not set: %s", conditions(cl.Status.Conditions))
		}
		if err := c.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: cl.Spec.InfrastructureRef.Name}, lc); err != nil {
			return err
		}
		if err := c.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: cl.Spec.ControlPlaneRef.Name}, kcp); err != nil {
			return err
		}
		return c.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name}, cpTemplate)
	})
	t.Logf("BENCH topology created LibvirtCluster, KubeadmControlPlane and LibvirtMachineTemplate in %v", time.Since(start).Round(time.Millisecond))

	wantPool := infrav1.StoragePool{Name: "capi-libvirt", Path: "/var/lib/libvirt/capi-libvirt"}
	if lc.Spec.StoragePool != wantPool {
		t.Errorf("LibvirtCluster storagePool %+v, want %+v", lc.Spec.StoragePool, wantPool)
	}
	lb := lc.Spec.LoadBalancer
	if lb.Type != infrav1.LoadBalancerHAProxy || lb.DomainType != infrav1.DomainTypeQEMU || lb.CPUMode != infrav1.CPUModeMaximum ||
		lb.Image == nil || lb.Image.Volume == nil || lb.Image.Volume.Name != "capi-libvirt-haproxy.qcow2" {
		t.Errorf("LibvirtCluster loadBalancer %+v", lb)
	}
	if kcp.Spec.Version != "v1.33.1" || ptr.Deref(kcp.Spec.Replicas, 0) != 3 {
		t.Errorf("KubeadmControlPlane version %s replicas %v", kcp.Spec.Version, kcp.Spec.Replicas)
	}
	checkMachineTemplate(t, cpTemplate, 2, 4096)

	markControlPlaneProvisioned(t, kcp)
	workerTemplate := &infrav1.LibvirtMachineTemplate{}
	eventually(t, "the topology controller creates the MachineDeployment", func() error {
		mds := &clusterv1.MachineDeploymentList{}
		if err := c.List(ctx(t), mds, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(mds.Items) != 1 {
			return fmt.Errorf("%d MachineDeployments", len(mds.Items))
		}
		md := mds.Items[0]
		if ptr.Deref(md.Spec.Replicas, 0) != 2 {
			return fmt.Errorf("MachineDeployment replicas %v", md.Spec.Replicas)
		}
		return c.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: md.Spec.Template.Spec.InfrastructureRef.Name}, workerTemplate)
	})
	checkMachineTemplate(t, workerTemplate, 2, 2048)

	// A changed variable: the topology controller dry-runs the new
	// template against the current one (the webhook must let that
	// through), sees a difference and rotates the template.
	patchVariable(t, cluster, "controlPlaneCPUs", "4")
	start = time.Now()
	rotated := &infrav1.LibvirtMachineTemplate{}
	eventually(t, "the control plane's LibvirtMachineTemplate is rotated", func() error {
		if err := c.Get(ctx(t), client.ObjectKeyFromObject(kcp), kcp); err != nil {
			return err
		}
		name := kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name
		if name == cpTemplate.Name {
			return fmt.Errorf("still %s", name)
		}
		return c.Get(ctx(t), client.ObjectKey{Namespace: ns, Name: name}, rotated)
	})
	t.Logf("BENCH template rotated in %v: %s -> %s", time.Since(start).Round(time.Millisecond), cpTemplate.Name, rotated.Name)
	checkMachineTemplate(t, rotated, 4, 4096)
	topologyReconciled(t, cluster)

	// An endpoint of the user's own: no HAProxy VM.
	own, ownLC := topologyVariant(t, cluster, "own-endpoint",
		map[string]any{"name": "controlPlaneEndpoint", "value": map[string]any{"host": "192.168.1.240"}})
	want := infrav1.LoadBalancer{Type: infrav1.LoadBalancerNone, VirtualHardware: infrav1.VirtualHardware{DomainType: infrav1.DomainTypeKVM}}
	if ownLC.Spec.LoadBalancer.Type != want.Type || ownLC.Spec.LoadBalancer.CPUs != 0 || ownLC.Spec.LoadBalancer.Image != nil ||
		ownLC.Spec.ControlPlaneEndpoint != (clusterv1.APIEndpoint{Host: "192.168.1.240", Port: 6443}) {
		t.Errorf("LibvirtCluster spec %+v", ownLC.Spec)
	}
	topologyReconciled(t, own)

	// Several hosts: the failure domains, the HAProxy VM's host and the
	// endpoint it holds on the hosts' bridge come from variables.
	multi, multiLC := topologyVariant(t, cluster, "multi-host",
		map[string]any{"name": "network", "value": map[string]any{"bridge": "br0"}},
		map[string]any{"name": "failureDomains", "value": []any{
			map[string]any{"name": "kvm1", "uri": "qemu+ssh://root@kvm1/system", "credentialsRef": map[string]any{"name": "capl-hosts"}, "controlPlane": true},
			map[string]any{"name": "kvm2", "uri": "qemu+tls://kvm2/system", "credentialsRef": map[string]any{"name": "kvm2-tls"}, "controlPlane": true},
			map[string]any{"name": "kvm3", "uri": "qemu+ssh://root@kvm3/system", "credentialsRef": map[string]any{"name": "capl-hosts"}},
		}},
		map[string]any{"name": "loadBalancerFailureDomain", "value": "kvm2"},
		map[string]any{"name": "loadBalancerEndpoint", "value": map[string]any{"host": "192.168.1.241"}})
	wantFDs := []infrav1.FailureDomainSpec{
		{Name: "kvm1", URI: "qemu+ssh://root@kvm1/system", CredentialsRef: &infrav1.SecretReference{Name: "capl-hosts"}, ControlPlane: ptr.To(true)},
		{Name: "kvm2", URI: "qemu+tls://kvm2/system", CredentialsRef: &infrav1.SecretReference{Name: "kvm2-tls"}, ControlPlane: ptr.To(true)},
		{Name: "kvm3", URI: "qemu+ssh://root@kvm3/system", CredentialsRef: &infrav1.SecretReference{Name: "capl-hosts"}},
	}
	if !equality.Semantic.DeepEqual(multiLC.Spec.FailureDomains, wantFDs) {
		t.Errorf("LibvirtCluster failureDomains %+v, want %+v", multiLC.Spec.FailureDomains, wantFDs)
	}
	if lb := multiLC.Spec.LoadBalancer; lb.Type != infrav1.LoadBalancerHAProxy || lb.FailureDomain != "kvm2" ||
		multiLC.Spec.Network.Bridge != "br0" || multiLC.Spec.ControlPlaneEndpoint != (clusterv1.APIEndpoint{Host: "192.168.1.241", Port: 6443}) {
		t.Errorf("LibvirtCluster over several hosts: loadBalancer %+v, network %+v, endpoint %+v", lb, multiLC.Spec.Network, multiLC.Spec.ControlPlaneEndpoint)
	}
	topologyReconciled(t, multi)
}

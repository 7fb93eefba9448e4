package devplane

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// imageDir writes two distinct stand-in images and returns the directory
// and the checksums Demo must put into the objects.
func imageDir(t *testing.T) (dir, nodeSum, lbSum string) {
	t.Helper()
	dir = t.TempDir()
	sum := func(file, content string) string {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256([]byte(content))
		return "sha256:" + hex.EncodeToString(s[:])
	}
	return dir, sum(NodeImageFile, "node image"), sum(HAProxyImageFile, "haproxy image")
}

var checksumFormat = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

func TestDemo(t *testing.T) {
	dir, nodeSum, lbSum := imageDir(t)
	for _, tc := range []struct {
		name                  string
		opts                  DemoOptions
		wantCP, wantWorkers   int32
		wantNamespace, wantCl string
		wantTCG               int32
	}{
		{
			name:   "issue default: 3 control plane, 2 workers, TCG",
			opts:   DemoOptions{ControlPlane: 3, Workers: 2, ImageDir: dir, DomainType: "qemu", CPUMode: "maximum", TCGCacheMiB: 128},
			wantCP: 3, wantWorkers: 2, wantNamespace: "default", wantCl: "demo", wantTCG: 128,
		},
		{
			name:   "small, kvm drops the TCG cache",
			opts:   DemoOptions{Namespace: "lab", Name: "tiny", ControlPlane: 1, Workers: 0, ImageDir: dir, DomainType: "kvm", CPUMode: "host-passthrough", TCGCacheMiB: 128, StoragePool: "lab-pool"},
			wantCP: 1, wantWorkers: 0, wantNamespace: "lab", wantCl: "tiny", wantTCG: 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := Demo(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			byKind := map[string][]client.Object{}
			for _, o := range objs {
				kind := strings.TrimPrefix(strings.TrimPrefix(typeName(o), "*v1beta2."), "*v1alpha1.")
				byKind[kind] = append(byKind[kind], o)
				if o.GetNamespace() != tc.wantNamespace {
					t.Errorf("%s %s in namespace %q, want %q", kind, o.GetName(), o.GetNamespace(), tc.wantNamespace)
				}
				if o.GetLabels()[clusterv1.ClusterNameLabel] != tc.wantCl {
					t.Errorf("%s %s lacks the cluster-name label %q: %v", kind, o.GetName(), tc.wantCl, o.GetLabels())
				}
			}
			counts := map[string]int{"*v1.Secret": 2, "Cluster": 1, "LibvirtCluster": 1, "Machine": int(tc.wantCP),
				"LibvirtMachine": int(tc.wantCP), "LibvirtMachineTemplate": 1, "MachineDeployment": 1}
			for kind, want := range counts {
				if got := len(byKind[kind]); got != want {
					t.Errorf("%d %s, want %d", got, kind, want)
				}
			}
			secrets := map[string]*corev1.Secret{}
			for _, o := range byKind["*v1.Secret"] {
				s := o.(*corev1.Secret)
				secrets[s.Name] = s
				if string(s.Data["format"]) != "cloud-config" || !strings.HasPrefix(string(s.Data["value"]), "#cloud-config\n") {
					t.Errorf("Secret %s: format %q, value starting %.20q", s.Name, s.Data["format"], s.Data["value"])
				}
			}

			cluster := byKind["Cluster"][0].(*clusterv1.Cluster)
			lc := byKind["LibvirtCluster"][0].(*infrav1.LibvirtCluster)
			if ref := cluster.Spec.InfrastructureRef; ref.Kind != "LibvirtCluster" || ref.Name != lc.Name || ref.APIGroup != infrav1.GroupVersion.Group {
				t.Errorf("Cluster infrastructureRef %+v does not name LibvirtCluster %s", ref, lc.Name)
			}
			lb := lc.Spec.LoadBalancer
			if lb.Type != infrav1.LoadBalancerHAProxy || lb.Image == nil || lb.Image.URL != "file://"+filepath.Join(dir, HAProxyImageFile) || lb.Image.Checksum != lbSum {
				t.Errorf("load balancer %+v image %+v, want HAProxy from %s with %s", lb, lb.Image, HAProxyImageFile, lbSum)
			}
			if want := tc.opts.StoragePool; lc.Spec.StoragePool.Name != want || (want != "") != (lc.Spec.StoragePool.Path == "/var/lib/libvirt/"+want) {
				t.Errorf("storage pool %+v, want %q at /var/lib/libvirt/%[2]s", lc.Spec.StoragePool, want)
			}
			checkHardware(t, "load balancer", lb.VirtualHardware, tc.opts, tc.wantTCG)

			lms := map[string]*infrav1.LibvirtMachine{}
			for _, o := range byKind["LibvirtMachine"] {
				lm := o.(*infrav1.LibvirtMachine)
				lms[lm.Name] = lm
				checkImage(t, lm.Name, lm.Spec.Image, dir, nodeSum)
				checkHardware(t, lm.Name, lm.Spec.VirtualHardware, tc.opts, tc.wantTCG)
			}
			for _, o := range byKind["Machine"] {
				m := o.(*clusterv1.Machine)
				if _, ok := m.Labels[clusterv1.MachineControlPlaneLabel]; !ok {
					t.Errorf("Machine %s lacks the control-plane label", m.Name)
				}
				if m.Spec.ClusterName != tc.wantCl {
					t.Errorf("Machine %s clusterName %q", m.Name, m.Spec.ClusterName)
				}
				if ref := m.Spec.InfrastructureRef; ref.Kind != "LibvirtMachine" || lms[ref.Name] == nil || ref.Name != m.Name {
					t.Errorf("Machine %s infrastructureRef %+v names no LibvirtMachine of the demo", m.Name, ref)
				}
				checkSecretRef(t, m.Name, m.Spec.Bootstrap.DataSecretName, secrets, "6443")
			}

			tmpl := byKind["LibvirtMachineTemplate"][0].(*infrav1.LibvirtMachineTemplate)
			checkImage(t, tmpl.Name, tmpl.Spec.Template.Spec.Image, dir, nodeSum)
			checkHardware(t, tmpl.Name, tmpl.Spec.Template.Spec.VirtualHardware, tc.opts, tc.wantTCG)
			md := byKind["MachineDeployment"][0].(*clusterv1.MachineDeployment)
			if md.Spec.Replicas == nil || *md.Spec.Replicas != tc.wantWorkers {
				t.Errorf("MachineDeployment replicas %v, want %d", md.Spec.Replicas, tc.wantWorkers)
			}
			if md.Spec.ClusterName != tc.wantCl || md.Spec.Template.Spec.ClusterName != tc.wantCl {
				t.Errorf("MachineDeployment clusterName %q, template's %q", md.Spec.ClusterName, md.Spec.Template.Spec.ClusterName)
			}
			if ref := md.Spec.Template.Spec.InfrastructureRef; ref.Kind != "LibvirtMachineTemplate" || ref.Name != tmpl.Name {
				t.Errorf("MachineDeployment infrastructureRef %+v, want template %s", ref, tmpl.Name)
			}
			checkSecretRef(t, md.Name, md.Spec.Template.Spec.Bootstrap.DataSecretName, secrets, "bootstrap-success.complete")
			// Cluster API's defaulting webhook fills in the rest
			// (TestPlaneLifecycle shows it on the plane).
			if len(md.Spec.Selector.MatchLabels) != 0 || md.Spec.Rollout.Strategy.Type != "" {
				t.Errorf("MachineDeployment sets defaults of Cluster API's webhook: selector %v, rollout %+v", md.Spec.Selector, md.Spec.Rollout)
			}
			if md.Spec.Deletion.Order != clusterv1.NewestMachineSetDeletionOrder {
				t.Errorf("deletion order %q, want Newest", md.Spec.Deletion.Order)
			}
		})
	}
}

func TestDemoRefusesBadInput(t *testing.T) {
	dir, _, _ := imageDir(t)
	for _, tc := range []struct {
		name string
		opts DemoOptions
		want string
	}{
		{"no control plane", DemoOptions{ControlPlane: 0, Workers: 1, ImageDir: dir}, "at least one control-plane"},
		{"negative workers", DemoOptions{ControlPlane: 1, Workers: -1, ImageDir: dir}, "negative worker"},
		{"no image dir", DemoOptions{ControlPlane: 1}, "no image directory"},
		{"images missing", DemoOptions{ControlPlane: 1, ImageDir: t.TempDir()}, "make images"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Demo(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func typeName(o client.Object) string { return fmt.Sprintf("%T", o) }

func checkImage(t *testing.T, who string, img infrav1.ImageSource, dir, sum string) {
	t.Helper()
	if img.URL != "file://"+filepath.Join(dir, NodeImageFile) || img.Checksum != sum || !checksumFormat.MatchString(img.Checksum) {
		t.Errorf("%s image %+v, want %s with %s", who, img, NodeImageFile, sum)
	}
}

func checkHardware(t *testing.T, who string, hw infrav1.VirtualHardware, o DemoOptions, wantTCG int32) {
	t.Helper()
	want := infrav1.VirtualHardware{CPUs: 1, MemoryMiB: 512, DomainType: infrav1.DomainType(o.DomainType),
		CPUMode: infrav1.CPUMode(o.CPUMode), TCGTranslationCacheMiB: wantTCG}
	if !reflect.DeepEqual(hw, want) {
		t.Errorf("%s hardware %+v, want %+v", who, hw, want)
	}
}

func checkSecretRef(t *testing.T, who string, name *string, secrets map[string]*corev1.Secret, wantInUserData string) {
	t.Helper()
	if name == nil || secrets[*name] == nil {
		t.Errorf("%s dataSecretName %v names no Secret of the demo", who, name)
		return
	}
	if !strings.Contains(string(secrets[*name].Data["value"]), wantInUserData) {
		t.Errorf("%s user-data of %s lacks %q", who, *name, wantInUserData)
	}
}

func TestChooseDomainType(t *testing.T) {
	for _, tc := range []struct {
		domainType, cpuMode string
		wantType, wantMode  string
		wantTCG             int32
		wantErr             bool
	}{
		{domainType: "kvm", wantType: "kvm", wantMode: "host-passthrough"},
		{domainType: "kvm", cpuMode: "host-model", wantType: "kvm", wantMode: "host-model"},
		{domainType: "qemu", wantType: "qemu", wantMode: "maximum", wantTCG: DefaultTCGCacheMiB},
		{domainType: "xen", wantErr: true},
	} {
		c, err := ChooseDomainType(tc.domainType, tc.cpuMode)
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: error %v", tc.domainType, err)
			continue
		}
		if !tc.wantErr && (c.DomainType != tc.wantType || c.CPUMode != tc.wantMode || c.TCGCacheMiB != tc.wantTCG || c.Reason == "") {
			t.Errorf("%s/%s: %+v", tc.domainType, tc.cpuMode, c)
		}
	}
	// auto decides from this host; whatever it picks must be consistent.
	c, err := ChooseDomainType("auto", "")
	t.Logf("auto on this host: %s", c.Reason)
	if err != nil || (c.DomainType == "qemu") != (c.TCGCacheMiB == DefaultTCGCacheMiB) || c.Reason == "" {
		t.Errorf("auto: %+v, %v", c, err)
	}
}

func TestChooseAccelerator(t *testing.T) {
	kvm := DomainChoice{DomainType: "kvm"}
	tcg := DomainChoice{DomainType: "qemu"}
	const (
		bare      = "processor\t: 0\nflags\t\t: fpu vme vmx lahf_lm\n"
		amd       = "processor\t: 0\nflags\t\t: fpu svm lahf_lm\n"
		nested    = "processor\t: 0\nflags\t\t: fpu vmx hypervisor lahf_lm\n"
		pvm       = "processor\t: 0\nflags\t\t: fpu vme hypervisor lahf_lm\n" // this project's build host: kvm_pvm
		noVirtCPU = "processor\t: 0\nflags\t\t: fpu vme lahf_lm\n"
	)
	for _, tc := range []struct {
		name       string
		probe      kvmProbe
		want       string
		wantReason string
	}{
		{"bare metal, Intel", kvmProbe{cpuinfo: bare}, "kvm", "offers vmx"},
		{"bare metal, AMD", kvmProbe{cpuinfo: amd}, "kvm", "offers svm"},
		{"nested virtualisation", kvmProbe{cpuinfo: nested}, "kvm", "nested virtualisation"},
		{"paravirtual KVM without vmx/svm", kvmProbe{cpuinfo: pvm}, "qemu", "neither vmx nor svm"},
		{"KVM device without vmx/svm", kvmProbe{cpuinfo: noVirtCPU}, "qemu", "neither vmx nor svm"},
		{"no /dev/kvm", kvmProbe{openErr: os.ErrNotExist, cpuinfo: bare}, "qemu", "/dev/kvm is not usable"},
		{"/dev/kvm not permitted", kvmProbe{openErr: os.ErrPermission, cpuinfo: nested}, "qemu", "permission denied"},
		{"cpuinfo unreadable", kvmProbe{cpuinfoErr: os.ErrPermission}, "qemu", "cannot tell"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := chooseAccelerator(tc.probe, kvm, tcg)
			if c.DomainType != tc.want || !strings.Contains(c.Reason, tc.wantReason) {
				t.Errorf("chose %s (%s), want %s with a reason saying %q", c.DomainType, c.Reason, tc.want, tc.wantReason)
			}
		})
	}
}

func TestHasCPUFlag(t *testing.T) {
	for _, tc := range []struct {
		cpuinfo string
		want    bool
	}{
		{"processor\t: 0\nflags\t\t: fpu vme hypervisor lahf_lm\n", true},
		{"processor\t: 0\nflags\t\t: fpu vme lahf_lm\n", false},
		{"model name\t: hypervisor-branded CPU\nflags\t\t: fpu\n", false},
		{"flags\t\t: fpu hypervisorx\n", false},
	} {
		if got := hasCPUFlag(tc.cpuinfo, "hypervisor"); got != tc.want {
			t.Errorf("hasCPUFlag(%q) = %v", tc.cpuinfo, got)
		}
	}
}

package devplane

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// TestRenderClusterHostEtcd renders the real template with the cluster's
// etcd on the host: the KubeadmControlPlane names the plane's etcd as
// kubeadm's external etcd (no local member), maps its name first thing,
// and the Cluster asks the plane for it on the port; without a port, or
// for a ClusterClass's Cluster, rendering fails.
func TestRenderClusterHostEtcd(t *testing.T) {
	base := ClusterOptions{
		Namespace: "team-a", Name: "k8s", ControlPlane: 1, Workers: 1, KubernetesVersion: "v1.36.3",
		Template: repoFile("templates", "cluster-template.yaml"), CNI: repoFile("templates", "cni-flannel.yaml"),
		ImageDir: fakeImageDir(t, "v1.36.3"), DomainType: "qemu",
	}.TCGTuning()
	base.HostEtcd = true
	imgs, err := ImageVolumes(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		change  func(*ClusterOptions)
		wantErr string
	}{
		{name: "port 23790", change: func(o *ClusterOptions) { o.HostEtcdPort = 23790 }},
		{name: "no port", change: func(*ClusterOptions) {}, wantErr: "needs its port"},
		{name: "ClusterClass", change: func(o *ClusterOptions) {
			o.HostEtcdPort = 23790
			o.Template, o.ClusterClass = repoFile("templates", "cluster-template-topology.yaml"), repoFile("templates", "clusterclass-libvirt.yaml")
		}, wantErr: "plain templates only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.change(&o)
			objs, err := RenderCluster(o, ClusterVariables(o, imgs))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("RenderCluster: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var kcp controlplanev1.KubeadmControlPlane
			for _, u := range objs {
				switch u.GetKind() {
				case "Cluster":
					if got := u.GetAnnotations()[plane.HostEtcdPortAnnotation]; got != "23790" {
						t.Errorf("Cluster annotation %s = %q, want 23790", plane.HostEtcdPortAnnotation, got)
					}
				case "KubeadmControlPlane":
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &kcp); err != nil {
						t.Fatal(err)
					}
				}
			}
			etcd := kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.Etcd
			if etcd.Local.IsDefined() {
				t.Errorf("the KubeadmControlPlane keeps a local etcd: %+v", etcd.Local)
			}
			want := "https://" + plane.HostEtcdName + ":23790"
			if ext := etcd.External; len(ext.Endpoints) != 1 || ext.Endpoints[0] != want || ext.CAFile != hostEtcdCAFile ||
				ext.CertFile != hostEtcdCertFile || ext.KeyFile != hostEtcdKeyFile {
				t.Errorf("external etcd %+v, want endpoint %s and the files of kubeadm's paths", ext, want)
			}
			if cmds := kcp.Spec.KubeadmConfigSpec.PreKubeadmCommands; len(cmds) < 2 || cmds[0] != hostEtcdHostsEntry {
				t.Errorf("preKubeadmCommands %q do not start with the host etcd's name", cmds)
			}
		})
	}
}

package devplane

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

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

// TestPlaceEtcd decides where a cluster's etcd runs from what was asked
// and the Cluster that exists: a new Cluster gets what was asked (a free
// port on the host), an existing one keeps its etcd where it is, which a
// demand (not the TCG default) to move it fails on.
func TestPlaceEtcd(t *testing.T) {
	onHost := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{plane.HostEtcdPortAnnotation: "23790"}}}
	stacked := &clusterv1.Cluster{}
	freePort := func() (int, error) { return 40000, nil }
	tcg := func(hostEtcd, byDefault bool) ClusterOptions {
		o := ClusterOptions{Namespace: "team-a", Name: "k8s", ControlPlane: 1, HostEtcd: hostEtcd, EtcdFollowsCluster: byDefault}
		return o.TCGTuning()
	}
	for _, tc := range []struct {
		name      string
		o         ClusterOptions
		cluster   *clusterv1.Cluster
		wantHost  bool
		wantPort  int
		wantElect string
		wantErr   string
	}{
		{name: "new, stacked", o: tcg(false, false), wantElect: "false"},
		{name: "new, on the host", o: tcg(true, false), wantHost: true, wantPort: 40000},
		{name: "new, on the host by default", o: tcg(true, true), wantHost: true, wantPort: 40000},
		{name: "on the host, asked again", o: tcg(true, false), cluster: onHost, wantHost: true, wantPort: 23790},
		{name: "stacked, asked again", o: tcg(false, false), cluster: stacked, wantElect: "false"},
		{name: "stacked, on the host by default", o: tcg(true, true), cluster: stacked, wantElect: "false"},
		{name: "on the host, stacked by default", o: tcg(false, true), cluster: onHost, wantHost: true, wantPort: 23790},
		{name: "stacked, on the host asked", o: tcg(true, false), cluster: stacked, wantErr: "etcd of its own"},
		{name: "on the host, stacked asked", o: tcg(false, false), cluster: onHost, wantErr: "cannot move into its machines"},
		{name: "a bad annotation", o: tcg(true, true), wantErr: "not a port from 1024 to 65535",
			cluster: &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{plane.HostEtcdPortAnnotation: "x"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := placeEtcd(tc.o, tc.cluster, freePort)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.HostEtcd != tc.wantHost || got.HostEtcdPort != tc.wantPort || got.LeaderElect != tc.wantElect {
				t.Errorf("etcd on the host %v, port %d, leader election %q; want %v, %d, %q",
					got.HostEtcd, got.HostEtcdPort, got.LeaderElect, tc.wantHost, tc.wantPort, tc.wantElect)
			}
		})
	}
}

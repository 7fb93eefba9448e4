package devplane

import (
	"context"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// The files kubeadm's external etcd configuration names on a control-plane
// machine, where Cluster API's kubeadm bootstrap provider writes the
// Secrets the plane makes (kubeadm's own paths for a local etcd's CA and
// the API server's client certificate).
const (
	hostEtcdCAFile   = "/etc/kubernetes/pki/etcd/ca.crt"
	hostEtcdCertFile = "/etc/kubernetes/pki/apiserver-etcd-client.crt"
	hostEtcdKeyFile  = "/etc/kubernetes/pki/apiserver-etcd-client.key"
)

// hostEtcdHostsEntry, the first preKubeadmCommand of a control-plane
// machine, maps plane.HostEtcdName to the guest's default gateway, which
// is the host on the provider's NAT network. The API server's static pod
// runs on the host network and is given the node's /etc/hosts.
var hostEtcdHostsEntry = `sh -c 'grep -q " ` + plane.HostEtcdName + `$" /etc/hosts || ` +
	`echo "$(ip -4 route show default | awk "{print \$3; exit}") ` + plane.HostEtcdName + `" >>/etc/hosts'`

// setHostEtcd points objs' KubeadmControlPlane at the plane's etcd for the
// cluster on port (kubeadm's external etcd, in place of the template's
// local one) and asks the plane for it on the Cluster
// (plane.HostEtcdPortAnnotation).
func setHostEtcd(objs []*unstructured.Unstructured, port int) error {
	var cluster, kcp *unstructured.Unstructured
	for _, u := range objs {
		switch {
		case u.GetKind() == "Cluster" && u.GroupVersionKind().Group == clusterv1.GroupVersion.Group:
			cluster = u
		case u.GetKind() == "KubeadmControlPlane":
			kcp = u
		}
	}
	if cluster == nil || kcp == nil {
		return fmt.Errorf("an etcd on the host needs a Cluster and a KubeadmControlPlane in the template")
	}
	annotations := cluster.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[plane.HostEtcdPortAnnotation] = strconv.Itoa(port)
	cluster.SetAnnotations(annotations)

	spec := []string{"spec", "kubeadmConfigSpec"}
	external := map[string]any{
		"endpoints": []any{fmt.Sprintf("https://%s:%d", plane.HostEtcdName, port)},
		"caFile":    hostEtcdCAFile, "certFile": hostEtcdCertFile, "keyFile": hostEtcdKeyFile,
	}
	if err := unstructured.SetNestedMap(kcp.Object, map[string]any{"external": external}, append(spec, "clusterConfiguration", "etcd")...); err != nil {
		return fmt.Errorf("KubeadmControlPlane %s: %w", kcp.GetName(), err)
	}
	commands, _, err := unstructured.NestedSlice(kcp.Object, append(spec, "preKubeadmCommands")...)
	if err != nil {
		return fmt.Errorf("KubeadmControlPlane %s: %w", kcp.GetName(), err)
	}
	return unstructured.SetNestedSlice(kcp.Object, append([]any{hostEtcdHostsEntry}, commands...), append(spec, "preKubeadmCommands")...)
}

// HostEtcdPort is the port the plane's etcd of cluster o serves on: the
// one the Cluster asks for when it exists (a second `up` keeps it, which
// a changed KubeadmControlPlane would otherwise roll out), else a free
// port of this host.
func HostEtcdPort(ctx context.Context, c client.Client, o ClusterOptions) (int, error) {
	cluster := &clusterv1.Cluster{}
	err := c.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Name}, cluster)
	switch {
	case err == nil:
		if value, ok := cluster.Annotations[plane.HostEtcdPortAnnotation]; ok {
			return strconv.Atoi(value)
		}
		return 0, fmt.Errorf("cluster %s/%s exists with an etcd of its own; its etcd cannot move to the host", o.Namespace, o.Name)
	case apierrors.IsNotFound(err):
		return plane.FreePort()
	default:
		return 0, err
	}
}

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

// PlaceEtcd decides where the etcd of cluster o runs and, on the host, on
// which port: a Cluster that exists keeps its etcd where it was made (an
// etcd that moved would start empty, and a changed KubeadmControlPlane
// would roll out), which o.HostEtcd may then only confirm, unless
// o.EtcdFollowsCluster makes it a default; a new Cluster's etcd on the
// host gets a free port of this host.
func PlaceEtcd(ctx context.Context, c client.Client, o ClusterOptions) (ClusterOptions, error) {
	cluster := &clusterv1.Cluster{}
	switch err := c.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Name}, cluster); {
	case apierrors.IsNotFound(err):
		cluster = nil
	case err != nil:
		return o, err
	}
	return placeEtcd(o, cluster, plane.FreePort)
}

// placeEtcd is PlaceEtcd with the Cluster read (nil: none yet).
func placeEtcd(o ClusterOptions, cluster *clusterv1.Cluster, freePort func() (int, error)) (ClusterOptions, error) {
	if cluster == nil {
		if !o.HostEtcd {
			return o, nil
		}
		port, err := freePort()
		o.HostEtcdPort = port
		return o, err
	}
	value, onHost := cluster.Annotations[plane.HostEtcdPortAnnotation]
	switch {
	case onHost == o.HostEtcd:
	case !o.EtcdFollowsCluster && onHost:
		return o, fmt.Errorf("cluster %s/%s exists with its etcd on the host; its etcd cannot move into its machines", o.Namespace, o.Name)
	case !o.EtcdFollowsCluster:
		return o, fmt.Errorf("cluster %s/%s exists with an etcd of its own; its etcd cannot move to the host", o.Namespace, o.Name)
	default:
		o = o.TCGEtcdOnHost(onHost)
	}
	if !onHost {
		return o, nil
	}
	port, err := plane.ParseHostEtcdPort(value)
	if err != nil {
		return o, fmt.Errorf("cluster %s/%s: %w", o.Namespace, o.Name, err)
	}
	o.HostEtcdPort = port
	return o, nil
}

// TCGEtcdOnHost moves the etcd of a TCG-tuned o to the host (or back into
// its control-plane machines); the profile's leader election, which
// depends on where etcd runs, follows.
func (o ClusterOptions) TCGEtcdOnHost(onHost bool) ClusterOptions {
	o.HostEtcd = onHost
	o.LeaderElect = tcgLeaderElect(o)
	return o
}

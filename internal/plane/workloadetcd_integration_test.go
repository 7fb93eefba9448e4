package plane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
)

// TestHostEtcdFollowsItsCluster runs the plane's host etcds against a real
// kube-apiserver and the real etcd binary: a Cluster with
// HostEtcdPortAnnotation gets an etcd on that port that answers a client
// holding the certificate of the Secrets Cluster API reads for an external
// etcd (owned by the Cluster) and refuses one without; a Cluster with an
// unusable port gets none; a mistyped annotation keeps the data of a
// Cluster that exists; once the Cluster is gone its etcd stops and its
// directory is removed.
func TestHostEtcdFollowsItsCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Fatal("KUBEBUILDER_ASSETS is unset: run through `make test`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env, err := StartEnvironment(assets)
	must(t, err)
	t.Cleanup(func() { must(t, env.Stop()) })
	c, err := planeClient(env.Config)
	must(t, err)
	w := &workloadEtcds{
		c: c, stateDir: t.TempDir(), binary: filepath.Join(assets, "etcd"),
		running: map[types.NamespacedName]*workloadEtcd{}, refused: map[types.NamespacedName]string{},
	}
	t.Cleanup(w.stopAll)

	port, err := FreePort()
	must(t, err)
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: "etcd-on-host", Annotations: map[string]string{HostEtcdPortAnnotation: strconv.Itoa(port)},
	}, Spec: clusterv1.ClusterSpec{Paused: ptr.To(true)}}
	unusable := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: "unusable-port", Annotations: map[string]string{HostEtcdPortAnnotation: "80"},
	}, Spec: clusterv1.ClusterSpec{Paused: ptr.To(true)}}
	for _, obj := range []*clusterv1.Cluster{cluster, unusable} {
		must(t, c.Create(ctx, obj))
	}
	must(t, w.sync(ctx))

	key := client.ObjectKeyFromObject(cluster)
	if _, ok := w.running[client.ObjectKeyFromObject(unusable)]; ok {
		t.Errorf("an etcd runs for Cluster %s, whose port is 80", unusable.Name)
	}
	secrets := map[secret.Purpose]*corev1.Secret{}
	for _, purpose := range []secret.Purpose{secret.EtcdCA, secret.APIServerEtcdClient} {
		s := &corev1.Secret{}
		must(t, c.Get(ctx, client.ObjectKey{Namespace: "default", Name: secret.Name(cluster.Name, purpose)}, s))
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != cluster.UID {
			t.Errorf("Secret %s is owned by %v, want the Cluster (%s)", s.Name, s.OwnerReferences, cluster.UID)
		}
		secrets[purpose] = s
	}
	if key := secrets[secret.EtcdCA].Data[secret.TLSKeyDataName]; len(key) != 0 {
		t.Errorf("Secret %s holds the authority's key", secrets[secret.EtcdCA].Name)
	}

	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(secrets[secret.EtcdCA].Data[secret.TLSCrtDataName]) {
		t.Fatal("the etcd CA Secret holds no certificate")
	}
	pair, err := tls.X509KeyPair(secrets[secret.APIServerEtcdClient].Data[secret.TLSCrtDataName],
		secrets[secret.APIServerEtcdClient].Data[secret.TLSKeyDataName])
	must(t, err)
	health := fmt.Sprintf("https://127.0.0.1:%d/health", port)
	client := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: roots, ServerName: HostEtcdName, Certificates: certs, MinVersion: tls.VersionTLS12,
		}}}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := getOK(ctx, client(pair), health)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the host etcd of %s never answered %s: %v\n%s", key, health, err, tail(filepath.Join(w.dir(key), "etcd.log"), 20))
		}
		time.Sleep(time.Second)
	}
	if err := getOK(ctx, client(), health); err == nil {
		t.Errorf("%s answered a client without a certificate", health)
	}

	// A mistyped annotation on a Cluster that exists keeps its etcd's data.
	mistyped := cluster.DeepCopy()
	mistyped.Annotations[HostEtcdPortAnnotation] = "not a port"
	must(t, c.Update(ctx, mistyped))
	must(t, w.sync(ctx))
	if _, err := os.Stat(filepath.Join(w.dir(key), "data")); err != nil {
		t.Errorf("the data of Cluster %s's etcd after its annotation was mistyped: %v", key, err)
	}

	must(t, c.Delete(ctx, cluster))
	must(t, w.sync(ctx))
	if _, ok := w.running[key]; ok {
		t.Errorf("the etcd of deleted Cluster %s still runs", key)
	}
	if _, err := os.Stat(w.dir(key)); !os.IsNotExist(err) {
		t.Errorf("the directory of deleted Cluster %s's etcd is still there (%v)", key, err)
	}
	if err := getOK(ctx, client(pair), health); err == nil {
		t.Errorf("%s still answers after its Cluster is gone", health)
	}
}

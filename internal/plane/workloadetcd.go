package plane

import (
	"context"
	"errors"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/secret"
)

// HostEtcdPortAnnotation, on a Cluster of the plane, has the plane run that
// cluster's etcd on this host, as kubeadm's external etcd, serving the
// cluster's guests on the port it names. Under TCG a guest's etcd is the
// part of a control plane that a rollout cannot starve: a joining member
// must catch up and be promoted within kubeadm's 2 s calls, and while it
// does every write of the cluster waits for it (docs/tcg.md, "etcd on the
// host"). On the host it runs natively, and a new control-plane machine
// joins without an etcd member of its own.
const HostEtcdPortAnnotation = "plane.libvirt.infrastructure.cluster.x-k8s.io/host-etcd-port"

// HostEtcdName is the name guests reach the host's etcd by, and the name
// its serving certificate is for. The host's address on a cluster's network
// is not known when the cluster is rendered (the provider picks a free
// /24), so a preKubeadmCommand maps the name to the guest's default
// gateway, which on the provider's NAT network is the host.
const HostEtcdName = "capl-host-etcd"

const (
	// workloadEtcdDirName holds, per namespace and cluster, each host
	// etcd's data, certificates and log.
	workloadEtcdDirName = "workload-etcd"
	// workloadEtcdSyncInterval is how often the plane compares the etcds
	// it runs with the Clusters that ask for one.
	workloadEtcdSyncInterval = 5 * time.Second
	// workloadEtcdStopGrace is how long an etcd has to stop on SIGTERM.
	workloadEtcdStopGrace = 10 * time.Second
	// workloadEtcdPortName, in an etcd's directory, is the port it serves.
	workloadEtcdPortName = "port"
)

// workloadEtcds runs one etcd per Cluster that carries
// HostEtcdPortAnnotation, each with an authority of its own: a cluster's
// API server reaches its own etcd only. An etcd outlives its Cluster's
// deletion until the Cluster is gone (its machines' API servers use it
// while they drain), and then it is stopped and its directory removed,
// unless `clusterctl move` took the cluster elsewhere (Scope.handedOver):
// the moved cluster still keeps its data here.
type workloadEtcds struct {
	c        client.Client
	stateDir string
	binary   string
	running  map[types.NamespacedName]*workloadEtcd
	// refused remembers the Clusters whose annotation was logged as
	// unusable, so that the log says it once.
	refused map[types.NamespacedName]string
}

// workloadEtcd is one running etcd and the port it serves.
type workloadEtcd struct {
	port  int
	child *child
}

// serveWorkloadEtcds keeps the host etcds in step with the plane's Clusters
// until ctx ends, then stops them, keeping their data.
func serveWorkloadEtcds(ctx context.Context, c client.Client, stateDir, assets string) {
	w := &workloadEtcds{
		c: c, stateDir: stateDir, binary: filepath.Join(assets, "etcd"),
		running: map[types.NamespacedName]*workloadEtcd{}, refused: map[types.NamespacedName]string{},
	}
	defer w.stopAll()
	for {
		if err := w.sync(ctx); err != nil && ctx.Err() == nil {
			log.Printf("host etcds: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(workloadEtcdSyncInterval):
		}
	}
}

// HostEtcdDir is where the plane of stateDir keeps the data, certificates
// and log of the etcd it runs for Cluster namespace/name; it is removed
// with the Cluster.
func HostEtcdDir(stateDir, namespace, name string) string {
	return filepath.Join(stateDir, workloadEtcdDirName, namespace, name)
}

// dir is where the etcd of cluster key keeps its data, certificates and log.
func (w *workloadEtcds) dir(key types.NamespacedName) string {
	return HostEtcdDir(w.stateDir, key.Namespace, key.Name)
}

// sync starts the etcd of every Cluster that asks for one and stops (and
// removes) those whose Cluster is gone. Nothing is removed unless the
// Clusters were listed.
func (w *workloadEtcds) sync(ctx context.Context) error {
	var clusters clusterv1.ClusterList
	if err := w.c.List(ctx, &clusters); err != nil {
		return fmt.Errorf("listing Clusters: %w", err)
	}
	// A Cluster that exists keeps its etcd's data whatever its annotation
	// says now: a removed or mistyped annotation must not wipe a cluster.
	exists := map[types.NamespacedName]bool{}
	var errs []error
	for i := range clusters.Items {
		cluster := &clusters.Items[i]
		key := client.ObjectKeyFromObject(cluster)
		exists[key] = true
		value, ok := cluster.Annotations[HostEtcdPortAnnotation]
		if !ok {
			continue
		}
		port, err := ParseHostEtcdPort(value)
		if err != nil {
			if w.refused[key] != value {
				log.Printf("host etcd of Cluster %s: %v", key, err)
				w.refused[key] = value
			}
			continue
		}
		if err := w.ensure(ctx, cluster, port); err != nil {
			errs = append(errs, fmt.Errorf("Cluster %s: %w", key, err))
		}
	}
	for _, key := range w.known() {
		if !exists[key] {
			errs = append(errs, w.remove(key))
		}
	}
	return errors.Join(errs...)
}

// ParseHostEtcdPort reads HostEtcdPortAnnotation's value.
func ParseHostEtcdPort(value string) (int, error) {
	port, err := strconv.Atoi(value)
	if err != nil || port < 1024 || port > 65535 {
		return 0, fmt.Errorf("%s: %q is not a port from 1024 to 65535", HostEtcdPortAnnotation, value)
	}
	return port, nil
}

// known are the clusters that have a running etcd or a directory.
func (w *workloadEtcds) known() []types.NamespacedName {
	keys := map[types.NamespacedName]bool{}
	for key := range w.running {
		keys[key] = true
	}
	namespaces, _ := os.ReadDir(filepath.Join(w.stateDir, workloadEtcdDirName))
	for _, ns := range namespaces {
		clusters, _ := os.ReadDir(filepath.Join(w.stateDir, workloadEtcdDirName, ns.Name()))
		for _, c := range clusters {
			keys[types.NamespacedName{Namespace: ns.Name(), Name: c.Name()}] = true
		}
	}
	return slices.Collect(maps.Keys(keys))
}

// ensure makes cluster's certificates and Secrets and runs its etcd on port.
func (w *workloadEtcds) ensure(ctx context.Context, cluster *clusterv1.Cluster, port int) error {
	key := client.ObjectKeyFromObject(cluster)
	dir := w.dir(key)
	pki := etcdPKI(filepath.Join(dir, "pki"))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// Made once and never renewed: the cluster's machines hold this
	// authority, and a new one would cut their API servers off. The CA is
	// written last, so a set with it is whole.
	if _, err := os.Stat(pki.path(etcdCAName)); errors.Is(err, os.ErrNotExist) {
		if err := ensureEtcdPKI(string(pki), time.Now(), HostEtcdName); err != nil {
			return fmt.Errorf("certificates: %w", err)
		}
	}
	if cluster.DeletionTimestamp.IsZero() {
		if err := w.ensureSecrets(ctx, cluster, pki); err != nil {
			return err
		}
	}
	return w.run(key, port)
}

// run keeps the etcd of cluster key running on port, its directory made
// by ensure; the port is kept in the directory for a moved cluster's etcd,
// which no Cluster names any more.
func (w *workloadEtcds) run(key types.NamespacedName, port int) error {
	dir := w.dir(key)
	if e := w.running[key]; e != nil {
		if e.port == port && e.child.running() {
			return nil
		}
		if e.port == port {
			log.Printf("host etcd of Cluster %s exited (%v); starting it again", key, e.child.err)
		}
		_ = e.child.stop(workloadEtcdStopGrace)
		delete(w.running, key)
	}
	if err := writeFileAtomic(filepath.Join(dir, workloadEtcdPortName), []byte(strconv.Itoa(port))); err != nil {
		return err
	}
	child, err := startChild("etcd of "+key.String(), w.binary, workloadEtcdArgs(dir, etcdPKI(filepath.Join(dir, "pki")), port), nil, filepath.Join(dir, "etcd.log"))
	if err != nil {
		return err
	}
	w.running[key] = &workloadEtcd{port: port, child: child}
	log.Printf("host etcd of Cluster %s serving https://%s:%d (data in %s)", key, HostEtcdName, port, dir)
	return nil
}

// workloadEtcdArgs are a host etcd's flags: clients on every address of
// the host, since the guests reach it through their network's gateway, all
// with a client certificate of the cluster's own authority; its peer port
// on loopback, picked by the kernel, since the one member has no peers.
// The progress notifications are those of the TCG profile's guest etcd:
// each wakes the guest API server for every watch.
func workloadEtcdArgs(dir string, pki etcdPKI, port int) []string {
	url := fmt.Sprintf("https://%s:%d", HostEtcdName, port)
	return []string{
		"--name=" + HostEtcdName,
		"--data-dir=" + filepath.Join(dir, "data"),
		fmt.Sprintf("--listen-client-urls=https://0.0.0.0:%d", port),
		"--advertise-client-urls=" + url,
		"--listen-peer-urls=http://127.0.0.1:0",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=" + HostEtcdName + "=http://127.0.0.1:2380",
		"--cert-file=" + pki.path(etcdServerCertName),
		"--key-file=" + pki.path(etcdServerKeyName),
		"--trusted-ca-file=" + pki.path(etcdCAName),
		"--client-cert-auth=true",
		"--watch-progress-notify-interval=60s",
	}
}

// ensureSecrets creates the Secrets Cluster API's kubeadm providers read
// for an external etcd: `<cluster>-etcd` with the authority's certificate
// (no key: nothing else is ever issued) and `<cluster>-apiserver-etcd-client`
// with the API server's client certificate. They are owned by the Cluster,
// so they go with it; one that exists is left as it is.
func (w *workloadEtcds) ensureSecrets(ctx context.Context, cluster *clusterv1.Cluster, pki etcdPKI) error {
	for purpose, files := range map[secret.Purpose][]string{
		secret.EtcdCA:              {etcdCAName},
		secret.APIServerEtcdClient: {etcdClientCertName, etcdClientKeyName},
	} {
		data := map[string][]byte{}
		for i, name := range files {
			b, err := os.ReadFile(pki.path(name))
			if err != nil {
				return err
			}
			data[[]string{secret.TLSCrtDataName, secret.TLSKeyDataName}[i]] = b
		}
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: cluster.Namespace, Name: secret.Name(cluster.Name, purpose),
				Labels: map[string]string{clusterv1.ClusterNameLabel: cluster.Name},
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID,
				}},
			},
			Type: clusterv1.ClusterSecretType,
			Data: data,
		}
		if err := w.c.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating Secret %s: %w", s.Name, err)
		}
	}
	return nil
}

// remove stops the etcd of a Cluster that is gone and removes its
// directory, unless the cluster was moved to another management cluster:
// then its etcd runs on, on the port it had.
func (w *workloadEtcds) remove(key types.NamespacedName) error {
	if scope, err := readScope(w.stateDir); err == nil && scope.handedOver(key.Namespace) {
		raw, err := os.ReadFile(filepath.Join(w.dir(key), workloadEtcdPortName))
		if err != nil {
			return fmt.Errorf("the host etcd of moved Cluster %s: %w", key, err)
		}
		port, err := ParseHostEtcdPort(strings.TrimSpace(string(raw)))
		if err != nil {
			return fmt.Errorf("the host etcd of moved Cluster %s: %w", key, err)
		}
		return w.run(key, port)
	}
	if e := w.running[key]; e != nil {
		if err := e.child.stop(workloadEtcdStopGrace); err != nil {
			return err
		}
		delete(w.running, key)
	}
	if err := os.RemoveAll(w.dir(key)); err != nil {
		return err
	}
	log.Printf("host etcd of Cluster %s stopped and its data removed: the Cluster is gone", key)
	_ = os.Remove(filepath.Dir(w.dir(key)))
	return nil
}

// stopAll stops every running etcd, keeping its data for the plane's next
// start.
func (w *workloadEtcds) stopAll() {
	for key, e := range w.running {
		if err := e.child.stop(workloadEtcdStopGrace); err != nil {
			log.Printf("stopping the host etcd of Cluster %s: %v", key, err)
		}
	}
}

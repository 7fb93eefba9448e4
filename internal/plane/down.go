package plane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const (
	// clusterDeleteTimeout bounds Down's wait for Cluster API to delete
	// the clusters; what is left after it is swept from libvirt directly.
	clusterDeleteTimeout = 10 * time.Minute
	// imageVolumePrefix starts the names of base images the provider
	// imports (pkg/naming.ImageVolumeName).
	imageVolumePrefix = virt.NamePrefix + "image-sha256-"
)

// SweepReport lists what a sweep removed from libvirt.
type SweepReport struct {
	// Domains, Networks and Volumes ("pool/name") that were deleted.
	Domains, Networks, Volumes []string
	// Pools that were removed because they were empty.
	Pools []string
	// Kept explains what was found but left in place, one line each.
	Kept []string
}

// Empty tells whether the sweep removed nothing.
func (r SweepReport) Empty() bool {
	return len(r.Domains)+len(r.Networks)+len(r.Volumes)+len(r.Pools) == 0
}

// Sweep deletes every domain, network and volume pkg/virt's ListOwned
// reports on the host at libvirtURI, except volumes named with
// virt.TestNamePrefix (test runs clean up after themselves). Base images
// (capl-image-sha256-*) go only with includeImages, and only from pools
// left without machine volumes. Pools left empty are removed.
func Sweep(ctx context.Context, libvirtURI string, includeImages bool) (SweepReport, error) {
	return sweep(ctx, libvirtURI, includeImages, func(o virt.OwnedObject) bool {
		return !strings.HasPrefix(o.Name, virt.TestNamePrefix)
	}, nil)
}

// SweepScope deletes what Sweep would, restricted to objects of s's
// namespaces that were not handed over to another management cluster;
// base images and empty pools only in s's pools (and never while another
// plane's machine volumes are there).
func SweepScope(ctx context.Context, libvirtURI string, s Scope, includeImages bool) (SweepReport, error) {
	return sweep(ctx, libvirtURI, includeImages, s.contains, s.Pools)
}

// contains tells whether o belongs to one of the scope's namespaces that
// were not handed over: domains and networks by their owner metadata,
// volumes by their name, capl-<namespace>.<object>… (Kubernetes
// namespaces contain no '.').
func (s Scope) contains(o virt.OwnedObject) bool {
	ns := ""
	if o.Owner != nil {
		ns = o.Owner.Namespace
	} else if rest, ok := strings.CutPrefix(o.Name, virt.NamePrefix); ok {
		ns, _, _ = strings.Cut(rest, ".")
	}
	return ns != "" && slices.Contains(s.Namespaces, ns) && !s.handedOver(ns)
}

// handedOver tells whether `clusterctl move` took objects of namespace ns
// to another management cluster (and they did not come back): everything
// of ns in libvirt is that cluster's now.
func (s Scope) handedOver(ns string) bool {
	return slices.ContainsFunc(s.MovedAway, func(m MovedObject) bool { return m.Namespace == ns })
}

// sweep deletes the owned objects match accepts: domains first (they hold
// volumes and networks), then volumes, then networks; then base images of
// pools with no machine volume left, then empty pools. imagePools limits
// the last two steps; nil means every pool.
func sweep(ctx context.Context, libvirtURI string, includeImages bool, match func(virt.OwnedObject) bool, imagePools []string) (SweepReport, error) {
	var rep SweepReport
	host, err := virt.Dial(ctx, libvirtURI)
	if err != nil {
		return rep, fmt.Errorf("connecting to libvirt at %s: %w", libvirtURI, err)
	}
	defer host.Close()
	owned, err := host.ListOwned(ctx)
	if err != nil {
		return rep, err
	}
	var errs []error
	pools := map[string]bool{}
	for _, kind := range []virt.OwnedKind{virt.OwnedDomain, virt.OwnedVolume, virt.OwnedNetwork} {
		for _, o := range owned {
			if o.Kind != kind || strings.HasPrefix(o.Name, imageVolumePrefix) || !match(o) {
				continue
			}
			switch kind {
			case virt.OwnedDomain:
				err = host.DeleteDomain(ctx, o.Name)
				rep.Domains = appendIf(rep.Domains, o.Name, err)
			case virt.OwnedVolume:
				pools[o.Pool] = true
				err = host.DeleteVolume(ctx, o.Pool, o.Name)
				rep.Volumes = appendIf(rep.Volumes, o.Pool+"/"+o.Name, err)
			case virt.OwnedNetwork:
				err = host.DeleteNetwork(ctx, o.Name)
				rep.Networks = appendIf(rep.Networks, o.Name, err)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("deleting %s %s: %w", kind, o.Name, err))
			}
		}
	}
	for _, p := range imagePools {
		pools[p] = true
	}
	if imagePools != nil {
		for p := range pools {
			if !slices.Contains(imagePools, p) {
				delete(pools, p)
			}
		}
	}
	if !includeImages {
		return rep, errors.Join(errs...)
	}
	// Base images are shared by every machine of a pool: they go only
	// when no machine volume is left in the pool, so that no overlay loses
	// its backing file.
	left, err := host.ListOwned(ctx)
	if err != nil {
		return rep, errors.Join(append(errs, err)...)
	}
	inUse := map[string]bool{}
	for _, o := range left {
		if o.Kind == virt.OwnedVolume && !strings.HasPrefix(o.Name, imageVolumePrefix) {
			inUse[o.Pool] = true
		}
	}
	for _, o := range left {
		if o.Kind != virt.OwnedVolume || !strings.HasPrefix(o.Name, imageVolumePrefix) {
			continue
		}
		if imagePools != nil && !slices.Contains(imagePools, o.Pool) {
			continue
		}
		pools[o.Pool] = true
		if inUse[o.Pool] {
			rep.Kept = append(rep.Kept, fmt.Sprintf("base image %s/%s: machine volumes of other clusters remain in the pool", o.Pool, o.Name))
			continue
		}
		err := host.DeleteVolume(ctx, o.Pool, o.Name)
		rep.Volumes = appendIf(rep.Volumes, o.Pool+"/"+o.Name, err)
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting base image %s/%s: %w", o.Pool, o.Name, err))
		}
	}
	for p := range pools {
		if inUse[p] {
			continue
		}
		if err := host.DeletePool(ctx, p); err != nil {
			rep.Kept = append(rep.Kept, fmt.Sprintf("storage pool %s: %v", p, err))
			continue
		}
		rep.Pools = append(rep.Pools, p)
	}
	return rep, errors.Join(errs...)
}

func appendIf(list []string, name string, err error) []string {
	if err != nil {
		return list
	}
	return append(list, name)
}

// Down tears the plane of o.StateDir down: when it runs, it records the
// namespaces and pools of its clusters (scope.json), deletes every Cluster
// API Cluster (Cluster API deletes its machines and infrastructure first) and waits (up to 10 minutes) for
// them to be gone, then stops the plane. It then sweeps libvirt: the
// recorded scope (or everything ListOwned returns, with o.SweepAll),
// including base images, and removes the state directory. It works when the
// plane is not running or the state directory is partial; with neither a
// running plane nor a recorded scope nothing is swept unless o.SweepAll.
func Down(ctx context.Context, o Options) (SweepReport, error) {
	o = o.withDefaults()
	dir := o.StateDir
	if p, err := Attach(dir); err == nil {
		if err := p.recordScope(ctx); err != nil {
			o.Log("could not record the plane's namespaces: %v", err)
		}
		if err := p.deleteClusters(ctx, o.Log); err != nil {
			o.Log("%v; sweeping libvirt directly", err)
		}
		o.Log("stopping the management plane")
		if err := p.Stop(ctx); err != nil {
			return SweepReport{}, err
		}
	} else if servePID(dir) != 0 {
		o.Log("management plane not ready (%v); stopping it", err)
		if err := stopServe(ctx, dir); err != nil {
			return SweepReport{}, err
		}
	} else {
		o.Log("management plane not running")
	}
	if err := stopOrphanedControlPlane(dir, o.Log); err != nil {
		return SweepReport{}, err
	}

	var rep SweepReport
	scope, err := readScope(dir)
	switch {
	case err != nil:
		return rep, err
	case o.SweepAll:
		o.Log("sweeping every object of the provider on %s", o.LibvirtURI)
		rep, err = Sweep(ctx, o.LibvirtURI, true)
	case scope.empty():
		o.Log("no record of the plane's namespaces in %s: nothing swept (`capl-dev down --all` removes every object of the provider on the host)", dir)
	default:
		for _, ns := range scope.Namespaces {
			if scope.handedOver(ns) {
				o.Log("namespace %s was moved to another management cluster (clusterctl move): its libvirt objects are left to it", ns)
			}
		}
		o.Log("sweeping namespaces %v and pools %v on %s", scope.Namespaces, scope.Pools, o.LibvirtURI)
		rep, err = SweepScope(ctx, o.LibvirtURI, scope, true)
	}
	if err != nil {
		return rep, err
	}
	return rep, removeStateDir(dir)
}

// recordScope adds the namespaces and pools of the plane's clusters and
// machines to scope.json, before they are deleted.
func (p *Plane) recordScope(ctx context.Context) error {
	return recordLiveScope(ctx, p.Client, p.StateDir)
}

// recordLiveScope adds the namespaces and pools of the Clusters,
// LibvirtClusters and LibvirtMachines c lists to dir's scope.json.
func recordLiveScope(ctx context.Context, c client.Client, dir string) error {
	listedAt := time.Now()
	var s Scope
	var clusters clusterv1.ClusterList
	if err := c.List(ctx, &clusters); err != nil {
		return err
	}
	for _, c := range clusters.Items {
		s.add(c.Namespace, "")
	}
	var lcs infrav1.LibvirtClusterList
	if err := c.List(ctx, &lcs); err != nil {
		return err
	}
	for _, lc := range lcs.Items {
		pool := lc.Spec.StoragePool.Name
		if pool == "" {
			pool = infrav1.DefaultStoragePoolName
		}
		s.add(lc.Namespace, pool)
	}
	var lms infrav1.LibvirtMachineList
	if err := c.List(ctx, &lms); err != nil {
		return err
	}
	var live []MovedObject
	for _, lm := range lms.Items {
		s.add(lm.Namespace, "")
		if v := lm.Spec.Image.Volume; v != nil {
			s.add("", v.Pool)
		}
		live = append(live, MovedObject{Kind: kindLibvirtMachine, Namespace: lm.Namespace, Name: lm.Name})
	}
	for _, lc := range lcs.Items {
		live = append(live, MovedObject{Kind: kindLibvirtCluster, Namespace: lc.Namespace, Name: lc.Name})
	}
	return recordScope(dir, s, live, listedAt)
}

// deleteClusters deletes every Cluster and waits for them to be gone.
// Cluster API's Cluster controller deletes the MachineDeployments, Machines
// and infrastructure itself before it lets the Cluster go; the garbage
// collector then removes what else the Cluster owned.
func (p *Plane) deleteClusters(ctx context.Context, logf func(string, ...any)) error {
	var clusters clusterv1.ClusterList
	if err := p.Client.List(ctx, &clusters); err != nil {
		return err
	}
	if len(clusters.Items) == 0 {
		return nil
	}
	for i := range clusters.Items {
		c := &clusters.Items[i]
		logf("deleting Cluster %s/%s", c.Namespace, c.Name)
		if err := p.Client.Delete(ctx, c, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, clusterDeleteTimeout)
	defer cancel()
	last := ""
	for {
		progress, done, err := p.deletionProgress(ctx)
		if err == nil && done {
			logf("clusters deleted in %s", time.Since(start).Round(time.Second))
			return nil
		}
		if err == nil && progress != last {
			logf("%s  waiting: %s", time.Since(start).Round(time.Second), progress)
			last = progress
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("clusters not deleted after %s (%s)", clusterDeleteTimeout, last)
		case <-time.After(2 * time.Second):
		}
	}
}

// deletionProgress counts what is left of the clusters being deleted.
func (p *Plane) deletionProgress(ctx context.Context) (string, bool, error) {
	count := func(l client.ObjectList) (int, error) {
		if err := p.Client.List(ctx, l); err != nil {
			return 0, err
		}
		return meta.LenList(l), nil
	}
	var parts []string
	total := 0
	for _, k := range []struct {
		name string
		list client.ObjectList
	}{
		{"Clusters", &clusterv1.ClusterList{}},
		{"Machines", &clusterv1.MachineList{}},
		{"LibvirtMachines", &infrav1.LibvirtMachineList{}},
		{"LibvirtClusters", &infrav1.LibvirtClusterList{}},
	} {
		n, err := count(k.list)
		if err != nil {
			return "", false, err
		}
		total += n
		parts = append(parts, fmt.Sprintf("%d %s", n, k.name))
	}
	return strings.Join(parts, ", "), total == 0, nil
}

// removeStateDir removes a plane's state directory, refusing a directory
// that holds anything but the plane's files (a mistyped --state-dir=/ must
// not wipe the host).
func removeStateDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	known := []string{etcdDirName, etcdCertsDirName, kubeconfigName, servePIDName, serveLogName, managerPIDName, managerLogName,
		webhookCertsName, endpointsFileName, scopeFileName, serviceAccountKeyName, encryptionConfigName,
		kcmKubeconfigName, kcmPIDName, kcmLogName, CLIStateFile, registryDirName, libvirtTLSDirName, workloadEtcdDirName}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".tmp")
		if !slices.Contains(known, name) && !strings.HasSuffix(name, workloadKubeconfigSuffix) {
			return fmt.Errorf("not removing %s: %s is not a file of the management plane", dir, filepath.Join(dir, e.Name()))
		}
	}
	return os.RemoveAll(dir)
}

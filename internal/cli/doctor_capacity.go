package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// sizes are what a command's VMs ask of the host.
type sizes struct {
	vms int
	// planeMiB is what the plane's processes take when it is to start.
	planeMiB int64
	// memoryMiB is the guests' memory; tcgCacheMiB what QEMU's TCG
	// translation caches add on the host (0 under KVM).
	memoryMiB, tcgCacheMiB int64
	// diskGiB is what the VMs' overlays may grow to; images the bytes of
	// base images still to import.
	diskGiB int64
	images  int64
	// pool is the directory of the storage pool.
	pool string
}

func (s *sizes) add(o sizes) {
	s.vms += o.vms
	s.memoryMiB += o.memoryMiB
	s.tcgCacheMiB += o.tcgCacheMiB
	s.diskGiB += o.diskGiB
	s.images += o.images
	if o.pool != "" {
		s.pool = o.pool
	}
}

func poolPath(pool string) string {
	if pool == "" {
		pool = "capi-libvirt"
	}
	return filepath.Join("/var/lib/libvirt", pool)
}

// clusterSizes renders the cluster (images by placeholder) and adds up
// what its machines and load balancer ask for.
func clusterSizes(o devplane.ClusterOptions) (sizes, error) {
	// Every machine exists in the end: count the workers the staging
	// creates later.
	o.StagedWorkers = false
	o.HostEtcdPort = 2379 // sizes only
	placeholder := devplane.ClusterImage{Volume: "doctor"}
	objs, err := devplane.RenderCluster(o, devplane.ClusterVariables(o, devplane.ClusterImages{Node: placeholder, LoadBalancer: placeholder}))
	if err != nil {
		return sizes{}, err
	}
	return objectSizes(objs, o.DomainType == "qemu"), nil
}

// objectSizes adds up the machines of a rendered cluster: each
// KubeadmControlPlane's and MachineDeployment's replicas times its
// LibvirtMachineTemplate, and each LibvirtCluster's HAProxy VM.
func objectSizes(objs []*unstructured.Unstructured, tcg bool) sizes {
	templates := map[string]*unstructured.Unstructured{}
	for _, u := range objs {
		if u.GetKind() == "LibvirtMachineTemplate" {
			templates[u.GetName()] = u
		}
	}
	var s sizes
	machine := func(replicas int64, spec map[string]any) {
		mem, _, _ := unstructured.NestedInt64(spec, "memoryMiB")
		disk, _, _ := unstructured.NestedInt64(spec, "diskSizeGiB")
		cache, _, _ := unstructured.NestedInt64(spec, "tcgTranslationCacheMiB")
		s.vms += int(replicas)
		s.memoryMiB += replicas * mem
		s.diskGiB += replicas * disk
		if tcg {
			s.tcgCacheMiB += replicas * cache
		}
	}
	for _, u := range objs {
		var replicas int64
		var ref string
		switch u.GetKind() {
		case "KubeadmControlPlane":
			replicas, _, _ = unstructured.NestedInt64(u.Object, "spec", "replicas")
			ref, _, _ = unstructured.NestedString(u.Object, "spec", "machineTemplate", "spec", "infrastructureRef", "name")
		case "MachineDeployment":
			replicas, _, _ = unstructured.NestedInt64(u.Object, "spec", "replicas")
			ref, _, _ = unstructured.NestedString(u.Object, "spec", "template", "spec", "infrastructureRef", "name")
		case "LibvirtCluster":
			lb, _, _ := unstructured.NestedMap(u.Object, "spec", "loadBalancer")
			if t, _, _ := unstructured.NestedString(lb, "type"); t == "None" {
				continue
			}
			if _, ok := lb["memoryMiB"]; !ok {
				lb["memoryMiB"] = int64(512) // the webhook's default
			}
			if _, ok := lb["tcgTranslationCacheMiB"]; !ok {
				lb["tcgTranslationCacheMiB"] = int64(devplane.DefaultTCGCacheMiB)
			}
			machine(1, lb)
			continue
		default:
			continue
		}
		if t := templates[ref]; t != nil {
			spec, _, _ := unstructured.NestedMap(t.Object, "spec", "template", "spec")
			machine(replicas, spec)
		}
	}
	return s
}

// standInSizes: every stand-in VM, load balancer included, is 1 vCPU
// and 512 MiB with the default TCG cache.
func standInSizes(o devplane.DemoOptions) sizes {
	n := int64(o.ControlPlane + o.Workers + 1)
	s := sizes{vms: int(n), memoryMiB: 512 * n, diskGiB: 2 * n}
	if o.DomainType == "qemu" {
		s.tcgCacheMiB = int64(o.TCGCacheMiB) * n
	}
	return s
}

// runningMemoryMiB is the memory of the running domains of cluster
// namespace/name: a second run of up finds its VMs already holding it.
func runningMemoryMiB(ctx context.Context, host *virt.Client, namespace, name string) int64 {
	owned, err := host.ListOwned(ctx)
	if err != nil {
		return 0
	}
	var mib int64
	for _, o := range owned {
		if o.Kind == virt.OwnedDomain && o.Owner != nil && o.Owner.Namespace == namespace && o.Owner.Cluster == name {
			mib += o.MemoryMiB
		}
	}
	return mib
}

// memoryCheck compares MemAvailable with what the guests ask for: less
// than their memory fails (the last VMs would not start, or the host
// would swap), less than that plus TCG's translation caches warns.
func memoryCheck(want sizes) check {
	avail, err := memAvailableMiB()
	if err != nil {
		return check{"memory", warn, err.Error()}
	}
	if want.memoryMiB < 0 {
		want.memoryMiB = 0
	}
	var parts []string
	if want.vms > 0 {
		parts = append(parts, fmt.Sprintf("%d VMs ask %.1f GiB", want.vms, float64(want.memoryMiB)/1024))
	}
	if want.planeMiB > 0 {
		parts = append(parts, fmt.Sprintf("the plane takes about %.1f GiB", float64(want.planeMiB)/1024))
	}
	if len(parts) == 0 {
		parts = append(parts, "nothing new to start")
	}
	ask := strings.Join(parts, ", ")
	want.memoryMiB += want.planeMiB
	switch {
	case avail < want.memoryMiB:
		return check{"memory", fail, fmt.Sprintf("%.1f GiB available, %s: stop other VMs or ask for fewer or smaller machines (--control-plane, --workers)", float64(avail)/1024, ask)}
	case avail < want.memoryMiB+want.tcgCacheMiB:
		return check{"memory", warn, fmt.Sprintf("%.1f GiB available, %s and their TCG translation caches up to %.1f GiB more", float64(avail)/1024, ask, float64(want.tcgCacheMiB)/1024)}
	}
	return check{"memory", pass, fmt.Sprintf("%.1f GiB available, %s", float64(avail)/1024, ask)}
}

// memAvailableMiB reads MemAvailable from /proc/meminfo.
func memAvailableMiB() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			fields := strings.Fields(v)
			kb, err := strconv.ParseInt(fields[0], 10, 64)
			return kb / 1024, err
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}

// diskCheck compares the free space of the pool's file system with the
// images still to import (needed at once: fails) and the overlays'
// full size (thin, they grow as guests write: warns).
func diskCheck(want sizes, stateDir string) check {
	var lines []string
	verdict := pass
	if want.pool != "" {
		free, where, err := freeBytes(want.pool)
		if err != nil {
			return check{"disk", warn, err.Error()}
		}
		need := want.images + 1<<30
		switch {
		case free < need:
			verdict = fail
			lines = append(lines, fmt.Sprintf("%.1f GiB free on %s, the images to import need %.1f GiB: free space there", gib(free), where, gib(need)))
		case free < want.images+want.diskGiB<<30:
			verdict = warn
			lines = append(lines, fmt.Sprintf("%.1f GiB free on %s: enough to start, but the %d VMs' disks may grow to %d GiB", gib(free), where, want.vms, want.diskGiB))
		default:
			lines = append(lines, fmt.Sprintf("%.1f GiB free on %s for images and %d GiB of disks", gib(free), where, want.diskGiB))
		}
	}
	free, where, err := freeBytes(stateDir)
	if err == nil {
		if free < 1<<30 {
			verdict = max(verdict, warn)
			lines = append(lines, fmt.Sprintf("only %.1f GiB free on %s for etcd and the logs", gib(free), where))
		} else if want.pool == "" {
			lines = append(lines, fmt.Sprintf("%.1f GiB free on %s", gib(free), where))
		}
	}
	return check{"disk", verdict, strings.Join(lines, "; ")}
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// freeBytes is the space available on the file system of path, or of its
// nearest existing parent (the pool's directory may not exist yet).
func freeBytes(path string) (int64, string, error) {
	for p := path; ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return int64(st.Bavail) * st.Bsize, p, nil
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" || p == "." {
			return 0, p, fmt.Errorf("statfs %s: %w", p, err)
		}
	}
}

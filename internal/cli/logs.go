package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Plane files a logs bundle carries. The kubeconfigs, keys and
// certificates of the state directory stay out of it.
var bundledPlaneFiles = []string{"serve.log", "manager.log", "kube-controller-manager.log", "scope.json", "endpoints.json", recordName}

// bundledKinds are the kinds whose objects a bundle carries, one YAML
// file per kind. Secrets are not among them.
var bundledKinds = []schema.GroupVersionKind{
	{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Cluster"},
	{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "ClusterClass"},
	{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "Machine"},
	{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineSet"},
	{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineDeployment"},
	{Group: "cluster.x-k8s.io", Version: "v1beta2", Kind: "MachineHealthCheck"},
	{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmControlPlane"},
	{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmConfig"},
	{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta2", Kind: "KubeadmConfigTemplate"},
	{Group: "addons.cluster.x-k8s.io", Version: "v1beta2", Kind: "ClusterResourceSet"},
	{Group: "addons.cluster.x-k8s.io", Version: "v1beta2", Kind: "ClusterResourceSetBinding"},
	{Group: infrav1.GroupVersion.Group, Version: infrav1.GroupVersion.Version, Kind: "LibvirtCluster"},
	{Group: infrav1.GroupVersion.Group, Version: infrav1.GroupVersion.Version, Kind: "LibvirtClusterTemplate"},
	{Group: infrav1.GroupVersion.Group, Version: infrav1.GroupVersion.Version, Kind: "LibvirtMachine"},
	{Group: infrav1.GroupVersion.Group, Version: infrav1.GroupVersion.Version, Kind: "LibvirtMachineTemplate"},
}

// Guest files of a node a bundle carries, read through the guest agent.
var bundledGuestFiles = map[string]string{
	"cloud-init-output.log": "/var/log/cloud-init-output.log",
	"cloud-init.log":        "/var/log/cloud-init.log",
}

// bootstrapToken matches a kubeadm bootstrap token,
// "abcdef.0123456789abcdef": the join credential a KubeadmConfig's
// discovery.bootstrapToken.token holds and kubeadm init prints in its
// `kubeadm join ... --token` lines (cloud-init's output, the console log).
// No word boundary: a token right after an escaped newline ("\nabcdef.…"
// in a JSON log line) must go too, and a lookalike cut short costs less
// than a token left in.
var bootstrapToken = regexp.MustCompile(`[a-z0-9]{6}\.[a-z0-9]{16}`)

// redacted replaces what redact removes.
const redacted = "<redacted>"

// redact is data without its bootstrap tokens: a bundle is made to be
// handed to someone else, and while a token is valid it lets any machine
// that reaches the API server join the cluster.
func redact(data []byte) []byte {
	return bootstrapToken.ReplaceAll(data, []byte(redacted))
}

// consoleLogLimit bounds the console log read of one VM.
const consoleLogLimit = 64 << 20

func (a *app) logsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "logs [DIR]",
		Short: "Write a tarball of the plane's logs, objects, events and every VM's logs",
		Long: `Writes DIR/capl-dev-logs-<time>.tar.gz (DIR defaults to the current
directory) holding what explains a cluster that does not come up: the plane's
logs (serve.log with Cluster API's controllers, manager.log with the
provider's, kube-controller-manager.log), capl-dev status, every Cluster API
and provider object as YAML (no Secrets), the events, and for each VM its
serial console log, cloud-init's output and the kubelet's and containerd's
journal (through the guest agent). Bootstrap tokens (kubeadm's join
credentials, in KubeadmConfigs and the logs of joining nodes) are replaced by
<redacted> in every file. What cannot be read is listed in errors.txt; the
plane need not run.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			name := "capl-dev-logs-" + time.Now().Format("20060102-150405")
			path := filepath.Join(dir, name+".tar.gz")
			b := newBundle(name)
			a.collect(cmd.Context(), b)
			if err := b.write(path); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "wrote %s: %d files", path, len(b.files))
			if len(b.errs) > 0 {
				fmt.Fprintf(a.out, ", %d things not collected (errors.txt)", len(b.errs))
			}
			fmt.Fprintln(a.out)
			return nil
		},
	}
	return cmd
}

// bundle collects files in memory before they are written.
type bundle struct {
	root  string
	files []bundleFile
	errs  []string
}

type bundleFile struct {
	name string
	data []byte
}

func newBundle(root string) *bundle { return &bundle{root: root} }

func (b *bundle) add(name string, data []byte) {
	b.files = append(b.files, bundleFile{name, data})
}

func (b *bundle) fail(what string, err error) {
	b.errs = append(b.errs, fmt.Sprintf("%s: %v", what, err))
}

// write writes the bundle as a gzipped tarball, 0600: logs name
// addresses and hosts. Every file goes through redact on the way.
func (b *bundle) write(path string) error {
	if len(b.errs) > 0 {
		b.add("errors.txt", []byte(strings.Join(b.errs, "\n")+"\n"))
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	now := time.Now()
	for _, f := range b.files {
		data := redact(f.data)
		hdr := &tar.Header{Name: b.root + "/" + f.name, Mode: 0o600, Size: int64(len(data)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o600)
}

// collect fills b with everything it can read; what fails is noted and
// the rest still collected.
func (a *app) collect(ctx context.Context, b *bundle) {
	for _, f := range bundledPlaneFiles {
		data, err := os.ReadFile(filepath.Join(a.stateDir, f))
		// Only the logs are always there; the rest appear with what
		// they describe (scope.json with the first cluster).
		if err != nil && (!os.IsNotExist(err) || strings.HasSuffix(f, ".log")) {
			b.fail("plane/"+f, err)
		}
		if err == nil {
			b.add("plane/"+f, data)
		}
	}
	p, err := plane.Attach(a.stateDir)
	if err != nil {
		b.fail("the plane's objects", err)
		return
	}
	host, err := a.dial(ctx)
	if err != nil {
		b.fail("libvirt", err)
	}
	if host != nil {
		defer host.Close()
	}

	var status bytes.Buffer
	sa := &app{stateDir: a.stateDir, libvirtURI: a.libvirtURI, uriFlag: a.uriFlag, out: &status, err: &status}
	cmd := sa.statusCommand()
	cmd.SetContext(ctx)
	if err := cmd.RunE(cmd, nil); err != nil {
		b.fail("status", err)
	}
	b.add("status.txt", status.Bytes())

	for _, gvk := range bundledKinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := p.Client.List(ctx, list); err != nil {
			b.fail("objects/"+gvk.Kind, err)
			continue
		}
		if len(list.Items) == 0 {
			continue
		}
		var out bytes.Buffer
		for i := range list.Items {
			u := &list.Items[i]
			u.SetManagedFields(nil)
			data, err := yaml.Marshal(u.Object)
			if err != nil {
				b.fail("objects/"+gvk.Kind, err)
				continue
			}
			out.WriteString("---\n")
			out.Write(data)
		}
		b.add("objects/"+strings.ToLower(gvk.Kind)+"s.yaml", out.Bytes())
	}

	var events corev1.EventList
	if err := p.Client.List(ctx, &events); err != nil {
		b.fail("events", err)
	} else {
		b.add("events.txt", formatEvents(events.Items))
	}

	vms, err := planeVMs(ctx, p.Client, "", "")
	if err != nil {
		b.fail("VMs", err)
		return
	}
	if host == nil {
		return
	}
	for _, vm := range vms {
		a.collectVM(ctx, b, host, p.Client, vm)
	}
}

// collectVM adds one VM's console log, guest files and journal.
func (a *app) collectVM(ctx context.Context, b *bundle, host *virt.Client, c client.Client, vm guestVM) {
	dir := "vms/" + vm.Domain + "/"
	if info, err := host.DomainInfo(ctx, vm.Domain); err != nil {
		b.fail(dir+"domain", err)
	} else {
		b.add(dir+"domain.txt", fmt.Appendf(nil, "name %s\nuuid %s\nstate %s (%s)\nvcpus %d\nmemory %d MiB\nmac %s\nnames %s\n",
			info.Name, info.UUID, info.State, info.Reason, info.VCPUs, info.MemoryMiB, info.MAC, strings.Join(vm.Names, " ")))
	}
	pool := vm.Pool
	if pool == "" {
		pool = poolOfCluster(ctx, c, vm)
	}
	if data, err := host.ReadVolume(ctx, pool, naming.ConsoleLogVolumeName(vm.Domain), consoleLogLimit); err != nil {
		b.fail(dir+"console.log", err)
	} else {
		b.add(dir+"console.log", data)
	}
	names := make([]string, 0, len(bundledGuestFiles))
	for n := range bundledGuestFiles {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		data, err := host.GuestReadFile(ctx, vm.Domain, bundledGuestFiles[n])
		if err != nil {
			b.fail(dir+n, err)
			continue
		}
		b.add(dir+n, data)
	}
	if vm.LoadBalancer {
		a.guestCommand(ctx, b, host, vm, dir+"haproxy.log", "/bin/journalctl", "--no-pager", "-u", "haproxy", "-n", "2000")
		return
	}
	a.guestCommand(ctx, b, host, vm, dir+"kubelet.log", "/bin/journalctl", "--no-pager", "-u", "kubelet", "-u", "containerd", "-n", "5000")
}

// guestCommand adds a command's output in the guest.
func (a *app) guestCommand(ctx context.Context, b *bundle, host *virt.Client, vm guestVM, name, path string, args ...string) {
	res, err := host.GuestExec(ctx, vm.Domain, path, args, nil)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%s exited %d: %s", path, res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	if err != nil {
		b.fail(name, err)
		return
	}
	b.add(name, res.Stdout)
}

// poolOfCluster is the storage pool of a VM whose object records none:
// its LibvirtCluster's, else the provider's default.
func poolOfCluster(ctx context.Context, c client.Client, vm guestVM) string {
	var lcs infrav1.LibvirtClusterList
	if err := c.List(ctx, &lcs, client.InNamespace(vm.Namespace)); err == nil {
		for _, lc := range lcs.Items {
			if clusterOf(lc.OwnerReferences, lc.Labels) == vm.Cluster && lc.Spec.StoragePool.Name != "" {
				return lc.Spec.StoragePool.Name
			}
		}
	}
	return infrav1.DefaultStoragePoolName
}

// formatEvents is one line per event, oldest first.
func formatEvents(events []corev1.Event) []byte {
	when := func(e corev1.Event) time.Time {
		switch {
		case !e.LastTimestamp.IsZero():
			return e.LastTimestamp.Time
		case !e.EventTime.IsZero():
			return e.EventTime.Time
		}
		return e.CreationTimestamp.Time
	}
	slices.SortStableFunc(events, func(x, y corev1.Event) int { return when(x).Compare(when(y)) })
	var out bytes.Buffer
	for _, e := range events {
		fmt.Fprintf(&out, "%s  %-7s %-28s %s/%s %s: %s (x%d)\n", when(e).Format(time.RFC3339), e.Type, e.Reason,
			e.InvolvedObject.Kind, e.InvolvedObject.Namespace, e.InvolvedObject.Name, oneLine(e.Message), max(e.Count, 1))
	}
	return out.Bytes()
}

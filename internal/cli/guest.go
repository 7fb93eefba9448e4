package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/registry"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
)

// guestVM is a VM of the plane's clusters that the guest agent reaches.
type guestVM struct {
	// Namespace and Cluster are the Cluster API cluster's.
	Namespace, Cluster string
	// Names are what a person may call it: the Machine's and the
	// LibvirtMachine's name, the Node's, the domain's.
	Names []string
	// Domain is the libvirt domain; Pool the storage pool of its volumes.
	Domain, Pool string
	// ControlPlane is true for control-plane machines, LoadBalancer for
	// the HAProxy VM.
	ControlPlane, LoadBalancer bool
	// Machine is the Machine's name and Node its node's, when they are
	// known; Addresses the VM's as the provider recorded them.
	Machine, Node string
	Addresses     []string
	// DomainStatus is what the provider recorded of the domain (its
	// host, UUID and last state).
	DomainStatus *infrav1.DomainStatus
}

// name is how the VM is shown: its node's name when it has one.
func (v guestVM) name() string { return v.Names[0] }

// planeVMs lists the VMs of the plane's clusters that have a domain:
// machines (named after their Node, else their Machine) and the HAProxy
// VMs, optionally of one namespace and cluster only.
func planeVMs(ctx context.Context, c client.Client, namespace, cluster string) ([]guestVM, error) {
	var opts []client.ListOption
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	if cluster != "" {
		opts = append(opts, client.MatchingLabels{clusterv1.ClusterNameLabel: cluster})
	}
	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, opts...); err != nil {
		return nil, err
	}
	byInfra := map[string]*clusterv1.Machine{}
	for i := range machines.Items {
		m := &machines.Items[i]
		byInfra[m.Namespace+"/"+m.Spec.InfrastructureRef.Name] = m
	}
	var lms infrav1.LibvirtMachineList
	if err := c.List(ctx, &lms, opts...); err != nil {
		return nil, err
	}
	var vms []guestVM
	for _, lm := range lms.Items {
		if lm.Status.Domain == nil || lm.Status.Domain.Name == "" {
			continue
		}
		v := guestVM{Namespace: lm.Namespace, Cluster: lm.Labels[clusterv1.ClusterNameLabel], Domain: lm.Status.Domain.Name,
			Pool: lm.Annotations[scope.PoolAnnotation], DomainStatus: lm.Status.Domain}
		_, v.ControlPlane = lm.Labels[clusterv1.MachineControlPlaneLabel]
		for _, a := range lm.Status.Addresses {
			v.Addresses = append(v.Addresses, a.Address)
		}
		if m := byInfra[lm.Namespace+"/"+lm.Name]; m != nil {
			if m.Status.NodeRef.IsDefined() {
				v.Node = m.Status.NodeRef.Name
				v.Names = append(v.Names, v.Node)
			}
			v.Machine = m.Name
			v.Names = append(v.Names, m.Name)
		}
		v.Names = append(v.Names, lm.Name, v.Domain)
		vms = append(vms, v)
	}
	var lcs infrav1.LibvirtClusterList
	var lcOpts []client.ListOption
	if namespace != "" {
		lcOpts = append(lcOpts, client.InNamespace(namespace))
	}
	if err := c.List(ctx, &lcs, lcOpts...); err != nil {
		return nil, err
	}
	for _, lc := range lcs.Items {
		lb := lc.Status.LoadBalancer
		owner := clusterOf(lc.OwnerReferences, lc.Labels)
		if lb == nil || lb.Domain == nil || lb.Domain.Name == "" || (cluster != "" && owner != cluster) {
			continue
		}
		v := guestVM{Namespace: lc.Namespace, Cluster: owner, Domain: lb.Domain.Name,
			Pool: lc.Annotations[scope.PoolAnnotation], LoadBalancer: true, Names: []string{lb.Domain.Name}, DomainStatus: lb.Domain}
		if lb.Address != "" {
			v.Addresses = []string{lb.Address}
		}
		vms = append(vms, v)
	}
	slices.SortFunc(vms, func(x, y guestVM) int { return strings.Compare(x.Domain, y.Domain) })
	return vms, nil
}

// clusterOf is the Cluster API cluster of an infrastructure object: its
// owning Cluster (Cluster API sets the reference on the LibvirtCluster),
// else its cluster-name label.
func clusterOf(owners []metav1.OwnerReference, labels map[string]string) string {
	for _, o := range owners {
		if o.Kind == "Cluster" && strings.HasPrefix(o.APIVersion, clusterv1.GroupVersion.Group+"/") {
			return o.Name
		}
	}
	return labels[clusterv1.ClusterNameLabel]
}

// findVM resolves a name a person gave to one VM.
func findVM(vms []guestVM, name string) (guestVM, error) {
	var found []guestVM
	for _, v := range vms {
		if slices.Contains(v.Names, name) {
			found = append(found, v)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		var names []string
		for _, v := range vms {
			names = append(names, v.name())
		}
		if len(names) == 0 {
			return guestVM{}, fmt.Errorf("no VM named %q: the plane's clusters have no VM yet", name)
		}
		return guestVM{}, fmt.Errorf("no VM named %q; the plane's VMs are %s (a node, Machine, LibvirtMachine or domain name)", name, strings.Join(names, ", "))
	}
	var domains []string
	for _, v := range found {
		domains = append(domains, v.Domain)
	}
	return guestVM{}, fmt.Errorf("%q names several VMs (%s): use the domain name, or --namespace", name, strings.Join(domains, ", "))
}

func (a *app) execCommand() *cobra.Command {
	var namespace string
	var stdin bool
	cmd := &cobra.Command{
		Use:   "exec NODE -- COMMAND [ARG...]",
		Short: "Run a command in a VM through the QEMU guest agent",
		Long: `Runs COMMAND in the VM NODE (a node, Machine, LibvirtMachine or domain name,
or an HAProxy VM's domain) through the QEMU guest agent: no SSH and no
credentials in the guest. The command runs as root without a terminal; its
output is printed when it exits (at most 10 minutes), and capl-dev exits
with its exit code. With -i, capl-dev's standard input is passed to it.`,
		Example: `  capl-dev exec demo-control-plane-abcde -- crictl ps
  capl-dev exec demo-md-0-xyz-abc -- journalctl -u kubelet -n 50 --no-pager
  echo hello | capl-dev exec -i demo-md-0-xyz-abc -- cat`,
		Args: cobra.MinimumNArgs(2),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveDefault
			}
			return a.completeVMs(cmd.Context(), namespace), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			node, argv, err := guestCommandLine(args)
			if err != nil {
				return err
			}
			p, err := a.attach()
			if err != nil {
				return err
			}
			vms, err := planeVMs(ctx, p.Client, namespace, "")
			if err != nil {
				return err
			}
			vm, err := findVM(vms, node)
			if err != nil {
				return err
			}
			var input []byte
			if stdin {
				if input, err = io.ReadAll(os.Stdin); err != nil {
					return err
				}
			}
			host, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer host.Close()
			res, err := host.GuestExec(ctx, vm.Domain, argv[0], argv[1:], input)
			if err != nil {
				return fmt.Errorf("%s in %s: %w", argv[0], vm.Domain, err)
			}
			_, _ = a.out.Write(res.Stdout)
			_, _ = a.err.Write(res.Stderr)
			if res.ExitCode != 0 {
				return exitCodeError{res.ExitCode}
			}
			return nil
		},
	}
	// Flags end at NODE: what follows is the guest's command line, even
	// without "--".
	cmd.Flags().SetInterspersed(false)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "namespace of the VM's cluster; default every namespace")
	cmd.Flags().BoolVarP(&stdin, "stdin", "i", false, "pass standard input to the command")
	return cmd
}

// guestCommandLine splits exec's arguments into the VM and the command.
// Flags end at the VM's name, so the "--" after it, if given, reaches
// the arguments and is dropped here.
func guestCommandLine(args []string) (node string, argv []string, err error) {
	if len(args) > 1 && args[1] == "--" {
		args = append(args[:1:1], args[2:]...)
	}
	if len(args) < 2 || args[1] == "" {
		return "", nil, usageError{errors.New("name the VM and the command: capl-dev exec NODE -- COMMAND [ARG...]")}
	}
	return args[0], args[1:], nil
}

// completeVMs completes VM names of the running plane.
func (a *app) completeVMs(ctx context.Context, namespace string) []string {
	p, err := a.attachQuiet()
	if err != nil {
		return nil
	}
	vms, err := planeVMs(ctx, p.Client, namespace, "")
	if err != nil {
		return nil
	}
	var names []string
	for _, v := range vms {
		names = append(names, v.name())
	}
	return names
}

// guestImageDir is where load image puts a tarball in the guest: on its
// disk (/tmp may be a small tmpfs), removed once imported.
const guestImageDir = "/var/tmp"

// guestCtr is the node image's ctr (images/node/customize-node.sh).
const guestCtr = "/usr/local/bin/ctr"

func (a *app) loadCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Load container images into a cluster's nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{errors.New("name what to load: capl-dev load image TAR...")}
		},
	}
	var namespace, cluster string
	var toNodes bool
	img := &cobra.Command{
		Use:   "image TAR...",
		Short: "Push image tarballs into the plane's registry, or import them into a cluster's nodes",
		Long: `Pushes each image tarball (docker save, or an OCI image layout as one tarball)
into the plane's registry, which every node of every cluster of the plane uses
as a mirror of every registry: a pod naming the image (IfNotPresent or Always)
pulls it from there, as with kind's local registry. The image keeps its name
(ghcr.io/team/app:dev is served as team/app:dev).

With --cluster or --to-nodes, or without a registry (capl-dev serve
--registry-port=-1, or its port taken), copies each tarball into every node
of the cluster --cluster (default demo) through the QEMU guest agent instead
and imports it into containerd's k8s.io namespace, where the kubelet finds it:
a pod with imagePullPolicy IfNotPresent or Never runs it without a registry,
as kind load does.`,
		Example: `  docker save my/app:dev -o app.tar && capl-dev load image app.tar
  capl-dev load image app.tar sidecar.tar --cluster web`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			p, err := a.attach()
			if err != nil {
				return err
			}
			// A cluster named is a cluster's nodes: the registry serves
			// every cluster alike.
			toNodes = toNodes || cmd.Flags().Changed("cluster")
			if url := p.Endpoints.RegistryURL; url != "" && !toNodes {
				for _, tar := range args {
					pushed, err := registry.PushArchive(ctx, url, tar)
					if err != nil {
						return fmt.Errorf("pushing %s into the plane's registry: %w", tar, err)
					}
					a.logf("%s: pushed into the plane's registry (%s): %s", tar, url, strings.Join(pushed, ", "))
				}
				return nil
			}
			vms, err := planeVMs(ctx, p.Client, namespace, cluster)
			if err != nil {
				return err
			}
			vms = slices.DeleteFunc(vms, func(v guestVM) bool { return v.LoadBalancer })
			if len(vms) == 0 {
				return fmt.Errorf("cluster %s/%s has no node VM (capl-dev status %s%s)", namespace, cluster, cluster, namespaceArg(namespace))
			}
			host, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer host.Close()
			for _, tar := range args {
				data, err := os.ReadFile(tar)
				if err != nil {
					return err
				}
				sum := sha256.Sum256(data)
				guestPath := fmt.Sprintf("%s/capl-load-%s.tar", guestImageDir, hex.EncodeToString(sum[:6]))
				for _, vm := range vms {
					if err := host.GuestWriteFile(ctx, vm.Domain, guestPath, data, 0o600); err != nil {
						return fmt.Errorf("copying %s to %s: %w", tar, vm.name(), err)
					}
					res, err := host.GuestExec(ctx, vm.Domain, guestCtr, []string{"--namespace=k8s.io", "images", "import", "--digests", "--snapshotter=overlayfs", guestPath}, nil)
					// Removed whatever the import did: a failed one's file
					// would only fill the disk.
					_, _ = host.GuestExec(ctx, vm.Domain, "/bin/rm", []string{"-f", guestPath}, nil)
					if err == nil && res.ExitCode != 0 {
						err = fmt.Errorf("ctr images import exited %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)+string(res.Stdout)))
					}
					if err != nil {
						return fmt.Errorf("importing %s on %s: %w", tar, vm.name(), err)
					}
					a.logf("%s: imported %s (%d MiB): %s", vm.name(), tar, len(data)>>20, strings.Join(strings.Fields(string(res.Stdout)), " "))
				}
			}
			return nil
		},
	}
	img.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the cluster")
	img.Flags().StringVar(&cluster, "cluster", "demo", "import into this cluster's nodes through the guest agent (given, it implies --to-nodes)")
	img.Flags().BoolVar(&toNodes, "to-nodes", false, "import into the nodes of --cluster through the guest agent even when the plane runs a registry")
	cmd.AddCommand(img)
	return cmd
}

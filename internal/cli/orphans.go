package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// orphans lists, and with --delete removes, the libvirt objects of the
// provider's that no LibvirtMachine or LibvirtCluster of the running plane
// owns. Nothing runs it on its own: an object can be a moved cluster's, or
// a restore's still to come, and only the operator knows.
func (a *app) orphansCommand() *cobra.Command {
	var remove bool
	cmd := &cobra.Command{
		Use:   "orphans",
		Short: "List (--delete: remove) the VMs, volumes and networks no object of the plane owns",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			p, err := plane.Attach(a.stateDir)
			if err != nil {
				return fmt.Errorf("the plane in %s: %w (orphans are objects no API object of a running plane owns)", a.stateDir, err)
			}
			scope, err := plane.ReadScope(a.stateDir)
			if err != nil {
				return err
			}
			host, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer host.Close()
			return a.orphans(ctx, p, scope, host, remove)
		},
	}
	cmd.Flags().BoolVar(&remove, "delete", false, "remove the orphans listed")
	return cmd
}

func (a *app) orphans(ctx context.Context, p *plane.Plane, scope plane.Scope, host virt.Host, remove bool) error {
	found, err := plane.FindOrphans(ctx, p.Client, host, scope)
	if err != nil {
		return err
	}
	for _, x := range found {
		fmt.Fprintln(a.out, x)
	}
	if len(found) == 0 {
		fmt.Fprintln(a.out, "no orphans")
		return nil
	}
	if !remove {
		fmt.Fprintf(a.out, "%d orphans; capl-dev orphans --delete removes them\n", len(found))
		return nil
	}
	if err := plane.RemoveOrphans(ctx, host, found); err != nil {
		return err
	}
	fmt.Fprintf(a.out, "removed %d orphans\n", len(found))
	return nil
}

package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// orphans lists, and with --delete removes, the libvirt objects of the
// provider's that no LibvirtMachine or LibvirtCluster of the running plane
// owns. Nothing runs it on its own: an object can be a moved cluster's, or
// a restore's still to come, and only the operator knows.
func orphans(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("orphans", flag.ExitOnError)
	o := plane.Options{}
	planeFlags(fs, &o)
	remove := fs.Bool("delete", false, "remove the orphans listed")
	_ = fs.Parse(args)
	p, err := plane.Attach(o.StateDir)
	if err != nil {
		return fmt.Errorf("the plane in %s: %w (orphans are objects no API object of a running plane owns)", o.StateDir, err)
	}
	scope, err := plane.ReadScope(o.StateDir)
	if err != nil {
		return err
	}
	host, err := virt.Dial(ctx, o.LibvirtURI)
	if err != nil {
		return fmt.Errorf("connecting to libvirt at %s: %w", o.LibvirtURI, err)
	}
	defer host.Close()
	found, err := plane.FindOrphans(ctx, p.Client, host, scope)
	if err != nil {
		return err
	}
	for _, x := range found {
		fmt.Println(x)
	}
	if len(found) == 0 {
		fmt.Println("no orphans")
		return nil
	}
	if !*remove {
		fmt.Printf("%d orphans; capl-dev orphans --delete removes them\n", len(found))
		return nil
	}
	if err := plane.RemoveOrphans(ctx, host, found); err != nil {
		return err
	}
	fmt.Printf("removed %d orphans\n", len(found))
	return nil
}

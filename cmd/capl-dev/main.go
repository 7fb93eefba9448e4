// Command capl-dev runs the whole system on one host: `capl-dev up` starts a
// management plane (kube-apiserver and etcd kept in a state directory,
// kube-controller-manager and the provider's manager as supervised child
// processes, Cluster API's core and kubeadm controllers and webhooks) and
// creates a demo cluster of real VMs; `capl-dev down`
// deletes it all again. `make up` and `make down` run it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

const usage = `capl-dev: the one-host management plane of cluster-api-provider-libvirt.

  capl-dev up     [flags]  start the plane (if not running) and the demo cluster
  capl-dev down   [flags]  delete the clusters, stop the plane, remove its VMs, volumes and networks
  capl-dev serve  [flags]  run the plane in the foreground (what up starts in the background)
  capl-dev render [flags]  print the demo cluster as YAML, for a management cluster of your own
  capl-dev orphans [--delete]  list (remove) the VMs, volumes and networks no object of the plane owns

Run "capl-dev <command> -h" for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "up":
		err = up(ctx, args)
	case "down":
		err = down(ctx, args)
	case "serve":
		err = serve(ctx, args)
	case "render":
		err = render(args)
	case "orphans":
		err = orphans(ctx, args)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "capl-dev %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func down(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	o := plane.Options{Log: logf}
	planeFlags(fs, &o)
	fs.BoolVar(&o.SweepAll, "all", false, "remove every provider-owned domain, network and volume on the host, not only the plane's")
	_ = fs.Parse(args)
	start := time.Now()
	rep, err := plane.Down(ctx, o)
	for _, l := range []struct {
		what  string
		names []string
	}{{"domains", rep.Domains}, {"volumes", rep.Volumes}, {"networks", rep.Networks}, {"storage pools", rep.Pools}} {
		if len(l.names) > 0 {
			logf("removed %s: %s", l.what, strings.Join(l.names, ", "))
		}
	}
	for _, k := range rep.Kept {
		logf("kept %s", k)
	}
	if rep.Empty() && err == nil {
		logf("no libvirt object of the plane was left to remove")
	}
	if err != nil {
		return err
	}
	logf("down in %s; %s removed", time.Since(start).Round(time.Second), o.StateDir)
	return nil
}

func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	var o plane.Options
	planeFlags(fs, &o)
	managerFlags(fs, &o)
	fs.StringVar(&o.ImageDir, "image-dir", plane.DefaultImageDir, "directory the manager may import file:// images from")
	_ = fs.Parse(args)
	// controller-runtime logs of the in-process Cluster API controllers go
	// to serve.log.
	ctrl.SetLogger(klog.Background())
	return plane.Serve(ctx, o)
}

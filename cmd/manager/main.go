// Command manager runs the libvirt infrastructure provider's controllers
// against the Kubernetes cluster in the current kubeconfig.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	logsv1 "k8s.io/component-base/logs/api/v1"
	// --logging-format=json, as every Cluster API provider takes it.
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/version"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

func main() {
	var opts manager.Options
	logOptions := logs.NewOptions()
	opts.AddFlags(pflag.CommandLine)
	logsv1.AddFlags(logOptions, pflag.CommandLine)
	pflag.CommandLine.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	pflag.CommandLine.AddGoFlagSet(flag.CommandLine)
	showVersion := pflag.Bool("version", false, "print the version (release, commit, commit time) and exit")
	pflag.Parse()
	if *showVersion {
		fmt.Println("manager " + version.Get().String())
		return
	}

	if err := logsv1.ValidateAndApply(logOptions, nil); err != nil {
		fmt.Fprintf(os.Stderr, "invalid logging flags: %v\n", err)
		os.Exit(1)
	}
	ctrl.SetLogger(klog.Background())
	log := ctrl.Log.WithName("setup")

	mgr, err := manager.New(ctrl.GetConfigOrDie(), opts)
	if err != nil {
		log.Error(err, "Unable to create the manager")
		os.Exit(1)
	}
	log.Info("Starting manager", "version", version.Get().Version, "commit", version.Get().GitCommit,
		"libvirtURI", opts.LibvirtURI, "namespace", opts.WatchNamespace)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "Manager stopped with an error")
		os.Exit(1)
	}
}

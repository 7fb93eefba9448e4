// Command capl-dev runs the whole system on one host: `capl-dev up` starts a
// management plane (kube-apiserver and etcd kept in a state directory,
// kube-controller-manager and the provider's manager as supervised child
// processes, Cluster API's core and kubeadm controllers and webhooks) and
// creates a cluster of real VMs; `capl-dev down` deletes it all again. `make
// up` and `make down` run it. Its commands are in internal/cli.
package main

import (
	"os"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/cli"
)

func main() {
	os.Exit(cli.Main())
}

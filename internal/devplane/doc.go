// Package devplane is the one-host management plane behind `make up` and
// `make down` (cmd/capl-dev) and the end-to-end suite (e2e/): kube-apiserver
// and etcd from envtest with a persistent etcd data directory, Cluster API's
// core controllers (Cluster, Machine, MachineSet, MachineDeployment) in
// process, and the provider's real manager binary as a supervised child
// process that is restarted when it dies, like a kubelet restarts a pod.
//
// Everything lives in a state directory (default DefaultStateDir):
//
//	etcd/            etcd data, kept across restarts of the plane
//	kubeconfig       admin kubeconfig (0600)
//	serve.pid/.log   the plane process (`capl-dev serve`)
//	manager.pid/.log the manager child
//	webhook-certs/   the manager's webhook serving certificate
//	endpoints.json   Endpoints: manager metrics and health URLs, webhook port
//	scope.json       Scope: the namespaces and storage pools the plane used
//
// Differences from the brief the e2e suite was written against:
//
//   - Down does not sweep every provider-owned object on the host by
//     default: on a host shared with other management clusters (or other
//     test runs) that would delete their VMs. It removes the domains,
//     networks and volumes of the namespaces recorded in scope.json (every
//     namespace holding a Cluster, LibvirtCluster or LibvirtMachine of the
//     plane: serve records them every 5 s, Down and `capl-dev up` too),
//     base images in the plane's storage pools once
//     no machine volume is left in them, and with Options.SweepAll (capl-dev
//     down --all) everything ListOwned returns. Sweep itself keeps its
//     meaning: everything ListOwned returns.
//   - Down deletes the Clusters with background, not foreground,
//     propagation: the plane runs no kube-controller-manager, hence no
//     garbage collector to clear the foregroundDeletion finalizer, and a
//     Cluster deleted with DeletePropagationForeground stays forever
//     (callers of the plane, e2e/ included, must not use it). Cluster API's
//     Cluster controller deletes the machines and infrastructure itself
//     before the Cluster goes, so the order is the same. For the same reason
//     nothing is garbage-collected through owner references.
//   - Cluster API's own webhooks are not served (only the provider's are),
//     so Demo fills in what CAPI's MachineDeployment defaulting webhook would
//     (labels, selector, rollout strategy).
//   - A storage pool is removed only when pkg/virt's client offers a
//     DeletePool method; until then empty pools stay and the report says so.
package devplane

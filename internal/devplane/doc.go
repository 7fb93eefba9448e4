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
//   - The plane runs no kube-controller-manager, hence no garbage
//     collector. Serve does its part of foreground deletion for Clusters,
//     MachineDeployments, MachineSets, Machines, LibvirtClusters and
//     LibvirtMachines (foreground.go: the foregroundDeletion finalizer goes
//     once no object of those kinds names the object as owner); Cluster
//     API's controllers delete the dependents themselves. Nothing else is
//     garbage-collected through owner references (Secrets, templates stay
//     until the state directory goes). Down deletes with background
//     propagation, which needs none of this.
//   - Cluster API's own webhooks are not served (only the provider's are),
//     so Demo fills in what CAPI's MachineDeployment defaulting webhook would
//     (labels, selector, rollout strategy).
//   - A storage pool is removed only when it is left empty (another
//     cluster's volumes may share it); the report names a pool it kept.
package devplane

// Package plane is the one-host management plane behind `make up` and
// `make down` (cmd/capl-dev) and the end-to-end suite (e2e/), a management
// cluster without nodes: kube-apiserver and etcd (child processes with
// certificates made at each start, controlplane.go, but for etcd's, kept:
// etcdpki.go; etcd requires client certificates; the binaries from an
// assets directory: FindAssets) with a persistent etcd data directory and
// Secrets encrypted at rest, every server on loopback only (guests reach
// the host's other addresses through their gateway) but the OCI registry
// (registry.go, internal/registry: on every address, pulls only from the
// provider's bridges), every CRD and webhook configuration of the provider and of
// Cluster API's core and kubeadm providers embedded at build time
// (manifests.go);
// kube-controller-manager (garbage collector, namespace, service-account,
// resource-quota and role-aggregation controllers: kcm.go) and the
// provider's real manager binary as supervised child processes, restarted
// when they die like a kubelet restarts a pod; and Cluster API's core,
// kubeadm bootstrap and kubeadm control-plane managers with all their
// webhooks in process (StartClusterAPI; Serve says why in process).
//
// Everything lives in a state directory (default DefaultStateDir):
//
//	etcd/                  etcd data, kept across restarts of the plane
//	etcd-pki/              etcd's authority, serving and kube-apiserver client
//	                       certificates (0600, kept; made anew when incomplete)
//	service-account.key    signing key of service-account tokens (0600, kept)
//	encryption-config.yaml EncryptionConfiguration with the key Secrets are
//	                       encrypted with in etcd (secretbox; 0600, kept)
//	kubeconfig             admin kubeconfig (0600)
//	serve.pid/.log         the plane process (`capl-dev serve`), Cluster API's logs
//	manager.pid/.log       the manager child
//	kube-controller-manager.pid/.log/.kubeconfig  the kube-controller-manager child
//	webhook-certs/         the manager's webhook serving certificate
//	endpoints.json         Endpoints: manager metrics and health URLs, webhook port
//	scope.json             Scope: the namespaces and storage pools the plane used
//	registry/              the OCI registry's blobs and manifest journal (kept)
//	capl-dev.json          CLIStateFile: how capl-dev started the plane, the VMs
//	                       `capl-dev stop` shut down (internal/cli)
//	<cluster>.kubeconfig   workload kubeconfigs (WorkloadKubeconfig)
//
// What Down removes:
//
//   - Not every provider-owned object on the host by default: on a host
//     shared with other management clusters (or other test runs) that
//     would delete their VMs. It removes the domains,
//     networks and volumes of the namespaces recorded in scope.json (every
//     namespace holding a Cluster, LibvirtCluster or LibvirtMachine of the
//     plane: serve records them every 5 s, Down and `capl-dev up` too),
//     base images in the plane's storage pools once
//     no machine volume is left in them, and with Options.SweepAll (capl-dev
//     down --all) everything ListOwned returns. Sweep itself keeps its
//     meaning: everything ListOwned returns.
//   - A storage pool is removed only when it is left empty (another
//     cluster's volumes may share it); the report names a pool it kept.
//
// internal/devplane makes clusters on it; internal/testharness/testenv, the integration
// tests' harness, is a thin layer over StartEnvironment.
package plane

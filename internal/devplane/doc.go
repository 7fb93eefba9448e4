// Package devplane makes the clusters of the one-host management plane
// (internal/plane): the stand-in demo of the provider's own tests (Demo)
// and Kubernetes clusters rendered from templates/ by clusterctl's variable
// rules (RenderCluster, ClusterVariables, CNIObjects), the base images
// they boot imported into the pool (SeedImages), the guests' domain type
// chosen for the host (ChooseDomainType), and the waits `make up` and the
// e2e suite share: infrastructure provisioned, the endpoint answering,
// every node Ready with its Machine's providerID (WaitControlPlaneNode,
// ReadNodesStatus), the workload kubeconfig (WorkloadClient).
package devplane

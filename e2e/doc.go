//go:build e2e

// Package e2e is the end-to-end suite: the one-host management plane of
// internal/devplane (kube-apiserver, etcd, Cluster API's core controllers
// and the real manager binary as a supervised child process) drives real
// TCG virtual machines on the host's libvirtd. It creates the demo cluster
// `make up` creates, checks every contract field against what the guests
// and libvirt report, scales, deletes control-plane machines behind the
// HAProxy endpoint, kills the manager and libvirtd mid-reconcile, feeds bad
// input, and proves that nothing of the run is left in libvirt. It writes a
// benchmark report to $CAPL_E2E_ARTIFACTS. Run it with `make test-e2e`.
package e2e

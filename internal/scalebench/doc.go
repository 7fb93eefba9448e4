// Package scalebench is make bench-scale: the provider's manager measured
// at hundreds to thousands of machines on a simulated libvirt host, with a
// real kube-apiserver, etcd and Cluster API's core controllers. Its code
// is in test files under the build tag scale (go test -tags scale), so
// that no product code imports the test harnesses it uses;
// docs/performance.md has the figures.
package scalebench

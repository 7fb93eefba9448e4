// Package plane runs a management cluster without nodes on one host: etcd
// and kube-apiserver (controller-runtime's envtest process control, the
// binaries from an assets directory: FindAssets), every CRD and webhook
// configuration of the provider and of Cluster API's core and kubeadm
// providers (embedded at build time, see manifests.go), and Cluster API's
// controllers and webhooks in process. internal/devplane builds `capl-dev`'s
// supervised plane on it; internal/testenv, the integration tests' harness,
// is a thin layer over it.
package plane

//go:build tools

// Package envtest only records the binaries built from this module:
// hack/envtest.sh builds kube-apiserver, kubectl, kube-controller-manager and
// etcd for envtest and the management plane; images/node/binaries.sh builds
// every Kubernetes binary of the node image from the same module, so the
// two share one Go build cache.
package envtest

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)

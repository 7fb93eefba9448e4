// Package examples holds the example manifests and user-data of the
// repository; the Go side embeds them so that the binaries that render the
// demo cluster (capl-dev, the end-to-end suite) carry the exact files users
// read here, wherever they run.
package examples

import _ "embed"

// APIServerUserData is demo/user-data-apiserver.yaml: the demo's
// control-plane user-data, a TLS server on 6443 answering GET /readyz.
//
//go:embed demo/user-data-apiserver.yaml
var APIServerUserData []byte

// WorkerUserData is demo/user-data-worker.yaml: the demo's worker
// user-data, which only writes Cluster API's bootstrap sentinel.
//
//go:embed demo/user-data-worker.yaml
var WorkerUserData []byte

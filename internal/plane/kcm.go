package plane

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// KubeControllerManagerEnv names a kube-controller-manager binary that
// replaces the one of the assets directory (hack/envtest.sh and `make
// dist` put it next to kube-apiserver, of the same version).
const KubeControllerManagerEnv = "CAPL_KUBE_CONTROLLER_MANAGER"

// serviceAccountIssuer is the issuer of the plane's service-account tokens.
// It is fixed, not the API server's URL (whose port changes at every
// start), so that tokens stay valid across restarts.
const serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// kubeControllerManagerControllers are the controllers of
// kube-controller-manager a management cluster without nodes needs:
//
//   - garbage-collector-controller: deletes objects whose owners are gone
//     (a Cluster deleted with background propagation takes its Secrets,
//     templates and everything else that names it as owner) and completes
//     foreground deletions; Cluster API and every provider rely on owner
//     references for cleanup.
//   - namespace-controller: empties and removes a deleted namespace, which
//     otherwise stays Terminating forever.
//   - serviceaccount-controller and serviceaccount-token-controller: the
//     default ServiceAccount of every namespace, and tokens for
//     service-account token Secrets that users (or clusterctl move) create.
//   - resourcequota-controller: computes ResourceQuota usage; without it
//     the API server refuses every create in a namespace with a quota,
//     and quotas are how a shared management cluster bounds a tenant
//     (object counts such as count/clusters.cluster.x-k8s.io).
//   - clusterrole-aggregation-controller: fills aggregated ClusterRoles
//     (admin, edit, view, and providers' aggregated roles), with which
//     tenants are given access to their namespaces.
//
// Left out, because nothing runs Pods here: node, pod, workload
// (Deployment, Job, ...), endpoint, volume, certificate-signing and
// bootstrap-token controllers.
var kubeControllerManagerControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"resourcequota-controller",
	"clusterrole-aggregation-controller",
}

// kubeControllerManagerBinary finds kube-controller-manager: the
// KubeControllerManagerEnv override, else the one of the assets directory.
func kubeControllerManagerBinary(assets string) (string, error) {
	path := os.Getenv(KubeControllerManagerEnv)
	if path == "" {
		path = filepath.Join(assets, "kube-controller-manager")
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("kube-controller-manager: %w (hack/envtest.sh builds it; %s overrides its path)", err, KubeControllerManagerEnv)
	}
	return filepath.Abs(path)
}

// kubeControllerManagerArgs are its flags: the controllers above, one
// service-account token per controller (as kubeadm runs it, so that each
// acts with the RBAC role the API server's bootstrap policy gives it),
// tokens signed with the plane's key, no leader election and no serving
// port (nothing scrapes it; the supervisor restarts it when it exits).
func kubeControllerManagerArgs(dir string) []string {
	return []string{
		"--kubeconfig=" + filepath.Join(dir, kcmKubeconfigName),
		"--controllers=" + strings.Join(kubeControllerManagerControllers, ","),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + filepath.Join(dir, serviceAccountKeyName),
		"--leader-elect=false",
		"--secure-port=0",
	}
}

// apiServerFlags are the kube-apiserver flags the plane adds to the
// environment's (controlplane.go):
// its service-account key and issuer, for the tokens of
// kube-controller-manager's controllers, and encryption of Secrets at rest.
func apiServerFlags(dir string) map[string]string {
	key := filepath.Join(dir, serviceAccountKeyName)
	return map[string]string{
		"service-account-issuer":           serviceAccountIssuer,
		"service-account-key-file":         key,
		"service-account-signing-key-file": key,
		"encryption-provider-config":       filepath.Join(dir, encryptionConfigName),
	}
}

// ensureKeys creates, once, the plane's service-account signing key and
// its encryption configuration, both 0600 in dir; later starts reuse them,
// so that tokens and encrypted Secrets in etcd stay readable.
func ensureKeys(dir string) error {
	if err := ensureFile(filepath.Join(dir, serviceAccountKeyName), newServiceAccountKey); err != nil {
		return fmt.Errorf("service-account key: %w", err)
	}
	if err := ensureFile(filepath.Join(dir, encryptionConfigName), newEncryptionConfig); err != nil {
		return fmt.Errorf("encryption configuration: %w", err)
	}
	return nil
}

// ensureFile writes generate's output to path (0600) unless path exists, and
// makes sure an existing one is 0600.
func ensureFile(path string, generate func() ([]byte, error)) error {
	if _, err := os.Stat(path); err == nil {
		return os.Chmod(path, 0o600)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	data, err := generate()
	if err != nil {
		return err
	}
	return writeFileAtomic(path, data)
}

func newServiceAccountKey() ([]byte, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), nil
}

// encryptionKeyName names the key in the encryption configuration; etcd
// values encrypted with it start with encryptedValuePrefix.
const encryptionKeyName = "key1"

// encryptedValuePrefix starts every Secret the API server wrote to etcd
// with the plane's key.
const encryptedValuePrefix = "k8s:enc:secretbox:v1:" + encryptionKeyName + ":"

// newEncryptionConfig is an EncryptionConfiguration that encrypts Secrets
// with secretbox (XSalsa20-Poly1305, authenticated, fast) under a fresh
// random 32-byte key. identity comes second so that Secrets a plane wrote
// before encryption existed stay readable (they are encrypted when next
// written).
func newEncryptionConfig() ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [secrets]
    providers:
      - secretbox:
          keys:
            - name: %s
              secret: %s
      - identity: {}
`, encryptionKeyName, base64.StdEncoding.EncodeToString(key)), nil
}

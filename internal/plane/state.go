package plane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/registry"
)

// DefaultStateDir is where `make up` keeps the plane's state.
const DefaultStateDir = "/var/lib/capi-libvirt/devplane"

// DefaultImageDir is where `make images node-image` caches the images.
const DefaultImageDir = "/var/cache/capi-libvirt/images"

// Options configure the plane. Zero fields take the defaults of capl-dev.
type Options struct {
	// StateDir holds etcd's data, the kubeconfig, pid files and logs.
	StateDir string
	// LibvirtURI is the libvirt host the manager drives (qemu:///system).
	LibvirtURI string
	// ManagerBinary is the provider's manager (bin/manager of `make build`);
	// empty means the manager next to the running binary (a `make dist`
	// directory, or bin/).
	ManagerBinary string
	// Assets is the directory of kube-apiserver, etcd,
	// kube-controller-manager and kubectl; empty means FindAssets's
	// search (next to the running binary, then bin/k8s/).
	Assets string
	// ManagerArgs are appended to the flags the supervisor gives the manager.
	ManagerArgs []string
	// ImageDir is the directory whose files the manager may import as
	// file:// images (its --image-file-dirs): the image cache of `make
	// images`, which the plane's clusters name. DefaultImageDir when empty.
	ImageDir string
	// RegistryPort is the port of the plane's OCI registry on every host
	// address (internal/registry says who may use it); 0 means
	// registry.DefaultPort, the one the node image looks for, and a
	// negative port runs no registry.
	RegistryPort int
	// RegistryLayouts are OCI image layout directories whose images the
	// plane pushes into its registry when it starts (make up's: the
	// manager image of make image).
	RegistryLayouts []string
	// LibvirtTLSPort is the port of the plane's libvirt endpoint
	// (libvirttls.go) on every host address, for managers in guests; 0
	// means DefaultLibvirtTLSPort, negative none.
	LibvirtTLSPort int
	// SweepAll makes Down remove every provider-owned libvirt object on the
	// host, not only those of the plane's namespaces and pools.
	SweepAll bool
	// Log receives progress lines of Start and Down; nil discards them.
	Log func(format string, args ...any)
}

func (o Options) withDefaults() Options {
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.LibvirtURI == "" {
		o.LibvirtURI = "qemu:///system"
	}
	if o.ImageDir == "" {
		o.ImageDir = DefaultImageDir
	}
	if o.RegistryPort == 0 {
		o.RegistryPort = registry.DefaultPort
	}
	if o.LibvirtTLSPort == 0 {
		o.LibvirtTLSPort = DefaultLibvirtTLSPort
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	return o
}

// Files of the state directory.
const (
	etcdDirName       = "etcd"
	etcdCertsDirName  = "etcd-pki"
	kubeconfigName    = "kubeconfig"
	servePIDName      = "serve.pid"
	serveLogName      = "serve.log"
	managerPIDName    = "manager.pid"
	managerLogName    = "manager.log"
	webhookCertsName  = "webhook-certs"
	endpointsFileName = "endpoints.json"
	scopeFileName     = "scope.json"
	// Kept across restarts, 0600: the service-account signing key and the
	// EncryptionConfiguration holding the key Secrets are encrypted with.
	serviceAccountKeyName = "service-account.key"
	encryptionConfigName  = "encryption-config.yaml"
	// Rewritten at every start: kube-controller-manager's credentials
	// (the API server's CA and port change).
	kcmKubeconfigName = "kube-controller-manager.kubeconfig"
	kcmPIDName        = "kube-controller-manager.pid"
	kcmLogName        = "kube-controller-manager.log"
	// workloadKubeconfigSuffix ends the name of a workload cluster's
	// kubeconfig that `capl-dev up` writes (WorkloadKubeconfig).
	workloadKubeconfigSuffix = ".kubeconfig"
)

// CLIStateFile is the file of the state directory that capl-dev's command
// line (internal/cli) keeps: how the plane was started, for `capl-dev
// start`, and which VMs `capl-dev stop` shut down. Down removes it with
// the directory.
const CLIStateFile = "capl-dev.json"

// WorkloadKubeconfig is where `capl-dev up` writes the kubeconfig of
// workload cluster name in the plane's state directory; Down removes it
// with the directory.
func WorkloadKubeconfig(stateDir, name string) string {
	return filepath.Join(stateDir, name+workloadKubeconfigSuffix)
}

// Endpoints is endpoints.json: where the running plane's manager answers.
type Endpoints struct {
	// ManagerMetricsURL serves the manager's Prometheus metrics (plain HTTP).
	ManagerMetricsURL string `json:"managerMetricsURL"`
	// ManagerHealthURL is the manager's /readyz.
	ManagerHealthURL string `json:"managerHealthURL"`
	// WebhookPort is the local port the API server calls the manager's webhooks on.
	WebhookPort int `json:"webhookPort"`
	// APIServerURL is the plane's kube-apiserver.
	APIServerURL string `json:"apiServerURL"`
	// RegistryURL is the plane's OCI registry on loopback, where the host
	// pushes; empty when the plane serves none.
	RegistryURL string `json:"registryURL,omitempty"`
	// LibvirtTLSPort is the port of the plane's libvirt endpoint for
	// managers in guests (qemu+tls://GATEWAY:PORT/system), and
	// LibvirtClientDir the client credentials it accepts, a libvirt
	// pkipath; both empty when the plane serves none.
	LibvirtTLSPort   int    `json:"libvirtTLSPort,omitempty"`
	LibvirtClientDir string `json:"libvirtClientDir,omitempty"`
	// ServePID is the plane process that wrote the file.
	ServePID int `json:"servePID"`
}

// Scope is scope.json: what Down may remove from libvirt without touching
// other management clusters' objects on the same host.
type Scope struct {
	// Namespaces whose Clusters, LibvirtClusters or LibvirtMachines the
	// plane held; libvirt objects of the provider carry the namespace in
	// their owner metadata (domains, networks) or name (capl-<ns>.…, volumes).
	Namespaces []string `json:"namespaces"`
	// Pools are the storage pools the plane's clusters and machines used.
	Pools []string `json:"pools"`
	// MovedAway are objects `clusterctl move` took to another management
	// cluster (watchMoves): their libvirt objects are not the plane's to
	// remove any more. An object seen in the plane again leaves the list.
	MovedAway []MovedObject `json:"movedAway,omitempty"`
}

func (s *Scope) add(namespace, pool string) {
	if namespace != "" && !slices.Contains(s.Namespaces, namespace) {
		s.Namespaces = append(s.Namespaces, namespace)
	}
	if pool != "" && !slices.Contains(s.Pools, pool) {
		s.Pools = append(s.Pools, pool)
	}
}

func (s Scope) empty() bool { return len(s.Namespaces) == 0 && len(s.Pools) == 0 }

// readScope returns the recorded scope; a missing file is an empty scope.
// ReadScope reads what the plane in dir made and handed over (scope.json).
func ReadScope(dir string) (Scope, error) { return readScope(dir) }

func readScope(dir string) (Scope, error) {
	var s Scope
	data, err := os.ReadFile(filepath.Join(dir, scopeFileName))
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("reading %s: %w", scopeFileName, err)
	}
	return s, nil
}

// recordScope merges add's namespaces and pools into dir's scope.json and
// drops from its MovedAway the objects live lists (they are back) if they
// left before listedAt.
func recordScope(dir string, add Scope, live []MovedObject, listedAt time.Time) error {
	return updateScope(dir, func(s *Scope) bool {
		before := len(s.Namespaces) + len(s.Pools) + len(s.MovedAway)
		for _, n := range add.Namespaces {
			s.add(n, "")
		}
		for _, p := range add.Pools {
			s.add("", p)
		}
		s.MovedAway = slices.DeleteFunc(s.MovedAway, func(m MovedObject) bool {
			return m.Since.Before(listedAt) && slices.ContainsFunc(live, m.same)
		})
		return len(s.Namespaces)+len(s.Pools)+len(s.MovedAway) != before
	})
}

// addScope merges add's namespaces and pools into dir's scope.json.
func addScope(dir string, add Scope) error { return recordScope(dir, add, nil, time.Time{}) }

// RecordScope adds namespaces and pools to the plane's scope.json before
// anything exists in them, so that Down removes their libvirt objects
// even when the plane dies half way.
func RecordScope(dir string, namespaces, pools []string) error {
	return addScope(dir, Scope{Namespaces: namespaces, Pools: pools})
}

// scopeMu serialises the plane's writers of scope.json (the scope
// recorder and watchMoves).
var scopeMu sync.Mutex

// updateScope reads dir's scope.json, lets change edit it and writes it
// back when change reports a change.
func updateScope(dir string, change func(*Scope) bool) error {
	scopeMu.Lock()
	defer scopeMu.Unlock()
	s, err := readScope(dir)
	if err != nil {
		return err
	}
	if !change(&s) {
		return nil
	}
	return writeJSON(filepath.Join(dir, scopeFileName), s)
}

// writeJSON writes v to path atomically (0600): readers never see half a file.
func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(data, '\n'))
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readEndpoints(dir string) (Endpoints, error) {
	var e Endpoints
	data, err := os.ReadFile(filepath.Join(dir, endpointsFileName))
	if err != nil {
		return e, err
	}
	if err := json.Unmarshal(data, &e); err != nil {
		return e, fmt.Errorf("reading %s: %w", endpointsFileName, err)
	}
	return e, nil
}

// readPID reads a pid file; 0 and an error when it is missing or garbled.
func readPID(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s holds no pid: %q", path, data)
	}
	return pid, nil
}

func writePID(path string, pid int) error {
	return writeFileAtomic(path, []byte(strconv.Itoa(pid)+"\n"))
}

// processAlive tells whether pid runs and is not a zombie. PID 1 on some
// hosts (containers, this project's CI) never reaps orphans, so a plane
// that exited after its parent did stays a zombie forever, and kill(pid, 0)
// alone would call it alive. cmdlineHas, when set, must occur in the
// process's command line, so that a recycled pid is not mistaken for ours.
func processAlive(pid int, cmdlineHas string) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may itself
	// contain spaces or parentheses.
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	if cmdlineHas == "" {
		return true
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && bytes.Contains(cmdline, []byte(cmdlineHas))
}

// servePID is the pid of the running plane of dir, or 0.
func servePID(dir string) int {
	pid, err := readPID(filepath.Join(dir, servePIDName))
	if err != nil || !processAlive(pid, "serve") {
		return 0
	}
	return pid
}

// binaries resolves the manager binary and the assets directory: the
// options' own, else those next to the running binary (see Options).
func (o Options) binaries() (manager, assets string, err error) {
	manager = o.ManagerBinary
	if manager == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", "", err
		}
		manager = filepath.Join(filepath.Dir(exe), "manager")
	}
	if manager, err = filepath.Abs(manager); err != nil {
		return "", "", err
	}
	if _, err := os.Stat(manager); err != nil {
		return "", "", fmt.Errorf("manager binary: %w (build it with `make build`, or name it with --manager)", err)
	}
	if assets, err = FindAssets(o.Assets); err != nil {
		return "", "", err
	}
	if assets, err = filepath.Abs(assets); err != nil {
		return "", "", err
	}
	return manager, assets, nil
}

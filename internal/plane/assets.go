package plane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// AssetBinaries are the control-plane binaries the plane runs from its
// assets directory.
var AssetBinaries = []string{"kube-apiserver", "etcd", "kube-controller-manager", "kubectl"}

// AssetsEnv names the directory setup-envtest and `make` (hack/envtest.sh)
// point at; FindAssets looks there after an explicit directory.
const AssetsEnv = "KUBEBUILDER_ASSETS"

// ErrNoAssets tells that no directory holds every AssetBinary; its
// message says where FindAssets looked and how to build them.
var ErrNoAssets = errors.New("no control-plane binaries")

// FindAssets returns the directory holding every AssetBinary. An explicit
// dir (capl-dev's --assets) is the only one tried; otherwise $AssetsEnv,
// the directory of the running binary (a `make dist` directory), then
// setup-envtest's layout below it (bin/k8s/<version>-linux-amd64 in a
// checkout, where hack/envtest.sh links them).
func FindAssets(dir string) (string, error) {
	var candidates []string
	if dir != "" {
		candidates = []string{dir}
	} else {
		if env := os.Getenv(AssetsEnv); env != "" {
			candidates = append(candidates, env)
		}
		if exe, err := os.Executable(); err == nil {
			exeDir := filepath.Dir(exe)
			candidates = append(candidates, exeDir)
			layouts, _ := filepath.Glob(filepath.Join(exeDir, "k8s", "*-linux-amd64"))
			slices.Sort(layouts)
			slices.Reverse(layouts) // the newest release first
			candidates = append(candidates, layouts...)
		}
	}
	var reasons []string
	for _, c := range candidates {
		err := checkAssets(c)
		if err == nil {
			return c, nil
		}
		reasons = append(reasons, err.Error())
	}
	if len(candidates) == 0 {
		reasons = append(reasons, "no directory to look in")
	}
	return "", fmt.Errorf("%w: %s; build them with `make envtest` (hack/envtest.sh) or use a `make dist` directory, or name their directory with --assets",
		ErrNoAssets, strings.Join(reasons, "; "))
}

// checkAssets tells whether dir holds every AssetBinary as an executable
// file, naming those it lacks.
func checkAssets(dir string) error {
	if dir == "" {
		return errors.New("no assets directory given")
	}
	var missing []string
	for _, b := range AssetBinaries {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s lacks %s", dir, strings.Join(missing, ", "))
	}
	return nil
}

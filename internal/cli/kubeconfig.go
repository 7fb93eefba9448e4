package cli

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// contextName is the kubeconfig context (and cluster and user entry) of
// a workload cluster, as kind names its own kind-NAME.
func contextName(namespace, name string) string {
	if namespace == "" || namespace == "default" {
		return "capl-" + name
	}
	return "capl-" + namespace + "-" + name
}

// kubeconfigFile is the kubeconfig file to merge into, and who owns what
// the merge creates.
type kubeconfigFile struct {
	path string
	// uid and gid own the file and the directories a merge creates (a
	// new ~/.kube and its config); -1 leaves them to the process (not
	// under sudo). A file or directory that exists keeps its owner,
	// whoever ran the command.
	uid, gid int
}

// kubeconfigTarget is where a merge goes: the given path (--kubeconfig),
// else the first file of $KUBECONFIG (firstKubeconfig), else
// ~/.kube/config of the person who ran the command. Under sudo that is
// SUDO_USER's home, not root's, and what the merge creates there is
// owned by SUDO_UID and SUDO_GID, so that they can use it without sudo,
// as kind does.
func kubeconfigTarget(path string) (kubeconfigFile, error) {
	return resolveKubeconfigTarget(path, os.Geteuid(), os.Getenv, user.Lookup, os.UserHomeDir)
}

// resolveKubeconfigTarget is kubeconfigTarget with the process's identity,
// environment and user database passed in, for tests.
func resolveKubeconfigTarget(path string, euid int, getenv func(string) string, lookup func(string) (*user.User, error), home func() (string, error)) (kubeconfigFile, error) {
	t := kubeconfigFile{path: path, uid: -1, gid: -1}
	if t.path == "" {
		t.path = firstKubeconfig(getenv("KUBECONFIG"))
	}
	sudoUser := getenv("SUDO_USER")
	underSudo := euid == 0 && sudoUser != "" && sudoUser != "root"
	if underSudo {
		uid, err1 := strconv.Atoi(getenv("SUDO_UID"))
		gid, err2 := strconv.Atoi(getenv("SUDO_GID"))
		if err1 != nil || err2 != nil {
			u, err := lookup(sudoUser)
			if err != nil {
				return t, fmt.Errorf("SUDO_USER %s: %w", sudoUser, err)
			}
			uid, _ = strconv.Atoi(u.Uid)
			gid, _ = strconv.Atoi(u.Gid)
		}
		t.uid, t.gid = uid, gid
	}
	if t.path != "" {
		return t, nil
	}
	dir := ""
	if underSudo {
		u, err := lookup(sudoUser)
		if err != nil {
			return t, fmt.Errorf("home of SUDO_USER %s: %w", sudoUser, err)
		}
		dir = u.HomeDir
	} else {
		h, err := home()
		if err != nil {
			return t, fmt.Errorf("no home directory for ~/.kube/config: %w (name the file with --kubeconfig)", err)
		}
		dir = h
	}
	t.path = filepath.Join(dir, ".kube", "config")
	return t, nil
}

// firstKubeconfig is the file of a $KUBECONFIG list that a merge writes
// and delete cluster edits: its first entry, whether it exists or not
// (kind and kubectl take the first that exists, if one does); "" when the
// list is empty.
func firstKubeconfig(list string) string {
	for _, p := range filepath.SplitList(list) {
		if p != "" {
			return p
		}
	}
	return ""
}

// mergeKubeconfig merges the workload kubeconfig data into the target
// file under ctxName (cluster, user and context of that name, replacing
// entries of that name) and makes it the current context. Other entries
// are kept. The file is replaced whole and is 0600 (replaceFile); a
// directory made for it is 0700; what the merge creates is owned by the
// target's user.
func mergeKubeconfig(t kubeconfigFile, data []byte, ctxName string) error {
	workload, err := clientcmd.Load(data)
	if err != nil {
		return fmt.Errorf("reading the cluster's kubeconfig: %w", err)
	}
	cur := workload.Contexts[workload.CurrentContext]
	if cur == nil || workload.Clusters[cur.Cluster] == nil || workload.AuthInfos[cur.AuthInfo] == nil {
		return errors.New("the cluster's kubeconfig has no complete current context")
	}
	cfg, err := loadKubeconfig(t.path)
	if err != nil {
		return err
	}
	cfg.Clusters[ctxName] = workload.Clusters[cur.Cluster]
	cfg.AuthInfos[ctxName] = workload.AuthInfos[cur.AuthInfo]
	cfg.Contexts[ctxName] = &clientcmdapi.Context{Cluster: ctxName, AuthInfo: ctxName, Namespace: cur.Namespace}
	cfg.CurrentContext = ctxName
	return writeKubeconfig(t, cfg)
}

// removeKubeconfigContext removes the entries mergeKubeconfig made for
// ctxName; it tells whether there were any. A missing file is fine.
func removeKubeconfigContext(path, ctxName string) (bool, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	cfg, err := loadKubeconfig(path)
	if err != nil {
		return false, err
	}
	_, had := cfg.Contexts[ctxName]
	if !had {
		return false, nil
	}
	delete(cfg.Contexts, ctxName)
	delete(cfg.Clusters, ctxName)
	delete(cfg.AuthInfos, ctxName)
	if cfg.CurrentContext == ctxName {
		cfg.CurrentContext = ""
	}
	// The file exists: it keeps its owner, nothing is created.
	return true, writeKubeconfig(kubeconfigFile{path: path, uid: -1, gid: -1}, cfg)
}

// loadKubeconfig reads the kubeconfig at path; a missing file is an
// empty kubeconfig.
func loadKubeconfig(path string) (*clientcmdapi.Config, error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return clientcmdapi.NewConfig(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return cfg, nil
}

// writeKubeconfig writes cfg to t.path through replaceFile, making its
// directory first when missing; both are owned by t's user only when
// this call creates them.
func writeKubeconfig(t kubeconfigFile, cfg *clientcmdapi.Config) error {
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if err := mkdirOwned(filepath.Dir(t.path), t.uid, t.gid); err != nil {
		return err
	}
	return replaceFile(t.path, data, t.uid, t.gid)
}

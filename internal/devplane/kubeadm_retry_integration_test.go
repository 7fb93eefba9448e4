package devplane

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// retrySandbox runs the retry script as a machine's cloud-init would, in a
// mount namespace of its own: tmpfs over /run and /var/lib and a copy of
// /etc, so that the paths the script reads and writes are the real ones.
// The role is worker or control-plane (a join) or init (the first control
// plane). kubeadm, kubectl, python3 and sleep are recorders on PATH;
// kubeadm's inits and joins answer from $T/results, one line each, and
// leave the files they leave (the kubelet's configuration; a worker's CA
// certificate from discovery; a control plane's static pod manifests,
// which need the CA Cluster API wrote), and its reset deletes what kubeadm
// reset deletes.
const retrySandbox = `set -eu
T=$1 role=$2
mount --make-rprivate /
mount -t tmpfs none "$T/etc" && cp -a /etc/. "$T/etc/" && mount --bind "$T/etc" /etc
mount -t tmpfs none /var/lib && mount -t tmpfs none /run
mkdir -p /etc/kubernetes/manifests /etc/kubernetes/pki /var/lib/kubelet /run/kubeadm /run/cluster-api "$T/bin"
echo ca > /etc/kubernetes/pki/ca.crt
if [ $role = init ]; then
  phase=init config=/run/kubeadm/kubeadm.yaml
else
  phase=join config=/run/kubeadm/kubeadm-join-config.yaml
fi
echo 'nodeRegistration: {name: n}' > $config
for tool in kubectl python3 sleep; do
  cat > "$T/bin/$tool" <<EOF
#!/bin/sh
printf '%s\n' "$tool \$*" >> $T/log
EOF
done
cat > "$T/bin/kubeadm" <<EOF
#!/bin/sh
echo "kubeadm \$*" >> $T/log
if [ "\$1" = reset ]; then
  rm -rf /etc/kubernetes/pki /etc/kubernetes/manifests/* /var/lib/kubelet/config.yaml
  exit 0
fi
touch /var/lib/kubelet/config.yaml
if [ $role = worker ]; then
  mkdir -p /etc/kubernetes/pki && echo ca > /etc/kubernetes/pki/ca.crt
else
  [ -f /etc/kubernetes/pki/ca.crt ] || { echo "kubeadm without ca.crt" >> $T/log; exit 1; }
  touch /etc/kubernetes/manifests/kube-apiserver.yaml
  echo '--initial-advertise-peer-urls=https://10.0.0.9:2380' > /etc/kubernetes/manifests/etcd.yaml
fi
result=\$(head -n 1 $T/results); sed -i 1d $T/results
[ "\$result" = ok ]
EOF
chmod +x "$T/bin/"*
export PATH="$T/bin:$PATH"
[ $role != worker ] && sh "$T/retry.sh" keep
# Cluster API's own init or join, then the script as a postKubeadmCommand.
kubeadm $phase --config $config && echo success > /run/cluster-api/bootstrap-success.complete || true
status=0
sh "$T/retry.sh" > "$T/out" 2>&1 || status=$?
echo "exit $status" >> "$T/log"
[ -f /run/cluster-api/bootstrap-success.complete ] && echo "bootstrapped" >> "$T/log"
[ -f /etc/kubernetes/pki/ca.crt ] && echo "ca.crt kept" >> "$T/log"
true
`

// TestKubeadmRetryScript runs the template's capl-kubeadm-retry after a
// failed first init or join: a worker retries from a clean slate, a
// control plane past kubelet-start resumes at etcd-join but for the last
// attempt, which removes its etcd member, resets and restores the CA, a
// control plane that gives up removes its etcd member once more, and a
// failed init resumes at wait-control-plane, keeping its API server and
// etcd, but for the last attempt. It needs root for the mount namespace.
func TestKubeadmRetryScript(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("runs the retry script in a mount namespace: needs root (make test runs as root in CI)")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("unshare (util-linux) is missing: %v", err)
	}
	script := renderedRetryScript(t)
	join := "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml"
	resume := join + " --skip-phases preflight,control-plane-prepare,check-etcd,kubelet-start"
	leaveEtcd := "python3 - https://10.0.0.9:2380"
	initCmd := "kubeadm init --config /run/kubeadm/kubeadm.yaml"
	initResume := initCmd + " --skip-phases preflight,certs,kubeconfig,etcd,control-plane,kubelet-start"
	reset := "kubeadm reset --force"
	for _, tc := range []struct {
		name, role string
		results    []string
		want       []string
		// never are outcomes the log must not show.
		never []string
	}{{
		name: "worker: a clean retry", role: "worker", results: []string{"fail", "ok"},
		want: []string{join, "sleep 30", "kubeadm reset --force", join, "exit 0", "bootstrapped"},
	}, {
		name: "control plane: resumed at etcd-join", role: "control-plane", results: []string{"fail", "ok"},
		want: []string{join, "sleep 30", resume, "exit 0", "bootstrapped", "ca.crt kept"},
	}, {
		name: "control plane: the last attempt from a clean slate", role: "control-plane",
		results: []string{"fail", "fail", "fail", "fail", "fail", "ok"},
		want: []string{join, "sleep 30", resume, "sleep 30", resume, "sleep 30", resume, "sleep 30", resume, "sleep 30",
			"kubectl --kubeconfig /etc/kubernetes/admin.conf --request-timeout=60s -n kube-system get pods -l component=etcd,tier=control-plane -o jsonpath={range .items[*]}{.metadata.annotations.kubeadm\\.kubernetes\\.io/etcd\\.advertise-client-urls}{\"\\n\"}{end}",
			leaveEtcd, "kubeadm reset --force", join, "exit 0", "bootstrapped", "ca.crt kept"},
	}, {
		name: "control plane: given up, its etcd member removed", role: "control-plane",
		results: []string{"fail", "fail", "fail", "fail", "fail", "fail"},
		want:    []string{resume, resume, resume, resume, leaveEtcd, "kubeadm reset --force", join, leaveEtcd, "exit 1", "ca.crt kept"},
		never:   []string{"bootstrapped"},
	}, {
		name: "init: resumed at wait-control-plane, nothing reset", role: "init", results: []string{"fail", "ok"},
		want:  []string{initCmd, "sleep 30", initResume, "exit 0", "bootstrapped", "ca.crt kept"},
		never: []string{reset},
	}, {
		name: "init: the last attempt from a clean slate", role: "init",
		results: []string{"fail", "fail", "fail", "fail", "fail", "ok"},
		want:    []string{initCmd, initResume, initResume, initResume, initResume, reset, initCmd, "exit 0", "bootstrapped", "ca.crt kept"},
		never:   []string{leaveEtcd},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range map[string]string{"retry.sh": script, "sandbox.sh": retrySandbox, "results": strings.Join(tc.results, "\n") + "\n"} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Mkdir(filepath.Join(dir, "etc"), 0o700); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("unshare", "-m", "sh", filepath.Join(dir, "sandbox.sh"), dir, tc.role).CombinedOutput(); err != nil {
				t.Fatalf("sandbox: %v: %s", err, out)
			}
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			out, _ := os.ReadFile(filepath.Join(dir, "out"))
			if !inOrder(strings.Split(strings.TrimSpace(string(log)), "\n"), tc.want) {
				t.Errorf("calls and outcome:\n%s\nwant, in this order:\n%s\nthe script said:\n%s", log, strings.Join(tc.want, "\n"), out)
			}
			for _, line := range strings.Split(strings.TrimSpace(string(log)), "\n") {
				if slices.Contains(tc.never, line) {
					t.Errorf("the log shows %q, which this case must not:\n%s\nthe script said:\n%s", line, log, out)
				}
			}
		})
	}
}

// inOrder reports whether want are among got in want's order.
func inOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// renderedRetryScript is the retry script of cluster-template.yaml's
// control plane, rendered as clusterctl renders it.
func renderedRetryScript(t *testing.T) string {
	t.Helper()
	o := ClusterOptions{
		Namespace: "team-a", Name: "k8s", ControlPlane: 1, Workers: 1, KubernetesVersion: "v1.36.3",
		Template: repoFile("templates", "cluster-template.yaml"), CNI: repoFile("templates", "cni-flannel.yaml"),
		ImageDir: fakeImageDir(t, "v1.36.3"), DomainType: "qemu", StoragePool: "capl-team-a",
	}
	imgs, err := ImageVolumes(o)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := RenderCluster(o, ClusterVariables(o, imgs))
	if err != nil {
		t.Fatal(err)
	}
	var kcp *unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() == "KubeadmControlPlane" {
			kcp = u
		}
	}
	script := renderedFile(t, kcp, []string{"spec", "kubeadmConfigSpec", "files"}, kubeadmRetryScript)
	if script == "" {
		t.Fatal("the control plane writes no kubeadm retry script")
	}
	return script
}

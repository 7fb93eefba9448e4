package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// verdict is the outcome of one doctor check.
type verdict int

const (
	pass verdict = iota
	warn
	fail
)

func (v verdict) String() string {
	return [...]string{"ok", "WARN", "FAIL"}[v]
}

// check is one line of the doctor's report.
type check struct {
	name    string
	verdict verdict
	detail  string
}

// doctorNeeds is what the command about to run needs of the host.
type doctorNeeds struct {
	// plane: the plane will be started, so its binaries must exist;
	// nil when it runs already or is not needed.
	plane *plane.Options
	// cluster is the cluster to be made; nil for none (up --no-demo).
	cluster *devplane.ClusterOptions
	// standIn is the stand-in demo to be made instead; nil for none.
	standIn *devplane.DemoOptions
	// domainType and cpuMode are the flags that choose the accelerator.
	domainType, cpuMode string
}

// planeMemoryMiB is what the plane's five processes take together,
// measured by TestPlaneLifecycle (about 800 MiB), rounded up.
const planeMemoryMiB = 1024

func (a *app) doctorCommand() *cobra.Command {
	var cf clusterFlags
	var o plane.Options
	noCluster := false
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this host can run the plane and the cluster asked for",
		Long: `Checks what the plane and a cluster of the given sizes need of this host and
says, for each thing missing, what to do: root, libvirtd answering, KVM usable
(or why the guests run under TCG), free memory and disk against the requested
sizes, the binaries and images (and, when one must be built, Go and a Debian
mirror). up and create cluster run it first. Exits 1 when a check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.StateDir, o.LibvirtURI = a.stateDir, a.uri()
			needs, _, err := cf.needs(a.stateDir, &o, noCluster)
			if err != nil {
				return err
			}
			checks := a.runDoctor(cmd.Context(), needs)
			printChecks(a.out, checks)
			return failed(checks)
		},
	}
	cf.bind(cmd.Flags(), true)
	managerFlags(cmd.Flags(), &o)
	cmd.Flags().BoolVar(&noCluster, "no-demo", false, "check for the plane only, no cluster")
	_ = cmd.Flags().MarkHidden("kubeconfig-out")
	return cmd
}

// printChecks writes the report, one aligned line per check.
func printChecks(w io.Writer, checks []check) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.verdict, c.name, c.detail)
	}
	_ = tw.Flush()
}

// failed is an error naming the failed checks, or nil.
func failed(checks []check) error {
	var names []string
	for _, c := range checks {
		if c.verdict == fail {
			names = append(names, c.name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	return fmt.Errorf("the host is not ready: %s (FAIL lines above say what to do)", strings.Join(names, ", "))
}

// runDoctor runs every check needs calls for.
func (a *app) runDoctor(ctx context.Context, needs doctorNeeds) []check {
	var checks []check
	add := func(c check) { checks = append(checks, c) }

	uri := a.uri()
	add(rootCheck(uri, a.stateDir))
	host, c := a.libvirtCheck(ctx, uri)
	add(c)
	if host != nil {
		defer host.Close()
	}
	add(acceleratorCheck(needs.domainType, needs.cpuMode))

	var missing []string // what a build would have to make
	if needs.plane != nil {
		c, m := planeBinariesCheck(*needs.plane)
		add(c)
		missing = append(missing, m...)
	}
	var want sizes
	if needs.plane != nil {
		want.planeMiB = planeMemoryMiB
	}
	switch {
	case needs.cluster != nil:
		c, m, imgs := clusterImagesCheck(*needs.cluster)
		add(c)
		missing = append(missing, m...)
		s, err := clusterSizes(*needs.cluster)
		if err != nil {
			add(check{"sizes", fail, err.Error()})
			break
		}
		s.images = imgs
		s.pool = poolPath(needs.cluster.StoragePool)
		want.add(s)
		if host != nil {
			want.memoryMiB -= runningMemoryMiB(ctx, host, needs.cluster.Namespace, needs.cluster.Name)
		}
	case needs.standIn != nil:
		c, m, imgs := standInImagesCheck(*needs.standIn)
		add(c)
		missing = append(missing, m...)
		s := standInSizes(*needs.standIn)
		s.images = imgs
		s.pool = poolPath(needs.standIn.StoragePool)
		want.add(s)
		if host != nil {
			want.memoryMiB -= runningMemoryMiB(ctx, host, needs.standIn.Namespace, needs.standIn.Name)
		}
	}
	add(memoryCheck(want))
	add(diskCheck(want, a.stateDir))
	add(goCheck(ctx, missing))
	add(mirrorCheck(ctx, missing))
	return checks
}

// rootCheck: libvirt's system socket and the default state directory
// are root's.
func rootCheck(uri, stateDir string) check {
	if os.Geteuid() == 0 {
		return check{"root", pass, "running as root"}
	}
	if strings.Contains(uri, "/system") || strings.HasPrefix(stateDir, "/var/") {
		return check{"root", fail, fmt.Sprintf("running as uid %d: libvirt's system socket (%s) and %s are root's; run `sudo capl-dev …` (sudo make … from a checkout)", os.Geteuid(), uri, stateDir)}
	}
	return check{"root", warn, fmt.Sprintf("running as uid %d, with libvirt at %s and state in %s", os.Geteuid(), uri, stateDir)}
}

// libvirtCheck dials libvirt: a libvirtd that does not answer is said
// within libvirtAnswerTimeout. The host is nil when it did not answer.
func (a *app) libvirtCheck(ctx context.Context, uri string) (*virt.Client, check) {
	h, err := dialLibvirt(ctx, uri)
	if err != nil {
		return nil, check{"libvirtd", fail, err.Error()}
	}
	// The same bound for the first call: a libvirtd that accepts and
	// does not answer is down too.
	ctx, cancel := context.WithTimeout(ctx, libvirtAnswerTimeout)
	defer cancel()
	mem, err := h.HostMemory(ctx)
	if err != nil {
		_ = h.Close()
		return nil, check{"libvirtd", fail, libvirtDown(uri, err).Error()}
	}
	return h, check{"libvirtd", pass, fmt.Sprintf("answers at %s (host memory %.1f GiB)", uri, float64(mem)/(1<<30))}
}

// acceleratorCheck says whether guests get KVM, and why not.
func acceleratorCheck(domainType, cpuMode string) check {
	c, err := devplane.ChooseDomainType(domainType, cpuMode)
	if err != nil {
		return check{"accelerator", fail, err.Error()}
	}
	if c.DomainType == "kvm" {
		return check{"accelerator", pass, c.Reason}
	}
	return check{"accelerator", warn, c.Reason + "; guests run 10-20× slower than under KVM: expect a 1 + 1 cluster Ready 5-20 minutes after apply (docs/tcg.md)"}
}

// planeBinariesCheck looks for the manager and the control-plane
// binaries the plane runs; missing lists what a build has to make.
func planeBinariesCheck(o plane.Options) (check, []string) {
	var problems, missing []string
	mgr := o.ManagerBinary
	if mgr == "" {
		if exe, err := os.Executable(); err == nil {
			mgr = filepath.Join(filepath.Dir(exe), "manager")
		}
	}
	if _, err := os.Stat(mgr); err != nil {
		problems = append(problems, fmt.Sprintf("no manager binary at %s (make build, or --manager)", mgr))
		missing = append(missing, "the manager (make build)")
	}
	assets, err := plane.FindAssets(o.Assets)
	if err != nil {
		problems = append(problems, err.Error())
		missing = append(missing, "kube-apiserver, etcd, kube-controller-manager and kubectl (make envtest)")
	}
	if len(problems) > 0 {
		return check{"binaries", fail, strings.Join(problems, "; ")}, missing
	}
	return check{"binaries", pass, fmt.Sprintf("manager %s, control plane in %s", mgr, assets)}, nil
}

// clusterImagesCheck looks for the node and HAProxy images; it returns
// their total size for the disk check.
func clusterImagesCheck(o devplane.ClusterOptions) (check, []string, int64) {
	return imagesCheck([]imageFile{
		{o.NodeImagePath(), "make node-image KUBERNETES_VERSION=" + o.KubernetesVersion},
		{filepath.Join(o.ImageDir, devplane.HAProxyImageFile), "make images"},
	})
}

func standInImagesCheck(o devplane.DemoOptions) (check, []string, int64) {
	return imagesCheck([]imageFile{
		{filepath.Join(o.ImageDir, devplane.NodeImageFile), "make images"},
		{filepath.Join(o.ImageDir, devplane.HAProxyImageFile), "make images"},
	})
}

// imageFile is an image a cluster boots and the command that builds it.
type imageFile struct{ path, build string }

func imagesCheck(files []imageFile) (check, []string, int64) {
	var problems, missing, found []string
	var total int64
	for _, f := range files {
		fi, err := os.Stat(f.path)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s is missing (%s)", f.path, f.build))
			missing = append(missing, filepath.Base(f.path)+" ("+f.build+")")
			continue
		}
		total += fi.Size()
		found = append(found, fmt.Sprintf("%s (%d MiB)", f.path, fi.Size()>>20))
	}
	if len(problems) > 0 {
		return check{"images", fail, strings.Join(problems, "; ")}, missing, total
	}
	return check{"images", pass, strings.Join(found, ", ")}, nil, total
}

// goPaths are where Go is looked for: PATH, then /usr/local/go, where
// sudo's secure_path does not reach.
var goPaths = []string{"/usr/local/go/bin/go"}

// goCheck: Go is needed only when something must be built.
func goCheck(ctx context.Context, missing []string) check {
	path, err := exec.LookPath("go")
	if err != nil {
		for _, p := range goPaths {
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
	}
	version := ""
	if path != "" {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, path, "env", "GOVERSION").Output()
		if err == nil {
			version = strings.TrimSpace(string(out))
		}
	}
	switch {
	case len(missing) == 0 && path == "":
		return check{"go", pass, "not needed: nothing to build"}
	case len(missing) == 0:
		return check{"go", pass, fmt.Sprintf("%s at %s (nothing to build)", version, path)}
	case path == "":
		return check{"go", fail, fmt.Sprintf("building %s needs Go 1.26: install it at /usr/local/go (https://go.dev/dl), or copy a `make dist` directory and the images here", strings.Join(missing, ", "))}
	}
	return check{"go", pass, fmt.Sprintf("%s at %s builds %s", version, path, strings.Join(missing, ", "))}
}

// mirrorCheck: an image build downloads Debian packages from the mirror
// of the host's apt configuration (images/build.sh), or CAPL_MIRROR.
func mirrorCheck(ctx context.Context, missing []string) check {
	var images []string
	for _, m := range missing {
		if strings.Contains(m, "qcow2") {
			images = append(images, m)
		}
	}
	if len(images) == 0 {
		return check{"debian mirror", pass, "not needed: no image to build"}
	}
	mirror := os.Getenv("CAPL_MIRROR")
	if mirror == "" {
		mirror = aptMirror()
	}
	if mirror == "" {
		return check{"debian mirror", fail, "building " + strings.Join(images, ", ") + " needs a Debian mirror: none (a URI ending in /debian) in /etc/apt; set CAPL_MIRROR"}
	}
	url := strings.TrimSuffix(mirror, "/") + "/dists/bookworm/Release"
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, url, nil)
	if err != nil {
		return check{"debian mirror", fail, err.Error()}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return check{"debian mirror", fail, fmt.Sprintf("%s does not answer (%v): the image build needs it; set CAPL_MIRROR to one that does", mirror, err)}
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return check{"debian mirror", fail, fmt.Sprintf("%s: %s", url, resp.Status)}
	}
	return check{"debian mirror", pass, mirror + " answers (for " + strings.Join(images, ", ") + ")"}
}

// aptMirror is the first Debian archive URI (ending in /debian) of the
// host's apt sources, one-line and deb822 style, as images/build.sh
// reads them.
func aptMirror() string {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*")
	files = append([]string{"/etc/apt/sources.list"}, files...)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			fields := strings.Fields(line)
			var uris []string
			switch {
			case len(fields) >= 2 && fields[0] == "deb":
				i := 1
				if strings.HasPrefix(fields[i], "[") {
					for i < len(fields) && !strings.HasSuffix(fields[i], "]") {
						i++
					}
					i++
				}
				if i < len(fields) {
					uris = fields[i : i+1]
				}
			case len(fields) >= 2 && strings.EqualFold(fields[0], "URIs:"):
				uris = fields[1:]
			}
			for _, u := range uris {
				if strings.HasSuffix(strings.TrimSuffix(u, "/"), "/debian") {
					return u
				}
			}
		}
	}
	return ""
}

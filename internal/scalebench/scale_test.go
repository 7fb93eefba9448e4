//go:build scale

// Package scalebench measures the provider's manager as a management
// cluster grows (make bench-scale): a real kube-apiserver and etcd
// (internal/plane's, through testenv), Cluster API's core controllers,
// the provider's manager as pkg/manager wires it, in a process of its
// own, and a simulated libvirt host at the virt.Host boundary
// (simhost_test.go). docs/performance.md has the figures.
package scalebench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
)

var (
	flagN        = flag.Int("scale.n", 1000, "largest number of machines; the run measures 100, 300 and this (those of 100 and 300 below it)")
	flagSizes    = flag.String("scale.sizes", "", "comma-separated machine counts to measure instead of those -scale.n implies")
	flagBoot     = flag.Duration("scale.boot", 10*time.Second, "simulated time from a domain's start to its DHCP lease and finished bootstrap")
	flagRest     = flag.Duration("scale.rest", time.Minute, "how long the manager is watched at rest with every machine provisioned")
	flagSettle   = flag.Duration("scale.settle", 30*time.Second, "wait between the last machine provisioned and the rest window (bootstrap checks, seed removal)")
	flagPerMD    = flag.Int("scale.machines-per-deployment", 25, "replicas of each MachineDeployment")
	flagMDs      = flag.Int("scale.deployments-per-cluster", 2, "MachineDeployments of each cluster")
	flagClusters = flag.Int("scale.clusters-per-namespace", 2, "clusters of each namespace")
	flagTimeout  = flag.Duration("scale.phase-timeout", 45*time.Minute, "bound on creating, or deleting, the machines of one size")
	flagPprof    = flag.Bool("scale.pprof", true, "keep a CPU profile of the manager's creation phase and a heap profile at rest in the artifacts")
	flagArgs     = flag.String("scale.manager-args", "", "extra flags of the manager (space-separated)")
)

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "manager" {
		os.Exit(runManager())
	}
	os.Exit(m.Run())
}

// sizes are the machine counts to measure.
func sizes() ([]int, error) {
	if *flagSizes != "" {
		var out []int
		for _, f := range strings.Split(*flagSizes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("-scale.sizes: %q is not a machine count", f)
			}
			out = append(out, n)
		}
		return out, nil
	}
	var out []int
	for _, n := range []int{100, 300} {
		if n < *flagN {
			out = append(out, n)
		}
	}
	return append(out, *flagN), nil
}

func artifactsDir() string {
	if d := os.Getenv("CAPL_SCALE_ARTIFACTS"); d != "" {
		return d
	}
	return filepath.Join("..", "..", "_artifacts", "scale")
}

// TestScale measures each size in turn, each on a fresh API server, etcd,
// Cluster API and manager, and writes the report.
func TestScale(t *testing.T) {
	// Cluster API's controllers run in this process; their logs are not
	// what the benchmark reads (without a logger, controller-runtime
	// prints a stack trace instead).
	ctrl.SetLogger(logr.Discard())
	ns, err := sizes()
	if err != nil {
		t.Fatal(err)
	}
	dir := artifactsDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	report := Report{Started: time.Now().UTC(), Boot: flagBoot.String(), Rest: flagRest.String(),
		Layout: fmt.Sprintf("%d machines per MachineDeployment, %d MachineDeployments per cluster, %d clusters per namespace",
			*flagPerMD, *flagMDs, *flagClusters)}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		report.Commit = strings.TrimSpace(string(out))
	}
	for _, n := range ns {
		r, err := runSize(t, n, dir)
		if err != nil {
			t.Errorf("N=%d: %v", n, err)
			break
		}
		report.Results = append(report.Results, r)
		if err := report.Write(dir); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Print(report.Table())
	t.Logf("figures and plots in %s", dir)
}

// Result is what one size measured.
type Result struct {
	N          int `json:"n"`
	Namespaces int `json:"namespaces"`
	Clusters   int `json:"clusters"`

	CreateSeconds     float64 `json:"createSeconds"`
	MachinesPerMinute float64 `json:"machinesPerMinute"`
	P50Seconds        float64 `json:"p50Seconds"`
	P99Seconds        float64 `json:"p99Seconds"`

	Create Phase `json:"create"`
	Rest   Phase `json:"rest"`
	Delete Phase `json:"delete"`

	DeleteSeconds float64 `json:"deleteSeconds"`

	LibvirtCallsPerReconcile float64 `json:"libvirtCallsPerReconcile"`
	ReconcilesPerMachine     float64 `json:"reconcilesPerMachine"`
	ListOwnedPerMachine      float64 `json:"listOwnedPerMachine"`
}

// Phase is what the processes did between two snapshots.
type Phase struct {
	Seconds float64 `json:"seconds"`
	// CPU is core-seconds per minute, by process (manager, kube-apiserver, etcd).
	CPU map[string]float64 `json:"cpuCoreSecondsPerMinute"`
	// ManagerRSSMiB is the manager's resident memory at the phase's end,
	// ManagerMaxRSSMiB the most seen during it.
	ManagerRSSMiB    float64 `json:"managerRSSMiB"`
	ManagerMaxRSSMiB float64 `json:"managerMaxRSSMiB"`
	// APIRequestsPerSecond are the manager's requests by "VERB resource".
	APIRequestsPerSecond map[string]float64 `json:"apiRequestsPerSecond"`
	// LibvirtCalls are the simulated host's calls by method.
	LibvirtCalls map[string]int64 `json:"libvirtCalls"`
	// Reconciles are the manager's reconciles by controller.
	Reconciles map[string]float64 `json:"reconciles"`
}

// snapshot is the processes' counters at one moment.
type snapshot struct {
	at    time.Time
	ticks map[string]uint64
	rss   float64
	stats Stats
}

// run is one size's environment.
type run struct {
	t       *testing.T
	n       int
	dir     string
	env     *testenv.Environment
	mgr     *exec.Cmd
	mgrDone chan error
	stats   string
	pprof   string
	health  string
	procs   map[string]int // name → pid

	mu          sync.Mutex
	created     map[string]time.Time
	provisioned map[string]time.Time
	gone        map[string]time.Time
}

func runSize(t *testing.T, n int, dir string) (Result, error) {
	perCluster := *flagPerMD * *flagMDs
	clusters := (n + perCluster - 1) / perCluster
	namespaces := (clusters + *flagClusters - 1) / *flagClusters
	res := Result{N: n, Namespaces: namespaces, Clusters: clusters}
	t.Logf("N=%d: %d namespaces, %d clusters", n, namespaces, clusters)

	env, err := testenv.Start(plane.WithProviderWebhooks())
	if err != nil {
		return res, err
	}
	defer func() { _ = env.Stop() }()
	capi, err := env.StartCAPI()
	if err != nil {
		return res, err
	}
	defer func() { _ = capi.Stop() }()
	r := &run{t: t, n: n, dir: dir, env: env, created: map[string]time.Time{}, provisioned: map[string]time.Time{}, gone: map[string]time.Time{}}
	r.procs = childProcesses()
	if err := r.startManager(namespaces, clusters); err != nil {
		return res, err
	}
	defer r.stopManager()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.track(ctx); err != nil {
		return res, err
	}

	// The clusters first, provisioned before any machine is asked for.
	var mds []*clusterv1.MachineDeployment
	for c := 0; c < clusters; c++ {
		nsName := fmt.Sprintf("scale-%d", c / *flagClusters)
		if c%*flagClusters == 0 {
			if err := r.createNamespace(ctx, nsName); err != nil {
				return res, err
			}
		}
		replicas := min(perCluster, n-c*perCluster)
		got, err := r.createCluster(ctx, nsName, fmt.Sprintf("c%d", c), replicas)
		if err != nil {
			return res, err
		}
		mds = append(mds, got...)
	}
	if err := r.waitClusters(ctx, clusters); err != nil {
		return res, err
	}

	before, err := r.snapshot()
	if err != nil {
		return res, err
	}
	var profile sync.WaitGroup
	if *flagPprof {
		profile.Add(1)
		go func() {
			defer profile.Done()
			r.fetch("/debug/pprof/profile?seconds=60", fmt.Sprintf("manager-cpu-create-%d.pprof", n))
		}()
	}
	start := time.Now()
	for _, md := range mds {
		if err := env.Client.Create(ctx, md); err != nil {
			return res, fmt.Errorf("creating MachineDeployment %s/%s: %w", md.Namespace, md.Name, err)
		}
	}
	maxRSS, err := r.waitFor(ctx, "machines provisioned", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.provisioned) >= n, fmt.Sprintf("%d of %d provisioned", len(r.provisioned), n)
	})
	if err != nil {
		// What was done until then, for the record.
		if partial, serr := r.snapshot(); serr == nil {
			p := phase(before, partial, maxRSS)
			r.mu.Lock()
			done := len(r.provisioned)
			r.mu.Unlock()
			data, _ := json.MarshalIndent(struct {
				Provisioned int   `json:"provisioned"`
				Phase       Phase `json:"phase"`
			}{done, p}, "", "  ")
			_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("partial-create-%d.json", n)), data, 0o644)
			r.t.Logf("N=%d: unfinished creation: %s", n, data)
		}
		return res, err
	}
	created, err := r.snapshot()
	if err != nil {
		return res, err
	}
	res.Create = phase(before, created, maxRSS)
	r.mu.Lock()
	var lat []float64
	last := start
	for k, p := range r.provisioned {
		lat = append(lat, p.Sub(r.created[k]).Seconds())
		if p.After(last) {
			last = p
		}
	}
	r.mu.Unlock()
	sort.Float64s(lat)
	res.P50Seconds, res.P99Seconds = quantile(lat, 0.50), quantile(lat, 0.99)
	res.CreateSeconds = last.Sub(start).Seconds()
	res.MachinesPerMinute = float64(n) / last.Sub(start).Minutes()
	reconciles := res.Create.Reconciles["libvirtmachine"]
	var calls int64
	for _, c := range res.Create.LibvirtCalls {
		calls += c
	}
	if reconciles > 0 {
		res.LibvirtCallsPerReconcile = float64(calls) / reconciles
	}
	res.ReconcilesPerMachine = reconciles / float64(n)
	res.ListOwnedPerMachine = float64(res.Create.LibvirtCalls["ListOwned"]) / float64(n)
	profile.Wait()
	t.Logf("N=%d: provisioned in %.0fs (%.0f/min, p50 %.1fs, p99 %.1fs)", n, res.CreateSeconds, res.MachinesPerMinute, res.P50Seconds, res.P99Seconds)

	// At rest: nothing changes.
	time.Sleep(*flagSettle)
	restStart, err := r.snapshot()
	if err != nil {
		return res, err
	}
	maxRSS = restStart.rss
	deadline := time.Now().Add(*flagRest)
	for time.Now().Before(deadline) {
		time.Sleep(5 * time.Second)
		if rss := rssMiB(r.mgr.Process.Pid); rss > maxRSS {
			maxRSS = rss
		}
	}
	restEnd, err := r.snapshot()
	if err != nil {
		return res, err
	}
	res.Rest = phase(restStart, restEnd, maxRSS)
	if *flagPprof {
		r.fetch("/debug/pprof/heap", fmt.Sprintf("manager-heap-rest-%d.pprof", n))
	}
	t.Logf("N=%d: at rest %.2f core-s/min, %.0f MiB", n, res.Rest.CPU["manager"], res.Rest.ManagerRSSMiB)

	// Deleting all N.
	start = time.Now()
	for _, md := range mds {
		if err := env.Client.Delete(ctx, md); err != nil {
			return res, fmt.Errorf("deleting MachineDeployment %s/%s: %w", md.Namespace, md.Name, err)
		}
	}
	maxRSS, err = r.waitFor(ctx, "machines deleted", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.gone) >= n, fmt.Sprintf("%d of %d deleted", len(r.gone), n)
	})
	if err != nil {
		return res, err
	}
	deleted, err := r.snapshot()
	if err != nil {
		return res, err
	}
	res.Delete = phase(restEnd, deleted, maxRSS)
	res.DeleteSeconds = time.Since(start).Seconds()
	t.Logf("N=%d: deleted in %.0fs", n, res.DeleteSeconds)
	return res, nil
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// phase is what happened between a and b.
func phase(a, b snapshot, maxRSS float64) Phase {
	secs := b.at.Sub(a.at).Seconds()
	p := Phase{Seconds: secs, CPU: map[string]float64{}, ManagerRSSMiB: b.rss, ManagerMaxRSSMiB: max(maxRSS, b.rss),
		APIRequestsPerSecond: map[string]float64{}, LibvirtCalls: map[string]int64{}, Reconciles: map[string]float64{}}
	for name, t := range b.ticks {
		// Clock ticks are 1/100 s on Linux.
		p.CPU[name] = float64(t-a.ticks[name]) / 100 / (secs / 60)
	}
	for k, v := range b.stats.APIRequests {
		if d := v - a.stats.APIRequests[k]; d > 0 {
			p.APIRequestsPerSecond[k] = float64(d) / secs
		}
	}
	for k, v := range b.stats.LibvirtCalls {
		if d := v - a.stats.LibvirtCalls[k]; d > 0 {
			p.LibvirtCalls[k] = d
		}
	}
	for k, v := range b.stats.Reconciles {
		if d := v - a.stats.Reconciles[k]; d > 0 {
			p.Reconciles[k] = d
		}
	}
	return p
}

// childProcesses are this process's kube-apiserver and etcd, by name.
func childProcesses() map[string]int {
	out := map[string]int{}
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, ppid, _, err := procStat(pid)
		if err != nil || ppid != self {
			continue
		}
		switch comm {
		case "kube-apiserver", "etcd":
			out[comm] = pid
		}
	}
	return out
}

// procStat reads a process's name, parent and CPU ticks (user + system).
func procStat(pid int) (comm string, ppid int, ticks uint64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, 0, err
	}
	s := string(data)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < 0 {
		return "", 0, 0, errors.New("malformed stat")
	}
	comm = s[open+1 : end]
	f := strings.Fields(s[end+2:])
	// After the name: state, ppid, ..., utime (14th field) and stime.
	ppid, _ = strconv.Atoi(f[1])
	u, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return comm, ppid, u + st, nil
}

// rssMiB is a process's resident memory.
func rssMiB(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func (r *run) snapshot() (snapshot, error) {
	s := snapshot{at: time.Now(), ticks: map[string]uint64{}}
	pids := map[string]int{"manager": r.mgr.Process.Pid}
	for k, v := range r.procs {
		pids[k] = v
	}
	for name, pid := range pids {
		_, _, ticks, err := procStat(pid)
		if err != nil {
			return s, fmt.Errorf("reading %s's CPU: %w", name, err)
		}
		s.ticks[name] = ticks
	}
	s.rss = rssMiB(r.mgr.Process.Pid)
	resp, err := http.Get("http://" + r.stats)
	if err != nil {
		return s, fmt.Errorf("reading the manager's figures: %w", err)
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s.stats)
}

// fetch saves a pprof endpoint of the manager into the artifacts.
func (r *run) fetch(path, name string) {
	resp, err := http.Get("http://" + r.pprof + path)
	if err != nil {
		r.t.Logf("pprof %s: %v", path, err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(filepath.Join(r.dir, name))
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = io.Copy(f, resp.Body)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startManager runs the manager process with the flags an operator would
// give it on one host, namespace quotas on, and waits until it is ready.
func (r *run) startManager(namespaces, clusters int) error {
	var err error
	for _, a := range []*string{&r.stats, &r.pprof, &r.health} {
		if *a, err = freeAddr(); err != nil {
			return err
		}
	}
	perNS := *flagClusters * *flagMDs * *flagPerMD
	args := []string{
		"--libvirt-uri=test:///simulated",
		"--health-addr=" + r.health,
		"--diagnostics-address=0",
		"--insecure-diagnostics",
		"--webhook-host=127.0.0.1",
		"--webhook-port=" + strconv.Itoa(r.env.WebhookPort()),
		"--webhook-cert-dir=" + r.env.WebhookCertDir(),
		// The namespace quotas on, with room for what each namespace asks.
		"--namespace-max-machines=" + strconv.Itoa(perNS+10),
		"--namespace-max-clusters=" + strconv.Itoa(*flagClusters+1),
		"--namespace-max-vcpus=" + strconv.Itoa(2*perNS+10),
		"--namespace-max-memory=" + strconv.Itoa(perNS+10) + "Gi",
		"--namespace-max-disk=" + strconv.Itoa(20*(perNS+10)) + "Gi",
	}
	if *flagPprof {
		args = append(args, "--profiler-address="+r.pprof)
	}
	if *flagArgs != "" {
		args = append(args, strings.Fields(*flagArgs)...)
	}
	argsJSON, _ := json.Marshal(args)
	log, err := os.Create(filepath.Join(r.dir, fmt.Sprintf("manager-%d.log", r.n)))
	if err != nil {
		return err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"=manager", argsEnv+"="+string(argsJSON), statsAddrEnv+"="+r.stats,
		bootEnv+"="+flagBoot.String(), "KUBECONFIG="+r.env.Kubeconfig)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	r.mgr = cmd
	r.mgrDone = make(chan error, 1)
	go func() { r.mgrDone <- cmd.Wait(); log.Close() }()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get("http://" + r.health + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-r.mgrDone:
			return fmt.Errorf("the manager exited: %v (see %s)", err, log.Name())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the manager is not ready after 2m (see %s)", log.Name())
		}
	}
}

func (r *run) stopManager() {
	_ = r.mgr.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.mgrDone:
	case <-time.After(30 * time.Second):
		_ = r.mgr.Process.Kill()
		<-r.mgrDone
	}
}

// track records when each LibvirtMachine appears, is first provisioned
// and is gone.
func (r *run) track(ctx context.Context) error {
	c, err := cache.New(r.env.Config, cache.Options{Scheme: r.env.Client.Scheme()})
	if err != nil {
		return err
	}
	inf, err := c.GetInformer(ctx, &infrav1.LibvirtMachine{})
	if err != nil {
		return err
	}
	see := func(obj any) {
		lm, ok := obj.(*infrav1.LibvirtMachine)
		if !ok {
			return
		}
		key := lm.Namespace + "/" + lm.Name
		now := time.Now()
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, ok := r.created[key]; !ok {
			r.created[key] = now
		}
		if _, ok := r.provisioned[key]; !ok && lm.Status.Initialization.IsProvisioned() {
			r.provisioned[key] = now
		}
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    see,
		UpdateFunc: func(_, obj any) { see(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if lm, ok := obj.(*infrav1.LibvirtMachine); ok {
				r.mu.Lock()
				r.gone[lm.Namespace+"/"+lm.Name] = time.Now()
				r.mu.Unlock()
			}
		},
	})
	if err != nil {
		return err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return errors.New("the tracking cache did not sync")
	}
	return nil
}

// waitFor polls done until it holds, sampling the manager's RSS; it
// returns the most RSS seen.
func (r *run) waitFor(ctx context.Context, what string, done func() (bool, string)) (float64, error) {
	deadline := time.Now().Add(*flagTimeout)
	var maxRSS float64
	lastLog := time.Now()
	for {
		ok, status := done()
		if rss := rssMiB(r.mgr.Process.Pid); rss > maxRSS {
			maxRSS = rss
		}
		if ok {
			return maxRSS, nil
		}
		if time.Since(lastLog) > 30*time.Second {
			r.t.Logf("N=%d: waiting for %s: %s", r.n, what, status)
			lastLog = time.Now()
		}
		select {
		case err := <-r.mgrDone:
			return maxRSS, fmt.Errorf("the manager exited while waiting for %s: %v", what, err)
		case <-ctx.Done():
			return maxRSS, ctx.Err()
		case <-time.After(time.Second):
		}
		if time.Now().After(deadline) {
			return maxRSS, fmt.Errorf("%s: not after %s: %s", what, *flagTimeout, status)
		}
	}
}

func (r *run) createNamespace(ctx context.Context, name string) error {
	c := r.env.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		return err
	}
	return c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "bootstrap"},
		Data: map[string][]byte{"value": []byte("#cloud-config\n{}\n"), "format": []byte("cloud-config")}})
}

// createCluster creates a Cluster, its LibvirtCluster (a NAT network the
// provider makes, the endpoint the user's) and machine template, and
// returns its MachineDeployments, not created yet, of replicas together.
func (r *run) createCluster(ctx context.Context, ns, name string, replicas int) ([]*clusterv1.MachineDeployment, error) {
	c := r.env.Client
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	lc.Spec.LoadBalancer.Type = infrav1.LoadBalancerNone
	lc.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "192.0.2.10", Port: 6443}
	if err := c.Create(ctx, lc); err != nil {
		return nil, fmt.Errorf("creating LibvirtCluster %s/%s: %w", ns, name, err)
	}
	tmpl := &infrav1.LibvirtMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	tmpl.Spec.Template.Spec.Image.Volume = &infrav1.VolumeReference{Pool: imagePool, Name: imageVolume}
	tmpl.Spec.Template.Spec.CPUs = 1
	tmpl.Spec.Template.Spec.MemoryMiB = 512
	tmpl.Spec.Template.Spec.DiskSizeGiB = 10
	if err := c.Create(ctx, tmpl); err != nil {
		return nil, fmt.Errorf("creating LibvirtMachineTemplate %s/%s: %w", ns, name, err)
	}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtCluster", Name: name}
	if err := c.Create(ctx, cluster); err != nil {
		return nil, fmt.Errorf("creating Cluster %s/%s: %w", ns, name, err)
	}
	var mds []*clusterv1.MachineDeployment
	for i := 0; replicas > 0; i++ {
		size := min(replicas, *flagPerMD)
		replicas -= size
		mdName := fmt.Sprintf("%s-md%d", name, i)
		labels := map[string]string{clusterv1.ClusterNameLabel: name, clusterv1.MachineDeploymentNameLabel: mdName}
		md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mdName, Labels: labels}}
		md.Spec.ClusterName = name
		md.Spec.Replicas = ptr.To(int32(size))
		md.Spec.Selector.MatchLabels = labels
		md.Spec.Template.Labels = labels
		md.Spec.Template.Spec.ClusterName = name
		md.Spec.Template.Spec.Bootstrap.DataSecretName = ptr.To("bootstrap")
		md.Spec.Template.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
			APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachineTemplate", Name: name}
		md.Spec.Rollout.Strategy.Type = clusterv1.RollingUpdateMachineDeploymentStrategyType
		md.Spec.Rollout.Strategy.RollingUpdate.MaxSurge = ptr.To(intstr.FromInt32(1))
		md.Spec.Rollout.Strategy.RollingUpdate.MaxUnavailable = ptr.To(intstr.FromInt32(0))
		mds = append(mds, md)
	}
	return mds, nil
}

// waitClusters waits until every LibvirtCluster is provisioned.
func (r *run) waitClusters(ctx context.Context, n int) error {
	_, err := r.waitFor(ctx, "clusters provisioned", func() (bool, string) {
		var l infrav1.LibvirtClusterList
		if err := r.env.Client.List(ctx, &l); err != nil {
			return false, err.Error()
		}
		ready := 0
		var stuck []string
		for i := range l.Items {
			if l.Items[i].Status.Initialization.IsProvisioned() {
				ready++
			} else if len(stuck) < 3 {
				for _, c := range l.Items[i].Status.Conditions {
					if c.Status != metav1.ConditionTrue {
						stuck = append(stuck, l.Items[i].Name+": "+c.Type+" "+c.Reason+" "+c.Message)
					}
				}
			}
		}
		return ready >= n, fmt.Sprintf("%d of %d provisioned %s", ready, n, strings.Join(slices.Compact(stuck), "; "))
	})
	return err
}

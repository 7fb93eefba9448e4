//go:build scale

package scalebench

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Report is one run of the benchmark: every size's figures.
type Report struct {
	Started time.Time `json:"started"`
	Commit  string    `json:"commit"`
	Boot    string    `json:"boot"`
	Rest    string    `json:"rest"`
	Layout  string    `json:"layout"`
	Results []Result  `json:"results"`
}

func sum[K comparable, V int64 | float64](m map[K]V) V {
	var s V
	for _, v := range m {
		s += v
	}
	return s
}

// Table is the figures as a Markdown table, then the API requests of
// the largest size by verb and resource.
func (r Report) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nScale benchmark (commit %s, simulated boot %s, rest window %s; %s)\n\n", r.Commit, r.Boot, r.Rest, r.Layout)
	b.WriteString("| N | machines/min | p50 s | p99 s | manager CPU at rest (core-s/min) | manager RSS at rest (MiB) | manager CPU creating (core-s/min) | API req/s creating | API req/s at rest | libvirt calls/reconcile | reconciles/machine | ListOwned/machine | kube-apiserver CPU creating / at rest | etcd CPU creating / at rest | delete all s |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.Results {
		fmt.Fprintf(&b, "| %d | %.0f | %.1f | %.1f | %.3f | %.0f | %.2f | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f / %.2f | %.2f / %.2f | %.0f |\n",
			x.N, x.MachinesPerMinute, x.P50Seconds, x.P99Seconds, x.Rest.CPU["manager"], x.Rest.ManagerRSSMiB,
			x.Create.CPU["manager"], sum(x.Create.APIRequestsPerSecond), sum(x.Rest.APIRequestsPerSecond),
			x.LibvirtCallsPerReconcile, x.ReconcilesPerMachine, x.ListOwnedPerMachine,
			x.Create.CPU["kube-apiserver"], x.Rest.CPU["kube-apiserver"], x.Create.CPU["etcd"], x.Rest.CPU["etcd"], x.DeleteSeconds)
	}
	for _, x := range r.Results {
		fmt.Fprintf(&b, "\nN=%d, the manager's API requests per second by verb and resource (creating / at rest / deleting):\n\n", x.N)
		keys := map[string]bool{}
		for _, m := range []map[string]float64{x.Create.APIRequestsPerSecond, x.Rest.APIRequestsPerSecond, x.Delete.APIRequestsPerSecond} {
			for k := range m {
				keys[k] = true
			}
		}
		b.WriteString("| request | creating | at rest | deleting |\n|---|---|---|---|\n")
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			fmt.Fprintf(&b, "| %s | %.2f | %.3f | %.2f |\n", k, x.Create.APIRequestsPerSecond[k], x.Rest.APIRequestsPerSecond[k], x.Delete.APIRequestsPerSecond[k])
		}
		fmt.Fprintf(&b, "\nN=%d, libvirt calls (creating / at rest): ", x.N)
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(x.Create.LibvirtCalls)) {
			parts = append(parts, fmt.Sprintf("%s %d/%d", k, x.Create.LibvirtCalls[k], x.Rest.LibvirtCalls[k]))
		}
		for _, k := range slices.Sorted(maps.Keys(x.Rest.LibvirtCalls)) {
			if x.Create.LibvirtCalls[k] == 0 {
				parts = append(parts, fmt.Sprintf("%s 0/%d", k, x.Rest.LibvirtCalls[k]))
			}
		}
		b.WriteString(strings.Join(parts, ", ") + "\n")
		fmt.Fprintf(&b, "reconciles at rest: %v\n", x.Rest.Reconciles)
	}
	return b.String()
}

// series is one line of a plot.
type series struct {
	name  string
	value func(Result) float64
}

// plots are the figures drawn against N.
var plots = []struct {
	file, title, unit string
	lines             []series
}{
	{"machines-per-minute.svg", "Machines provisioned per minute", "machines/min", []series{{"machines/min", func(x Result) float64 { return x.MachinesPerMinute }}}},
	{"time-to-provisioned.svg", "Time from LibvirtMachine to provisioned", "seconds", []series{
		{"p50", func(x Result) float64 { return x.P50Seconds }}, {"p99", func(x Result) float64 { return x.P99Seconds }}}},
	{"manager-cpu.svg", "Manager CPU", "core-seconds per minute", []series{
		{"at rest", func(x Result) float64 { return x.Rest.CPU["manager"] }}, {"creating", func(x Result) float64 { return x.Create.CPU["manager"] }}}},
	{"manager-rss.svg", "Manager resident memory", "MiB", []series{
		{"at rest", func(x Result) float64 { return x.Rest.ManagerRSSMiB }}, {"most while creating", func(x Result) float64 { return x.Create.ManagerMaxRSSMiB }}}},
	{"api-requests.svg", "Manager's API requests per second", "requests/s", []series{
		{"creating", func(x Result) float64 { return sum(x.Create.APIRequestsPerSecond) }}, {"at rest", func(x Result) float64 { return sum(x.Rest.APIRequestsPerSecond) }}}},
	{"libvirt-calls.svg", "libvirt calls per reconcile, reconciles per machine", "count", []series{
		{"libvirt calls/reconcile", func(x Result) float64 { return x.LibvirtCallsPerReconcile }},
		{"reconciles/machine", func(x Result) float64 { return x.ReconcilesPerMachine }},
		{"ListOwned/machine", func(x Result) float64 { return x.ListOwnedPerMachine }}}},
	{"plane-cpu.svg", "kube-apiserver and etcd CPU", "core-seconds per minute", []series{
		{"kube-apiserver creating", func(x Result) float64 { return x.Create.CPU["kube-apiserver"] }},
		{"kube-apiserver at rest", func(x Result) float64 { return x.Rest.CPU["kube-apiserver"] }},
		{"etcd creating", func(x Result) float64 { return x.Create.CPU["etcd"] }},
		{"etcd at rest", func(x Result) float64 { return x.Rest.CPU["etcd"] }}}},
	{"delete-seconds.svg", "Deleting all N machines", "seconds", []series{{"seconds", func(x Result) float64 { return x.DeleteSeconds }}}},
}

// Write writes figures.json, table.md and one SVG per figure into dir.
func (r Report) Write(dir string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "figures.json"), data, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "table.md"), []byte(r.Table()), 0o644); err != nil {
		return err
	}
	for _, p := range plots {
		if err := os.WriteFile(filepath.Join(dir, p.file), []byte(svgPlot(p.title, p.unit, r.Results, p.lines)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

var colours = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"}

// svgPlot draws lines of the results against N, on linear axes from 0.
func svgPlot(title, unit string, results []Result, lines []series) string {
	const w, h, left, right, top, bottom = 560.0, 340.0, 70.0, 20.0, 40.0, 50.0
	maxN, maxY := 0.0, 0.0
	for _, x := range results {
		maxN = math.Max(maxN, float64(x.N))
		for _, l := range lines {
			maxY = math.Max(maxY, l.value(x))
		}
	}
	maxN, maxY = niceCeil(maxN), niceCeil(maxY)
	px := func(n float64) float64 { return left + n/maxN*(w-left-right) }
	py := func(v float64) float64 { return h - bottom - v/maxY*(h-top-bottom) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%.0f" y="22" font-size="15" text-anchor="middle">%s</text>`+"\n", w/2, esc(title))
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n",
		left, py(0), w-right, py(0), left, py(0), left, top)
	for i := 0; i <= 5; i++ {
		n, v := maxN*float64(i)/5, maxY*float64(i)/5
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, px(n), h-bottom+16, num(n))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`, left-6, py(v)+4, num(v))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, py(v), w-right, py(v))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">machines (N)</text>`, (left+w-right)/2, h-12)
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">%s</text>`+"\n", (top+h-bottom)/2, (top+h-bottom)/2, esc(unit))
	for i, l := range lines {
		c := colours[i%len(colours)]
		var pts []string
		for _, x := range results {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(x.N)), py(l.value(x))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		for _, x := range results {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>N=%d: %s</title></circle>`, px(float64(x.N)), py(l.value(x)), c, x.N, num(l.value(x)))
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="10" fill="%s">%s</text>`, px(float64(x.N))+5, py(l.value(x))-5, c, num(l.value(x)))
		}
		fmt.Fprintf(&b, "\n"+`<rect x="%.1f" y="%.1f" width="12" height="3" fill="%s"/><text x="%.1f" y="%.1f">%s</text>`+"\n", left+12, top+8+float64(i)*16, c, left+28, top+12+float64(i)*16, esc(l.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.3f", v)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// Package docs_test keeps the documentation complete: every API field,
// manager flag, clusterctl variable, ClusterClass variable, condition
// reason and capl-dev command must appear in it, so that adding one without
// documenting it fails; every capl-dev command line it shows must parse;
// every page is in the indexes and every relative link leads to a file.
package docs_test

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/cli"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

func read(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// documented fails t for every name not in doc as `name` (or, for flags,
// `--name`).
func documented(t *testing.T, doc, what string, names []string) {
	t.Helper()
	if len(names) == 0 {
		t.Fatalf("found no %s to check", what)
	}
	t.Logf("%d %ss checked", len(names), what)
	for _, n := range names {
		if !strings.Contains(doc, "`"+n+"`") && !strings.Contains(doc, "`"+n+",") && !strings.Contains(doc, " "+n+"`") {
			t.Errorf("%s %s is not documented", what, n)
		}
	}
}

func TestAPIFieldsDocumented(t *testing.T) {
	doc := read(t, "configuration.md")
	var paths []string
	for _, typ := range []reflect.Type{reflect.TypeOf(infrav1.LibvirtClusterSpec{}), reflect.TypeOf(infrav1.LibvirtMachineSpec{})} {
		paths = append(paths, fieldPaths(typ, "")...)
	}
	// The load balancer's image is an ImageSource, documented once for
	// machines.
	var check []string
	for _, p := range paths {
		if !strings.HasPrefix(p, "loadBalancer.image.") {
			check = append(check, p)
		}
	}
	documented(t, doc, "API field", check)
}

// fieldPaths lists the dotted JSON paths of typ's leaves, "[]" marking
// lists, with inlined structs flattened into their parent.
func fieldPaths(typ reflect.Type, prefix string) []string {
	var out []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if name == "" && strings.Contains(opts, "inline") {
			out = append(out, fieldPaths(ft, prefix)...)
			continue
		}
		path := prefix + name
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			out = append(out, fieldPaths(ft.Elem(), path+"[].")...)
			continue
		}
		if ft.Kind() == reflect.Struct {
			out = append(out, fieldPaths(ft, path+".")...)
			continue
		}
		out = append(out, path)
	}
	return out
}

func TestFlagsDocumented(t *testing.T) {
	fs := pflag.NewFlagSet("manager", pflag.ContinueOnError)
	(&manager.Options{}).AddFlags(fs)
	var flags []string
	fs.VisitAll(func(f *pflag.Flag) { flags = append(flags, "--"+f.Name) })
	documented(t, read(t, "configuration.md"), "flag", flags)
}

var variable = regexp.MustCompile(`\$\{([A-Z0-9_]+)`)

// variables returns the clusterctl variables of the YAML files matching
// glob, less those clusterctl sets from its own flags.
func variables(t *testing.T, glob string) []string {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no files match %s: %v", glob, err)
	}
	seen := map[string]bool{}
	for _, f := range files {
		for _, m := range variable.FindAllStringSubmatch(read(t, f), -1) {
			seen[m[1]] = true
		}
	}
	var out []string
	for v := range seen {
		switch v {
		case "CLUSTER_NAME", "NAMESPACE", "KUBERNETES_VERSION", "CONTROL_PLANE_MACHINE_COUNT", "WORKER_MACHINE_COUNT":
		default:
			out = append(out, v)
		}
	}
	return out
}

func TestVariablesDocumented(t *testing.T) {
	doc := read(t, "configuration.md")
	// cluster-template*.yaml and clusterclass-*.yaml; cni-flannel.yaml is a
	// plain manifest that clusterctl never processes.
	documented(t, doc, "template variable", variables(t, "../templates/cluster*.yaml"))
	documented(t, doc, "clusterctl init variable", variables(t, "../config/*/*.yaml"))

	var class struct {
		Spec struct {
			Variables []struct{ Name string }
		}
	}
	data := read(t, "../templates/clusterclass-libvirt.yaml")
	first, _, _ := strings.Cut(data, "\n---")
	if err := yaml.Unmarshal([]byte(first), &class); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range class.Spec.Variables {
		names = append(names, v.Name)
	}
	documented(t, doc, "ClusterClass variable", names)
}

func TestConditionsDocumented(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "../api/v1alpha1/conditions.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var values []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range vs.Names {
			if !strings.HasSuffix(name.Name, "Reason") && !strings.HasSuffix(name.Name, "Condition") {
				continue
			}
			if lit, ok := vs.Values[i].(*ast.BasicLit); ok {
				v, _ := strconv.Unquote(lit.Value)
				values = append(values, v)
			}
		}
		return true
	})
	documented(t, read(t, "troubleshooting.md"), "condition type or reason", values)
}

// docFiles are the documents whose capl-dev command lines must work.
var docFiles = []string{"../README.md", "*.md", "../e2e/README.md", "../examples/README.md", "../images/README.md", "../images/node/README.md"}

// capldevLines returns every capl-dev command line of the documentation,
// in code (fenced blocks and inline code), as the words after
// "capl-dev", each with where it was found. A line ends at a shell
// operator, a comment or the end of the code span.
func capldevLines(t *testing.T) map[string][]string {
	t.Helper()
	lines := map[string][]string{}
	for _, glob := range docFiles {
		files, err := filepath.Glob(glob)
		if err != nil || len(files) == 0 {
			t.Fatalf("no file matches %s: %v", glob, err)
		}
		for _, f := range files {
			fenced := false
			for i, line := range strings.Split(read(t, f), "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "```") {
					fenced = !fenced
					continue
				}
				// A shell comment in a code block is prose.
				spans := []string{shellComment.ReplaceAllString(line, "")}
				if !fenced {
					spans = inlineCode.FindAllString(line, -1)
				}
				for _, span := range spans {
					for _, m := range capldevCall.FindAllStringSubmatch(strings.Trim(span, "`"), -1) {
						words := strings.Fields(m[1])
						if len(words) == 0 {
							continue
						}
						at := fmt.Sprintf("%s:%d", f, i+1)
						lines[strings.Join(words, " ")] = append(lines[strings.Join(words, " ")], at)
					}
				}
			}
		}
	}
	return lines
}

var (
	inlineCode   = regexp.MustCompile("`[^`]+`")
	shellComment = regexp.MustCompile(`(^|\s)#.*$`)
	// capldevCall is "capl-dev" as a command (bin/, ./ or nothing
	// before it) and its words up to a shell operator or comment.
	capldevCall = regexp.MustCompile(`(?:^|[\s(])(?:bin/|\./)?capl-dev((?: +[^\s|;&)#<>]+)*)`)
)

// commandTests name, for each capl-dev command, the tests that run it as
// a person would (the built binary, or for serve the plane that spawns
// it). A new command needs its test here.
var commandTests = map[string][]string{
	"up":             {"TestDistRunsWithoutCheckout", "TestCLIPlaneWithoutVMs", "TestCLI"},
	"down":           {"TestDistRunsWithoutCheckout", "TestCLIPlaneWithoutVMs", "TestCLI"},
	"stop":           {"TestCLIPlaneWithoutVMs", "TestCLI"},
	"start":          {"TestCLIPlaneWithoutVMs", "TestCLI"},
	"serve":          {"TestPlaneLifecycle", "TestCLIPlaneWithoutVMs"},
	"create cluster": {"TestCLI"},
	"delete cluster": {"TestCLIPlaneWithoutVMs", "TestCLI"},
	"get clusters":   {"TestCLIPlaneWithoutVMs", "TestCLI"},
	"get nodes":      {"TestCLIPlaneWithoutVMs"},
	"get kubeconfig": {"TestCLIPlaneWithoutVMs", "TestCLI"},
	"status":         {"TestCLIPlaneWithoutVMs", "TestCLI"},
	"logs":           {"TestCLIPlaneWithoutVMs", "TestCLI"},
	"render":         {"TestRender"},
	"exec":           {"TestCLI"},
	"load image":     {"TestCLI"},
	"doctor":         {"TestDeadLibvirtdSaidWithinSeconds", "TestCLIPlaneWithoutVMs"},
	"orphans":        {"TestCLIPlaneWithoutVMs"},
	"completion":     {"TestCompletion"},
	"version":        {"TestVersion"},
}

// TestCapldevCommandsDocumented: every capl-dev command line in the
// documentation names a command that exists with flags it takes; every
// command is documented; and every command is run by a test that exists.
func TestCapldevCommandsDocumented(t *testing.T) {
	lines := capldevLines(t)
	if len(lines) < 20 {
		t.Fatalf("found %d capl-dev command lines in the documentation", len(lines))
	}
	t.Logf("%d capl-dev command lines checked", len(lines))
	seen := map[string]bool{}
	for line, where := range lines {
		words := strings.Fields(line)
		root := newRoot()
		c, rest, err := root.Find(words)
		if err != nil || (c == root && len(rest) > 0 && !strings.HasPrefix(rest[0], "-")) {
			t.Errorf("capl-dev %s (%s): no such command (%v)", line, strings.Join(where, ", "), err)
			continue
		}
		if err := c.ParseFlags(rest); err != nil && !errors.Is(err, pflag.ErrHelp) {
			t.Errorf("capl-dev %s (%s): %v", line, strings.Join(where, ", "), err)
			continue
		}
		seen[commandPath(c)] = true
	}
	for _, path := range leafCommands(newRoot()) {
		if !seen[path] {
			t.Errorf("capl-dev %s is not documented: give it a line in docs/quick-start.md", path)
		}
		tests := commandTests[path]
		if len(tests) == 0 {
			t.Errorf("capl-dev %s is run by no test: write one that runs the binary and name it in commandTests", path)
		}
		for _, name := range tests {
			if !testExists(t, name) {
				t.Errorf("capl-dev %s: commandTests names %s, which no _test.go file defines", path, name)
			}
		}
	}
}

// commandPath is a command's words after "capl-dev"; completion's
// shells count as completion.
func commandPath(c *cobra.Command) string {
	path := strings.TrimPrefix(c.CommandPath(), "capl-dev")
	path = strings.TrimSpace(path)
	if strings.HasPrefix(path, "completion") {
		return "completion"
	}
	return path
}

// newRoot is capl-dev's command tree with the completion command cobra
// otherwise adds only when it runs.
func newRoot() *cobra.Command {
	root := cli.NewCommand(io.Discard, io.Discard)
	root.InitDefaultCompletionCmd()
	return root
}

// leafCommands are the commands a person runs: runnable, not help.
func leafCommands(c *cobra.Command) []string {
	var out []string
	for _, sub := range c.Commands() {
		switch {
		case sub.Hidden || sub.Name() == "help":
		case sub.Name() == "completion":
			out = append(out, "completion")
		case sub.HasSubCommands():
			out = append(out, leafCommands(sub)...)
		default:
			out = append(out, commandPath(sub))
		}
	}
	return out
}

var testFuncs map[string]bool

// testExists tells whether a _test.go file of the repository defines
// func name.
func testExists(t *testing.T, name string) bool {
	t.Helper()
	if testFuncs == nil {
		testFuncs = map[string]bool{}
		def := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
		err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin" || d.Name() == "dist") {
				return filepath.SkipDir
			}
			if strings.HasSuffix(path, "_test.go") {
				for _, m := range def.FindAllStringSubmatch(read(t, path), -1) {
					testFuncs[m[1]] = true
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return testFuncs[name]
}

// TestDocsIndexed: every page of docs/ is in docs/README.md's index and in
// README.md's Documentation list.
func TestDocsIndexed(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil || len(pages) < 2 {
		t.Fatalf("docs/*.md: %v %v", pages, err)
	}
	index := read(t, "README.md")
	readme := read(t, "../README.md")
	_, list, ok := strings.Cut(readme, "\n## Documentation\n")
	if !ok {
		t.Fatal("README.md has no ## Documentation section")
	}
	list, _, _ = strings.Cut(list, "\n## ")
	for _, page := range pages {
		if page == "README.md" {
			continue
		}
		if !strings.Contains(index, "]("+page+")") {
			t.Errorf("docs/README.md does not index %s", page)
		}
		if !strings.Contains(list, "](docs/"+page+")") {
			t.Errorf("README.md's Documentation list lacks docs/%s", page)
		}
	}
	t.Logf("%d pages checked", len(pages)-1)
}

// markdownLink is a Markdown link's or image's target: [text](target).
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestRelativeLinksResolve: every relative link of README.md and docs/
// (and the other READMEs docFiles names) points at a file or directory
// that exists. Links inside code blocks and inline code are not links.
func TestRelativeLinksResolve(t *testing.T) {
	checked := 0
	for _, glob := range docFiles {
		files, err := filepath.Glob(glob)
		if err != nil || len(files) == 0 {
			t.Fatalf("no file matches %s: %v", glob, err)
		}
		for _, f := range files {
			fenced := false
			for i, line := range strings.Split(read(t, f), "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "```") {
					fenced = !fenced
					continue
				}
				if fenced {
					continue
				}
				for _, m := range markdownLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(line, ""), -1) {
					target := m[1]
					if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
						continue
					}
					path, _, _ := strings.Cut(target, "#")
					checked++
					if _, err := os.Stat(filepath.Join(filepath.Dir(f), path)); err != nil {
						t.Errorf("%s:%d: the link %s leads nowhere: %v", f, i+1, target, err)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("found %d relative links", checked)
	}
	t.Logf("%d relative links checked", checked)
}

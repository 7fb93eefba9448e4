// Package docs_test keeps the documentation complete: every API field,
// manager flag, clusterctl variable, ClusterClass variable and condition
// reason must appear in it, so that adding one without documenting it fails.
package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
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

//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// cliIDs are what must survive stop and start: each domain's UUID, each
// node's Machine and providerID.
type cliIDs struct {
	domains map[string]string
	nodes   map[string]string
}

func cliIdentities(ctx context.Context, t *testing.T, c client.Client) cliIDs {
	t.Helper()
	ids := cliIDs{domains: map[string]string{}, nodes: map[string]string{}}
	var lms infrav1.LibvirtMachineList
	must(t, c.List(ctx, &lms, client.InNamespace(cliNamespace)))
	for _, lm := range lms.Items {
		if d := lm.Status.Domain; d != nil {
			ids.domains[d.Name] = d.UUID
		}
	}
	var lcs infrav1.LibvirtClusterList
	must(t, c.List(ctx, &lcs, client.InNamespace(cliNamespace)))
	for _, lc := range lcs.Items {
		if lb := lc.Status.LoadBalancer; lb != nil && lb.Domain != nil {
			ids.domains[lb.Domain.Name] = lb.Domain.UUID
		}
	}
	var machines clusterv1.MachineList
	must(t, c.List(ctx, &machines, client.InNamespace(cliNamespace)))
	for _, m := range machines.Items {
		if m.Status.NodeRef.IsDefined() {
			ids.nodes[m.Status.NodeRef.Name] = m.Name + " " + m.Spec.ProviderID
		}
	}
	return ids
}

// cliLibvirtObjects lists what libvirt holds of the CLI scenario's
// namespace and pool.
func cliLibvirtObjects(t *testing.T, uri string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	host, err := virt.Dial(ctx, uri)
	if err != nil {
		t.Errorf("dialling %s: %v", uri, err)
		return nil
	}
	defer host.Close()
	owned, err := host.ListOwned(ctx)
	if err != nil {
		t.Errorf("listing %s: %v", uri, err)
		return nil
	}
	var left []string
	for _, o := range owned {
		if (o.Owner != nil && o.Owner.Namespace == cliNamespace) || strings.HasPrefix(o.Name, virt.NamePrefix+cliNamespace+".") ||
			(o.Pool == cliPool && !strings.HasPrefix(o.Name, virt.NamePrefix+"image-")) {
			left = append(left, string(o.Kind)+" "+o.Name)
		}
	}
	return left
}

type tarEntry struct {
	name string
	mode int64
	data []byte
}

func tarOf(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		must(t, tw.WriteHeader(&tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(e.data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}))
		_, err := tw.Write(e.data)
		must(t, err)
	}
	must(t, tw.Close())
	return buf.Bytes()
}

// cliBundle reads the one logs bundle in dir: names below its top
// directory to contents.
func cliBundle(t *testing.T, dir string) map[string]string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "capl-dev-logs-*.tar.gz"))
	must(t, err)
	if len(matches) != 1 {
		t.Fatalf("%d bundles in %s", len(matches), dir)
	}
	f, err := os.Open(matches[0])
	must(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	must(t, err)
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		must(t, err)
		data, err := io.ReadAll(tr)
		must(t, err)
		_, name, _ := strings.Cut(hdr.Name, "/")
		files[name] = string(data)
	}
}

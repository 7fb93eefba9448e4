//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// The leak checks and the sweep look at the host through
// testlibvirt.Scan, on connections of their own: by name, by owner
// metadata and by the contents of pool directories, not through
// virt.Client.ListOwned, which is what the provider itself uses and sees a
// domain or network only when it carries our metadata. They never depend
// on the suite's client being open.

// runPrefix starts the name of every libvirt object the provider makes
// for the namespace (domains, networks, overlays, seed ISOs).
var runPrefix = naming.DomainName(namespace, "")

// e2ePool is the demo's storage pool: the run's own, so that the base
// images imported into it are the run's too and Down may remove them.
const e2ePool = "capl-e2e-pool"

// poolRoot is where devplane.Demo puts the run's pool directory.
const poolRoot = "/var/lib/libvirt"

// leakScope says which of the run's objects a check counts.
type leakScope int

const (
	// whileClusters: the run's pool, its directory and the complete base
	// images in it are expected, since base images outlive clusters until
	// plane.Down; everything else of the run counts, import markers
	// included.
	whileClusters leakScope = iota
	// afterDown: everything of the run counts, the pool and its directory
	// too, and every base image or import marker that appeared anywhere
	// on the host during the run (outside integration tests' pools).
	afterDown
)

// hostObjects lists the whole host independently of the provider.
func (s *suite) hostObjects() ([]testlibvirt.Object, error) {
	return testlibvirt.Scan(s.uri, poolRoot)
}

// imagesBefore records the base images and import markers on the host
// when the run starts, so that afterDown counts only the run's.
func imagesBefore(objs []testlibvirt.Object) map[string]bool {
	out := map[string]bool{}
	for _, o := range objs {
		if testlibvirt.IsBaseImage(o) {
			out[o.String()] = true
		}
	}
	return out
}

// runObjects picks the run's objects out of a listing of the host. before
// is imagesBefore of the host when the run started.
func runObjects(objs []testlibvirt.Object, sc leakScope, before map[string]bool) []testlibvirt.Object {
	var out []testlibvirt.Object
	for _, o := range objs {
		inPool := o.Pool == e2ePool || (o.Pool == poolRoot && o.Name == e2ePool)
		switch {
		case sc == whileClusters && (o.Kind == testlibvirt.KindPool && o.Name == e2ePool ||
			o.Pool == poolRoot && o.Name == e2ePool ||
			o.Pool == e2ePool && testlibvirt.IsBaseImage(o) && !strings.HasSuffix(o.Name, testlibvirt.PartialSuffix)):
			// Expected until Down.
		case strings.HasPrefix(o.Name, runPrefix), o.Owner != nil && o.Owner.Namespace == namespace, inPool,
			o.Kind == testlibvirt.KindPool && o.Name == e2ePool:
			out = append(out, o)
		case sc == afterDown && testlibvirt.IsBaseImage(o) && !before[o.String()] && !strings.HasPrefix(o.Pool, virt.TestNamePrefix):
			out = append(out, o)
		}
	}
	return out
}

// ourLibvirtObjects lists the run's domains, networks, pools, volumes and
// pool files within sc.
func (s *suite) ourLibvirtObjects(sc leakScope) []string {
	objs, err := s.hostObjects()
	if err != nil {
		return []string{"listing the libvirt host failed: " + err.Error()}
	}
	return names(runObjects(objs, sc, s.imagesBefore))
}

func names(objs []testlibvirt.Object) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.String())
	}
	return out
}

// machineObjects picks the domain and volumes of the LibvirtMachine name
// out of a listing of the host: by the names derived from it, and by the
// owner metadata of a domain named otherwise.
func machineObjects(objs []testlibvirt.Object, name string) (domains, volumes []testlibvirt.Object) {
	domain := naming.DomainName(namespace, name)
	for _, o := range objs {
		switch {
		case o.Kind == testlibvirt.KindDomain && (o.Name == domain ||
			o.Owner != nil && o.Owner.Namespace == namespace && o.Owner.Name == name && o.Owner.Kind == "LibvirtMachine"):
			domains = append(domains, o)
		case o.Kind != testlibvirt.KindDomain && (o.Name == domain || strings.HasPrefix(o.Name, domain+"-")):
			volumes = append(volumes, o)
		}
	}
	return domains, volumes
}

// macSeed is what a LibvirtMachine's candidate MACs derive from: the
// domain UUID of its providerID.
func macSeed(lm *infrav1.LibvirtMachine) string {
	return strings.TrimPrefix(lm.Spec.ProviderID, infrav1.ProviderIDPrefix)
}

// machineLeftovers lists the libvirt objects the LibvirtMachine name may
// still have: its domain, its volumes and files, and the DHCP host entries
// of any of the MACs derived from seed (macSeed) in the cluster network's
// definition.
func (s *suite) machineLeftovers(name, seed, network string) []string {
	objs, err := s.hostObjects()
	if err != nil {
		return []string{"listing: " + err.Error()}
	}
	domains, volumes := machineObjects(objs, name)
	left := append(names(domains), names(volumes)...)
	if network != "" && seed != "" {
		hosts, err := dhcpHosts(s.uri, network)
		if err != nil {
			left = append(left, "reservations: "+err.Error())
		}
		for _, h := range hosts {
			for _, mac := range naming.MACCandidates(seed, 4) {
				if strings.EqualFold(h.MAC, mac.String()) {
					left = append(left, fmt.Sprintf("reservation %s %s on %s", h.MAC, h.IP, network))
				}
			}
		}
	}
	return left
}

// dhcpHosts reads the DHCP host entries from the network's live definition
// on a connection of its own; a missing network has none.
func dhcpHosts(uri, network string) ([]libvirtxml.NetworkDHCPHost, error) {
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	n, err := conn.LookupNetworkByName(network)
	if virt.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer n.Free()
	doc, err := n.GetXMLDesc(0)
	if err != nil {
		return nil, err
	}
	var nx libvirtxml.Network
	if err := nx.Unmarshal(doc); err != nil {
		return nil, err
	}
	var out []libvirtxml.NetworkDHCPHost
	for _, ip := range nx.IPs {
		if ip.DHCP != nil {
			out = append(out, ip.DHCP.Hosts...)
		}
	}
	return out, nil
}

// networkExists tells whether libvirt holds the network, with or without
// our metadata.
func (s *suite) networkExists(t *testing.T, name string) bool {
	t.Helper()
	objs, err := s.hostObjects()
	must(t, err)
	for _, o := range objs {
		if o.Kind == testlibvirt.KindNetwork && o.Name == name {
			return true
		}
	}
	return false
}

// sweepOurs deletes the run's libvirt objects (domains first, then the
// volumes of the run's pool, networks, and the files left) on a
// connection of its own and returns what it removed. It never touches
// objects of other namespaces, nor base images outside the run's pool (the
// host is shared: the final check reports those instead). The pool itself
// and its directory are plane.Down's to remove, unless withPool: a
// killed run's plane may never have recorded them.
func (s *suite) sweepOurs(ctx context.Context, withPool bool) ([]string, error) {
	objs, err := s.hostObjects()
	if err != nil {
		return nil, fmt.Errorf("listing the libvirt host: %w", err)
	}
	conn, err := libvirt.NewConnect(s.uri)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var removed []string
	var errs []error
	var run []testlibvirt.Object
	for _, o := range runObjects(objs, afterDown, s.imagesBefore) {
		isPool := o.Kind == testlibvirt.KindPool || o.Pool == poolRoot
		if (withPool || !isPool) && (o.Pool == e2ePool || !testlibvirt.IsBaseImage(o)) {
			run = append(run, o)
		}
	}
	// Domains hold volumes and networks, the pool its volumes; the pool's
	// directory is an entry of poolRoot, removed after the pool.
	for _, kind := range []string{testlibvirt.KindDomain, testlibvirt.KindVolume, testlibvirt.KindNetwork, testlibvirt.KindPool, testlibvirt.KindFile} {
		for _, o := range run {
			if o.Kind != kind || ctx.Err() != nil {
				continue
			}
			if err := removeRaw(conn, o); err != nil {
				errs = append(errs, fmt.Errorf("sweep: deleting %s: %w", o, err))
				continue
			}
			removed = append(removed, o.String())
		}
	}
	return removed, errors.Join(append(errs, ctx.Err())...)
}

// removeRaw deletes one object found by Scan through the raw connection;
// a missing object is success.
func removeRaw(conn *libvirt.Connect, o testlibvirt.Object) error {
	if err := testlibvirt.Remove(conn, o); err != nil && !virt.IsNotFound(err) && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

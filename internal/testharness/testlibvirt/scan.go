package testlibvirt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Kinds of Object.
const (
	KindDomain  = "domain"
	KindNetwork = "network"
	KindPool    = "pool"
	KindVolume  = "volume"
	// KindFile is a file or directory in a pool's directory (or in one of
	// Scan's extra directories) that libvirt does not list as a volume:
	// written behind libvirt's back, or left by a pool that is gone.
	KindFile = "file"
)

// Object is one thing Scan found on the host.
type Object struct {
	Kind string
	// Pool is the pool of a volume or file; for a file in one of Scan's
	// extra directories it is that directory.
	Pool string
	Name string
	// Dir is the directory a file is in.
	Dir string
	// Owner is the owner element of a domain's or network's metadata, nil
	// without one.
	Owner *virt.Owner
}

// String names the object in a leak report: kind, pool and name.
func (o Object) String() string {
	if o.Pool != "" {
		return fmt.Sprintf("%s %s/%s", o.Kind, o.Pool, o.Name)
	}
	return fmt.Sprintf("%s %s", o.Kind, o.Name)
}

// Scan lists everything on the libvirt host at uri on a connection of its
// own, without pkg/virt's listing (whose ListOwned sees a domain or network
// only when it carries our metadata, so it cannot judge itself): every
// domain and network, with its owner metadata when it has one; every
// storage pool; every volume of an active pool; and every entry of a
// directory pool's target directory and of the dirs given, so that files
// written behind libvirt's back (or not yet seen by a pool refresh) and
// the directories of removed pools show up too. Directories that do not
// exist on this machine (a remote host) are skipped; one that cannot be
// read is reported as an entry naming the error, so a check never passes
// for want of looking.
func Scan(uri string, dirs ...string) ([]Object, error) {
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", uri, err)
	}
	defer conn.Close()
	var out []Object
	for _, list := range []func(*libvirt.Connect) ([]Object, error){scanDomains, scanNetworks, scanPools} {
		objs, err := list(conn)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	for _, d := range dirs {
		out = append(out, dirEntries(d, d, nil)...)
	}
	return out, nil
}

func scanDomains(conn *libvirt.Connect) ([]Object, error) {
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("listing domains: %w", err)
	}
	return describeAll(doms, KindDomain, (*libvirt.Domain).GetName,
		func(d *libvirt.Domain) (string, error) { return d.GetXMLDesc(0) }, (*libvirt.Domain).Free)
}

func scanNetworks(conn *libvirt.Connect) ([]Object, error) {
	nets, err := conn.ListAllNetworks(0)
	if err != nil {
		return nil, fmt.Errorf("listing networks: %w", err)
	}
	return describeAll(nets, KindNetwork, (*libvirt.Network).GetName,
		func(n *libvirt.Network) (string, error) { return n.GetXMLDesc(0) }, (*libvirt.Network).Free)
}

// describeAll turns listed domains or networks into Objects with their
// owner metadata, freeing each; one that vanished while listing is
// skipped.
func describeAll[T any](objs []T, kind string, name, xml func(*T) (string, error), free func(*T) error) ([]Object, error) {
	var out []Object
	var errs []error
	for i := range objs {
		n, err := name(&objs[i])
		doc := ""
		if err == nil {
			doc, err = xml(&objs[i])
		}
		_ = free(&objs[i])
		switch {
		case virt.IsNotFound(err):
		case err != nil:
			errs = append(errs, err)
		default:
			out = append(out, Object{Kind: kind, Name: n, Owner: owner(doc)})
		}
	}
	return out, errors.Join(errs...)
}

// owner parses our owner element out of a whole domain or network XML;
// nil when there is none or it does not parse.
func owner(doc string) *virt.Owner {
	o, err := virt.ParseOwner(doc)
	if err != nil {
		return nil
	}
	return o
}

func scanPools(conn *libvirt.Connect) ([]Object, error) {
	pools, err := conn.ListAllStoragePools(0)
	if err != nil {
		return nil, fmt.Errorf("listing pools: %w", err)
	}
	var out []Object
	var errs []error
	for i := range pools {
		objs, err := scanPool(&pools[i])
		_ = pools[i].Free()
		if virt.IsNotFound(err) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
		}
		out = append(out, objs...)
	}
	return out, errors.Join(errs...)
}

// scanPool lists the pool, its volumes (when active) and the entries of
// its directory that are not volumes.
func scanPool(p *libvirt.StoragePool) ([]Object, error) {
	doc, err := p.GetXMLDesc(0)
	if err != nil {
		return nil, err
	}
	var px libvirtxml.StoragePool
	if err := px.Unmarshal(doc); err != nil {
		return nil, fmt.Errorf("parsing pool XML: %w", err)
	}
	out := []Object{{Kind: KindPool, Name: px.Name}}
	var volumes []string
	if active, err := p.IsActive(); err == nil && active {
		names, err := p.ListStorageVolumes()
		if err != nil {
			return out, fmt.Errorf("listing volumes of %s: %w", px.Name, err)
		}
		for _, n := range names {
			out = append(out, Object{Kind: KindVolume, Pool: px.Name, Name: n})
		}
		volumes = names
	}
	if px.Type == "dir" && px.Target != nil && px.Target.Path != "" {
		out = append(out, dirEntries(px.Target.Path, px.Name, volumes)...)
	}
	return out, nil
}

// dirEntries lists the entries of dir as files of pool, leaving out the
// names in known.
func dirEntries(dir, pool string, known []string) []Object {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return []Object{{Kind: KindFile, Pool: pool, Name: "(unreadable: " + err.Error() + ")"}}
	}
	var out []Object
	for _, e := range entries {
		if !slices.Contains(known, e.Name()) {
			out = append(out, Object{Kind: KindFile, Pool: pool, Name: e.Name(), Dir: dir})
		}
	}
	return out
}

// IsBaseImage tells whether o is a base image imported from a URL
// (content-addressed "capl-image-sha256-…") or an import marker
// ("….partial"), as a volume or a file.
func IsBaseImage(o Object) bool {
	return (o.Kind == KindVolume || o.Kind == KindFile) &&
		(strings.HasPrefix(o.Name, ImageVolumePrefix) || strings.HasSuffix(o.Name, PartialSuffix))
}

// ImageVolumePrefix starts the names of base images imported from a URL
// (pkg/naming.ImageVolumeName); PartialSuffix ends the marker that exists
// while an import is under way (pkg/virt). Restated here rather than
// imported: a leak check must not take its definition of a leak from the
// code it judges.
const (
	ImageVolumePrefix = virt.NamePrefix + "image-sha256-"
	PartialSuffix     = ".partial"
)

// Package naming derives every name the provider gives libvirt objects
// (domains, volumes, networks, MACs) from the Kubernetes objects' namespace
// and name alone, so that deletion finds them even when the Machine,
// Cluster or LibvirtCluster are gone, and a moved or restored object
// (another UID) finds them again. It is the one place names are made.
package naming

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const (
	// maxPlainDomainName bounds names built without a hash. A longer one is
	// cut to hashedDomainNameLen characters ending in a hash, so the two kinds
	// never coincide (their lengths differ). Both leave room within a
	// 255-byte file name for the suffixes libvirt and we append
	// ("-console.log", ".log", volumeSuffix…).
	maxPlainDomainName  = 199
	hashedDomainNameLen = 200
	// overlaySuffix, seedSuffix and consoleLogSuffix end the machine's
	// volume names.
	overlaySuffix    = "-root.qcow2"
	seedSuffix       = "-seed.iso"
	consoleLogSuffix = "-console.log"
	// dataDiskInfix and dataDiskSuffix surround a data disk's name in its
	// volume's name. Kubernetes names have no '_', so no machine's domain
	// (and none of its other volumes) can end in a data disk's volume name.
	dataDiskInfix  = "_data-"
	dataDiskSuffix = ".qcow2"
	// imagePrefix starts the names of base images imported from a URL. It
	// has no '.', which every domain-derived name has, so a base image can
	// never share a name with a machine's volume.
	imagePrefix = virt.NamePrefix + "image-sha256-"
)

// DomainName is the libvirt domain of the LibvirtMachine namespace/name:
// "capl-<namespace>.<name>". Kubernetes namespaces cannot contain '.', so
// the first '.' separates the two and names of different namespaces never
// collide. Names too long for file names on the libvirt host are cut and
// end in a hash of namespace/name. Kubernetes names use only [a-z0-9.-],
// which libvirt and file systems accept.
func DomainName(namespace, name string) string {
	n := virt.NamePrefix + namespace + "." + name
	if len(n) <= maxPlainDomainName {
		return n
	}
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	tag := "-" + hex.EncodeToString(sum[:8])
	return n[:hashedDomainNameLen-len(tag)] + tag
}

// OverlayVolumeName is the machine's root disk volume.
func OverlayVolumeName(domain string) string { return domain + overlaySuffix }

// SeedVolumeName is the machine's NoCloud seed ISO volume.
func SeedVolumeName(domain string) string { return domain + seedSuffix }

// ConsoleLogVolumeName is the volume the machine's serial console is
// logged to: in the pool, so that it goes with the machine on any host.
func ConsoleLogVolumeName(domain string) string { return domain + consoleLogSuffix }

// DataDiskVolumeName is the volume of the machine's data disk named disk.
func DataDiskVolumeName(domain, disk string) string {
	return domain + dataDiskInfix + disk + dataDiskSuffix
}

// IsDataDiskVolumeOf tells whether name is the volume of one of the data
// disks of domain.
func IsDataDiskVolumeOf(domain, name string) bool {
	disk, ok := strings.CutPrefix(name, domain+dataDiskInfix)
	return ok && strings.HasSuffix(disk, dataDiskSuffix) && !strings.Contains(disk, dataDiskInfix)
}

// IsDataDiskVolumeName tells whether name is a data disk's volume, of any
// machine.
func IsDataDiskVolumeName(name string) bool {
	return strings.HasPrefix(name, virt.NamePrefix) && strings.Contains(name, dataDiskInfix) && strings.HasSuffix(name, dataDiskSuffix)
}

// ImageVolumeName is the pool volume a base image with this sha256 (hex) is
// imported into: content-addressed, so machines and clusters share it and a
// changed image never reuses a stale volume.
func ImageVolumeName(sha256Hex string) string {
	if len(sha256Hex) > imageHexLen {
		sha256Hex = sha256Hex[:imageHexLen]
	}
	return imagePrefix + sha256Hex
}

// imageHexLen is how many hex digits of the checksum an imported image's
// volume name keeps (ImageVolumeName).
const imageHexLen = 32

// partialSuffix ends the marker volume of an import under way (pkg/virt).
const partialSuffix = ".partial"

// IsImageVolumeName tells whether name is one ImageVolumeName gives: a
// base image the provider imported, named after its content.
func IsImageVolumeName(name string) bool {
	sum, ok := strings.CutPrefix(name, imagePrefix)
	if !ok || len(sum) != imageHexLen {
		return false
	}
	_, err := hex.DecodeString(sum)
	return err == nil && strings.ToLower(sum) == sum
}

// IsManagedVolumeName tells whether name is a volume the provider makes for
// one machine or load balancer (its root disk, data disks, seed ISO or
// console log, of any namespace) or the marker of an import under way:
// volumes that belong to one object and must never back another's disk.
func IsManagedVolumeName(name string) bool {
	if strings.HasSuffix(name, partialSuffix) {
		return true
	}
	return strings.HasPrefix(name, virt.NamePrefix) &&
		(strings.HasSuffix(name, overlaySuffix) || strings.HasSuffix(name, seedSuffix) || strings.Contains(name, consoleLogSuffix) ||
			IsDataDiskVolumeName(name))
}

// NameNamespace is the namespace a name derived by DomainName (a domain,
// or a cluster's network: ClusterNetworkName) belongs to; ok is false for
// names DomainName cannot give, which have no '.' after the prefix.
func NameNamespace(name string) (namespace string, ok bool) {
	rest, ok := strings.CutPrefix(name, virt.NamePrefix)
	if !ok {
		return "", false
	}
	namespace, _, ok = strings.Cut(rest, ".")
	if !ok || namespace == "" {
		return "", false
	}
	return namespace, true
}

// MACCandidates are the MACs a VM whose domain UUID is domainUUID may
// use, in order of preference: the first is netalloc.MACFromSeed of it;
// the others are only tried when another host entry on the network
// already uses an earlier one. The one chosen is recorded (status and an
// annotation), never derived again.
func MACCandidates(domainUUID string, n int) []netalloc.MAC {
	out := make([]netalloc.MAC, 0, n)
	for i := range n {
		seed := domainUUID
		if i > 0 {
			seed = domainUUID + "/" + strconv.Itoa(i)
		}
		out = append(out, netalloc.CanonicalMAC(netalloc.MACFromSeed(seed).String()))
	}
	return out
}

// loadBalancerSuffix ends the HAProxy VM's domain name. Kubernetes names
// never contain '_', so no machine's domain (DomainName) can be named so.
const loadBalancerSuffix = "_lb"

// ClusterNetworkName is the NAT network the provider creates for the
// LibvirtCluster namespace/name. It follows DomainName's scheme, so it is
// unique across namespaces; networks and domains are separate libvirt
// namespaces, so it never collides with a machine's domain.
func ClusterNetworkName(namespace, name string) string { return DomainName(namespace, name) }

// LoadBalancerDomainName is the HAProxy VM of the LibvirtCluster
// namespace/name.
func LoadBalancerDomainName(namespace, name string) string {
	return DomainName(namespace, name) + loadBalancerSuffix
}

// LoadBalancerHostname is the HAProxy VM's hostname: one DNS label built
// from the cluster's name.
func LoadBalancerHostname(cluster string) string {
	h := strings.ReplaceAll(cluster, ".", "-")
	if len(h) > 60 {
		h = h[:60]
	}
	return strings.TrimRight(h, "-") + "-lb"
}

// maxObjectName is the longest name of a Kubernetes object.
const maxObjectName = 253

// IPAddressClaimName is the IPAddressClaim of the LibvirtMachine machine
// for the i-th pool of its network.addressesFromPools: "<machine>-ip-<i>".
// Derived from the name alone, so a moved machine finds its claims.
func IPAddressClaimName(machine string, i int) string {
	return objectName(machine, "-ip-"+strconv.Itoa(i))
}

// LoadBalancerIPAddressClaimName is the IPAddressClaim of the HAProxy VM
// of the LibvirtCluster cluster: "<cluster>-lb-ip". A machine's claim
// ends in a digit, so none is ever named so.
func LoadBalancerIPAddressClaimName(cluster string) string {
	return objectName(cluster, "-lb-ip")
}

// objectName is base+suffix, with a hash in place of base's end when that
// would be longer than a Kubernetes object's name may be.
func objectName(base, suffix string) string {
	if len(base)+len(suffix) <= maxObjectName {
		return base + suffix
	}
	sum := sha256.Sum256([]byte(base))
	hash := hex.EncodeToString(sum[:])[:16]
	return strings.TrimRight(base[:maxObjectName-len(suffix)-len(hash)-1], ".-") + "-" + hash + suffix
}

package hosts

import (
	"fmt"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// Ref names a libvirt host the way a failure domain does.
type Ref struct {
	// URI is the host's libvirt URI; empty means the manager's own host.
	URI string
	// Namespace and Secret locate the connection's credentials; Secret is
	// empty when the manager connects with its own.
	Namespace, Secret string
}

// IsDefault tells whether ref is the manager's own host.
func (r Ref) IsDefault(managerURI string) bool {
	return r.URI == "" || r.URI == managerURI && r.Secret == ""
}

// String is the URI, with the Secret when there is one, for conditions
// and logs (never the credentials themselves).
func (r Ref) String() string {
	if r.Secret == "" {
		return r.URI
	}
	return fmt.Sprintf("%s (credentials %s/%s)", r.URI, r.Namespace, r.Secret)
}

// FailureDomainRef is the host of failure domain name of lc; false when
// lc lists no such failure domain. A cluster listing no failure domain
// has the manager's host as its one, whatever its name.
func FailureDomainRef(lc *infrav1.LibvirtCluster, name string) (Ref, bool) {
	if lc == nil || len(lc.Spec.FailureDomains) == 0 {
		return Ref{}, true
	}
	for _, fd := range lc.Spec.FailureDomains {
		if fd.Name == name {
			return refOf(lc.Namespace, fd), true
		}
	}
	return Ref{}, false
}

// ClusterRefs are the hosts lc's failure domains name.
func ClusterRefs(lc *infrav1.LibvirtCluster) []Ref {
	refs := make([]Ref, 0, len(lc.Spec.FailureDomains))
	for _, fd := range lc.Spec.FailureDomains {
		refs = append(refs, refOf(lc.Namespace, fd))
	}
	return refs
}

func refOf(namespace string, fd infrav1.FailureDomainSpec) Ref {
	r := Ref{URI: fd.URI}
	if fd.CredentialsRef != nil {
		r.Namespace, r.Secret = namespace, fd.CredentialsRef.Name
	}
	return r
}

// CountHosts counts the distinct hosts lc's failure domains name, the
// manager's own counting once however it is named.
func CountHosts(lc *infrav1.LibvirtCluster, managerURI string) int {
	seen := map[string]bool{}
	for _, r := range ClusterRefs(lc) {
		uri := r.URI
		if r.IsDefault(managerURI) {
			uri = managerURI
		}
		seen[uri] = true
	}
	return max(len(seen), 1)
}

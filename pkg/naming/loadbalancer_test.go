package naming

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestLoadBalancerNames(t *testing.T) {
	long := strings.Repeat("c", 253)
	tests := []struct {
		namespace, cluster string
		// machine is a LibvirtMachine name in the same namespace that must
		// not share the VM's domain name.
		machine string
	}{
		{"default", "c1", "c1-lb"},
		{"default", "c1", "c1.lb"},
		{"ns", long, long},
	}
	for _, tt := range tests {
		lb := LoadBalancerDomainName(tt.namespace, tt.cluster)
		if lb == DomainName(tt.namespace, tt.machine) || lb == DomainName(tt.namespace, tt.cluster) {
			t.Errorf("HAProxy VM %q shares a machine's domain name", lb)
		}
		if !strings.HasPrefix(lb, "capl-") || len(lb)+len(overlaySuffix) > 255 {
			t.Errorf("LoadBalancerDomainName = %q", lb)
		}
		if net := ClusterNetworkName(tt.namespace, tt.cluster); net != DomainName(tt.namespace, tt.cluster) {
			t.Errorf("ClusterNetworkName = %q", net)
		}
	}
}

func TestLoadBalancerHostname(t *testing.T) {
	for _, cluster := range []string{"c1", "my.cluster.example", strings.Repeat("a", 63), strings.Repeat("a", 59) + "-.b"} {
		h := LoadBalancerHostname(cluster)
		if errs := validation.IsDNS1123Label(h); len(errs) > 0 {
			t.Errorf("LoadBalancerHostname(%q) = %q: %v", cluster, h, errs)
		}
		if !strings.HasSuffix(h, "-lb") {
			t.Errorf("LoadBalancerHostname(%q) = %q", cluster, h)
		}
	}
}

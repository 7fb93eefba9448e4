package tenancy

import (
	"strings"
	"testing"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

func TestParseIPAMPools(t *testing.T) {
	if _, err := ParseIPAMPools(DefaultIPAMPools); err != nil {
		t.Fatalf("the default does not parse: %v", err)
	}
	for _, bad := range []string{"InClusterIPPool/lan", "ns=InClusterIPPool", "NS_1=InClusterIPPool/lan", "=InClusterIPPool/lan", "ns=/lan"} {
		if _, err := ParseIPAMPools([]string{bad}); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if g, err := ParseIPAMPools([]string{None}); err != nil || g == nil || len(g) != 0 {
		t.Errorf("none: %v %v, want an empty list", g, err)
	}
}

func TestCheckIPPool(t *testing.T) {
	inCluster := func(kind, name string) infrav1.IPPoolReference {
		return infrav1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: kind, Name: name}
	}
	for _, tc := range []struct {
		name   string
		grants []string // nil: the default
		ns     string
		pool   infrav1.IPPoolReference
		ok     bool
	}{
		{"default: own namespaced pool", nil, "a", inCluster("InClusterIPPool", "lan"), true},
		{"default: a cluster-wide pool", nil, "a", inCluster("GlobalInClusterIPPool", "lan"), false},
		{"global granted to the namespace", []string{"a=GlobalInClusterIPPool/lan"}, "a", inCluster("GlobalInClusterIPPool", "lan"), true},
		{"global granted to another namespace", []string{"a=GlobalInClusterIPPool/lan"}, "b", inCluster("GlobalInClusterIPPool", "lan"), false},
		{"another pool of the kind", []string{"a=GlobalInClusterIPPool/lan"}, "a", inCluster("GlobalInClusterIPPool", "dmz"), false},
		{"group named", []string{"*=InClusterIPPool.ipam.cluster.x-k8s.io/*"}, "a", inCluster("InClusterIPPool", "x"), true},
		{"other group", []string{"*=InClusterIPPool.ipam.cluster.x-k8s.io/*"}, "a", infrav1.IPPoolReference{APIGroup: "evil.example", Kind: "InClusterIPPool", Name: "x"}, false},
		{"none", []string{None}, "a", inCluster("InClusterIPPool", "lan"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Policy
			if tc.grants != nil {
				var err error
				if p.IPAMPools, err = ParseIPAMPools(tc.grants); err != nil {
					t.Fatal(err)
				}
			}
			err := p.CheckIPPool(tc.ns, tc.pool)
			if (err == nil) != tc.ok {
				t.Fatalf("CheckIPPool = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "--ipam-pools") {
				t.Errorf("%v does not name the flag", err)
			}
		})
	}
}

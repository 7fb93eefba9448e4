package manager

import (
	"slices"
	"testing"

	"github.com/spf13/pflag"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// TestTenancyFlags: the flags' defaults are tenancy's, and the release
// manifest's defaults parse (* allows any name: tenancy's tests).
func TestTenancyFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want tenancy.Policy
	}{
		{nil, tenancy.DefaultPolicy()},
		{[]string{"--storage-pool-dirs=/var/lib/libvirt", "--storage-pools=*", "--image-pools=capi-libvirt", "--host-bridges=*", "--libvirt-networks=*"},
			tenancy.Policy{PoolDirs: []string{"/var/lib/libvirt"}, Pools: []string{"*"}, ImagePools: []string{"capi-libvirt"}, Bridges: []string{"*"}, Networks: []string{"*"}}},
		{[]string{"--storage-pool-dirs=/srv/pools,/var/lib/libvirt", "--storage-pools=a,b", "--image-pools=images", "--host-bridges=br0", "--libvirt-networks=default"},
			tenancy.Policy{PoolDirs: []string{"/srv/pools", "/var/lib/libvirt"}, Pools: []string{"a", "b"}, ImagePools: []string{"images"},
				Bridges: []string{"br0"}, Networks: []string{"default"}}},
	} {
		var o Options
		fs := pflag.NewFlagSet("manager", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		got := o.Tenancy()
		for _, l := range [][2][]string{{got.PoolDirs, tc.want.PoolDirs}, {got.Pools, tc.want.Pools}, {got.ImagePools, tc.want.ImagePools},
			{got.Bridges, tc.want.Bridges}, {got.Networks, tc.want.Networks}} {
			if !slices.Equal(l[0], l[1]) {
				t.Errorf("%v: policy %+v, want %+v", tc.args, got, tc.want)
				break
			}
		}
		if err := got.Validate(); err != nil {
			t.Errorf("%v: %v", tc.args, err)
		}
	}
}

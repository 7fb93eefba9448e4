package pool

import (
	"context"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// fakeScope is a cluster asking for spec, with what status recorded.
type fakeScope struct {
	host    *fakehost.Host
	spec    virt.PoolSpec
	ensured *virt.PoolSpec
}

func (f *fakeScope) SpecPool() virt.PoolSpec { return f.spec }
func (f *fakeScope) PoolEnsured(spec virt.PoolSpec) bool {
	return f.ensured != nil && *f.ensured == spec
}
func (f *fakeScope) SetPoolEnsured(spec virt.PoolSpec) { f.ensured = &spec }

// TestEnsuredOncePerSpec: the pool is ensured once per spec, whatever the
// condition says (status.storagePool is the record), again when the spec
// names another pool, and never when it names one without a path.
func TestEnsuredOncePerSpec(t *testing.T) {
	a := virt.PoolSpec{Name: "a", Path: "/pools/a"}
	b := virt.PoolSpec{Name: "b", Path: "/pools/b"}
	s := &fakeScope{host: fakehost.New()}
	for _, step := range []struct {
		spec       virt.PoolSpec
		wantEnsure int
	}{
		{a, 1},
		{a, 1}, // recorded: left alone
		{b, 2}, // another pool
		{a, 3}, // back to a: status names b now
		{virt.PoolSpec{Name: "existing"}, 3},
	} {
		s.spec = step.spec
		if _, err := New(s, s.host).Reconcile(context.Background()); err != nil {
			t.Fatalf("%+v: %v", step.spec, err)
		}
		got := 0
		for _, c := range s.host.Calls {
			if c == "EnsurePool" {
				got++
			}
		}
		if got != step.wantEnsure {
			t.Errorf("after spec %+v: EnsurePool called %d times, want %d", step.spec, got, step.wantEnsure)
		}
	}
}

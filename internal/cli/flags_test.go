package cli

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
)

// TestHostEtcdFlag parses --host-etcd as up and create cluster do: auto
// (the default) puts a new cluster's etcd on the host under TCG only, and
// as a default an existing cluster may override; true and false are
// demands whatever the accelerator.
func TestHostEtcdFlag(t *testing.T) {
	for _, tc := range []struct {
		name          string
		args          []string
		domainType    string
		wantHost      bool
		wantFollows   bool
		wantElect     string
		wantErrSaying string
	}{
		{name: "default under TCG", domainType: "qemu", wantHost: true, wantFollows: true},
		{name: "default under KVM", domainType: "kvm", wantFollows: true},
		{name: "bare flag under KVM", args: []string{"--host-etcd"}, domainType: "kvm", wantHost: true},
		{name: "false under TCG", args: []string{"--host-etcd=false"}, domainType: "qemu", wantElect: "false"},
		{name: "true under TCG", args: []string{"--host-etcd=true"}, domainType: "qemu", wantHost: true},
		{name: "a typo", args: []string{"--host-etcd=yes"}, domainType: "qemu", wantErrSaying: "want true, false or auto"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f clusterFlags
			fs := pflag.NewFlagSet("up", pflag.ContinueOnError)
			f.bind(fs, true)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			o, err := f.clusterOptions(devplane.DomainChoice{DomainType: tc.domainType})
			if tc.wantErrSaying != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSaying) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErrSaying)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.HostEtcd != tc.wantHost || o.EtcdFollowsCluster != tc.wantFollows || o.LeaderElect != tc.wantElect {
				t.Errorf("etcd on the host %v, follows the cluster %v, leader election %q; want %v, %v, %q",
					o.HostEtcd, o.EtcdFollowsCluster, o.LeaderElect, tc.wantHost, tc.wantFollows, tc.wantElect)
			}
		})
	}
}

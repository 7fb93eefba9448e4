package manager

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
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
		got, err := parseFlags(t, tc.args).Tenancy()
		if err != nil {
			t.Fatal(err)
		}
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

// TestImageImportFlags: downloads are bounded and kept off the manager's
// own host and link-local addresses unless the operator says otherwise,
// file:// is refused unless directories are listed, and bad values name
// their flag.
func TestImageImportFlags(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		wantMax   int64
		wantDeny  []string
		wantFiles []string
		wantErr   string
	}{
		{name: "defaults", wantMax: 32 << 30,
			wantDeny: []string{"127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "::/128"}},
		{name: "operator's choice", args: []string{"--image-import-max-size=1Gi", "--image-url-deny-cidrs=10.0.0.0/8", "--image-file-dirs=/srv/images,/var/cache/images"},
			wantMax: 1 << 30, wantDeny: []string{"10.0.0.0/8"}, wantFiles: []string{"/srv/images", "/var/cache/images"}},
		{name: "no bound, nothing denied", args: []string{"--image-import-max-size=0", "--image-url-deny-cidrs="}, wantMax: 0},
		{name: "bad CIDR", args: []string{"--image-url-deny-cidrs=localhost"}, wantErr: "--image-url-deny-cidrs"},
		{name: "bad size", args: []string{"--image-import-max-size=big"}, wantErr: "--image-import-max-size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := parseFlags(t, tc.args)
			got, err := o.ImageImportOptions()
			if refusedAsWanted(t, err, tc.wantErr) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var deny []string
			for _, p := range got.Sources.DenyNets {
				deny = append(deny, p.String())
			}
			if got.Sources.MaxBytes != tc.wantMax || !slices.Equal(deny, tc.wantDeny) || !slices.Equal(got.Sources.FileDirs, tc.wantFiles) {
				t.Errorf("sources %+v, want max %d, deny %v, files %v", got.Sources, tc.wantMax, tc.wantDeny, tc.wantFiles)
			}
			if p, err := o.Tenancy(); err != nil || !slices.Equal(p.ImageFileDirs, tc.wantFiles) {
				t.Errorf("tenancy's file directories %v (%v), want %v", p.ImageFileDirs, err, tc.wantFiles)
			}
		})
	}
}

// TestMachineLimitFlags: one machine is bounded by default, a namespace's
// total only when the operator says so, and sizes parse as quantities.
func TestMachineLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		name        string
		args        []string
		machine, ns tenancy.Limits
		wantErr     string
	}{
		{name: "defaults", machine: tenancy.Limits{VCPUs: 32, MemoryMiB: 128 << 10, DiskGiB: 1 << 10}},
		{name: "operator's choice", args: []string{"--max-machine-vcpus=4", "--max-machine-memory=8Gi", "--max-machine-disk=50Gi",
			"--namespace-max-machines=6", "--namespace-max-vcpus=12", "--namespace-max-memory=24Gi"},
			machine: tenancy.Limits{VCPUs: 4, MemoryMiB: 8 << 10, DiskGiB: 50}, ns: tenancy.Limits{Machines: 6, VCPUs: 12, MemoryMiB: 24 << 10}},
		{name: "no bounds", args: []string{"--max-machine-vcpus=0", "--max-machine-memory=0", "--max-machine-disk=0"}},
		{name: "bad size", args: []string{"--namespace-max-memory=lots"}, wantErr: "--namespace-max-memory"},
		{name: "host devices", args: []string{"--namespace-max-host-devices=2"}, machine: tenancy.Limits{VCPUs: 32, MemoryMiB: 128 << 10, DiskGiB: 1 << 10},
			ns: tenancy.Limits{HostDevices: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := parseFlags(t, tc.args)
			p, err := o.Tenancy()
			if refusedAsWanted(t, err, tc.wantErr) {
				return
			}
			if err != nil || p.Machine != tc.machine || p.Namespace != tc.ns {
				t.Errorf("machine %+v namespace %+v (%v), want %+v %+v", p.Machine, p.Namespace, err, tc.machine, tc.ns)
			}
		})
	}
}

// parseFlags is the options the manager's flags give for args.
func parseFlags(t *testing.T, args []string) *Options {
	t.Helper()
	var o Options
	fs := pflag.NewFlagSet("manager", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &o
}

// refusedAsWanted fails t unless err names flag, when a refusal is wanted
// (flag not empty), and tells whether one was.
func refusedAsWanted(t *testing.T, err error, flag string) bool {
	t.Helper()
	if flag == "" {
		return false
	}
	if err == nil || !strings.Contains(err.Error(), flag) {
		t.Fatalf("error %v, want one naming %s", err, flag)
	}
	return true
}

// TestImageGCFlag: imported images nobody uses go after a day by default;
// 0 keeps them.
func TestImageGCFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, 24 * time.Hour},
		{[]string{"--image-gc-after=1h"}, time.Hour},
		{[]string{"--image-gc-after=0"}, 0},
	} {
		got, err := parseFlags(t, tc.args).ImageImportOptions()
		if err != nil || got.GCAfter != tc.want {
			t.Errorf("%v: GCAfter %s (%v), want %s", tc.args, got.GCAfter, err, tc.want)
		}
	}
}

// TestNetworkAndHostFlags: networks the provider creates get private
// ranges unless the operator says otherwise, and the libvirt hosts that
// only * admits are denied what image downloads are.
func TestNetworkAndHostFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		cidrs     string // the ranges, "<nil>" for any
		denyNets  int
		wantError string
	}{
		{nil, "[10.0.0.0/8 172.16.0.0/12 192.168.0.0/16]", len(imageimport.DefaultDenyCIDRs), ""},
		{[]string{"--network-cidrs=*"}, "<nil>", len(imageimport.DefaultDenyCIDRs), ""},
		{[]string{"--network-cidrs=none"}, "[]", len(imageimport.DefaultDenyCIDRs), ""},
		{[]string{"--network-cidrs=100.64.0.0/10", "--image-url-deny-cidrs="}, "[100.64.0.0/10]", 0, ""},
		{[]string{"--network-cidrs=10.0.0.0"}, "", 0, "--network-cidrs"},
		{[]string{"--network-cidrs="}, "", 0, "--network-cidrs"},
		{[]string{"--image-url-deny-cidrs=x"}, "", 0, "--image-url-deny-cidrs"},
	} {
		got, err := parseFlags(t, tc.args).Tenancy()
		if tc.wantError != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantError) {
				t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.wantError)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		cidrs := fmt.Sprint(got.NetworkCIDRs)
		if got.NetworkCIDRs == nil {
			cidrs = "<nil>"
		}
		if cidrs != tc.cidrs || len(got.HostDenyNets) != tc.denyNets {
			t.Errorf("%v: ranges %s and %d denied nets, want %s and %d", tc.args, cidrs, len(got.HostDenyNets), tc.cidrs, tc.denyNets)
		}
	}
}

// TestHostDeviceFlag: --host-devices lists aliases with their addresses,
// the release manifest's none allows no device, and a bad entry names the
// flag.
func TestHostDeviceFlag(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		wantAliases []string
		wantErr     string
	}{
		{args: nil},
		{args: []string{"--host-devices=none"}},
		{args: []string{"--host-devices=gpu0=0000:65:00.0/nvidia.com/gpu,nic0=0000:17:00.1"}, wantAliases: []string{"gpu0", "nic0"}},
		{args: []string{"--host-devices=0000:65:00.0"}, wantErr: "invalid --host-devices"},
		// The flag splits at commas: options join their alias again.
		{args: []string{"--host-devices=gpu0=0000:65:00.0/nvidia.com/gpu,vendor=10de,device=2204,host=gpu1,nic0=0000:17:00.1,allow=network"},
			wantAliases: []string{"gpu0", "nic0"}},
		{args: []string{"--host-devices=gpu0=0000:65:00.0", "--host-devices=vendor=10de,device=2204"}, wantAliases: []string{"gpu0"}},
	} {
		p, err := parseFlags(t, tc.args).Tenancy()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: err = %v, want %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		var aliases []string
		for _, d := range p.HostDevices {
			aliases = append(aliases, d.Alias)
		}
		if len(tc.wantAliases) > 0 && tc.wantAliases[0] == "gpu0" && strings.Contains(strings.Join(tc.args, " "), "vendor=") &&
			p.HostDevices[0].IDs != (pci.IDs{Vendor: 0x10de, Device: 0x2204}) {
			t.Errorf("%v: gpu0's IDs %s, want 10de:2204", tc.args, p.HostDevices[0].IDs)
		}
		if !slices.Equal(aliases, tc.wantAliases) {
			t.Errorf("%v: aliases %v, want %v", tc.args, aliases, tc.wantAliases)
		}
	}
}

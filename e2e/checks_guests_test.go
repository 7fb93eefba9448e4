//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/cluster-api/util/conditions"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// checkGuests checks providerIDs against the UUIDs the guests read from
// their firmware, and addresses against those the guests have.
func (s *suite) checkGuests(t *testing.T) {
	lms, err := s.clusterMachines(s.cut.name)
	must(t, err)
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	for _, lm := range lms {
		if extraMachine(lm.Name) || lm.Status.Domain == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
		raw, err := s.host.GuestReadFile(ctx, lm.Status.Domain.Name, "/sys/class/dmi/id/product_uuid")
		cancel()
		if err != nil {
			t.Errorf("%s: reading product_uuid through the guest agent: %v", lm.Name, err)
			continue
		}
		guestUUID := strings.ToLower(strings.TrimSpace(string(raw)))
		if !uuidRE.MatchString(guestUUID) {
			t.Errorf("%s: guest product_uuid %q is not a UUID", lm.Name, guestUUID)
		}
		if want := infrav1.ProviderIDPrefix + guestUUID; lm.Spec.ProviderID != want {
			t.Errorf("%s: providerID %q, but the guest's firmware UUID gives %q", lm.Name, lm.Spec.ProviderID, want)
		}
		// The guest's own view of its addresses, from inside it: what
		// `ip` reports on the interface with the domain's MAC, read through
		// the guest agent (not virt.Client.Addresses, which the controller
		// used to fill status.addresses).
		ctx, cancel = context.WithTimeout(s.ctx, time.Minute)
		res, err := s.host.GuestExec(ctx, lm.Status.Domain.Name, "ip", []string{"-j", "addr", "show"}, nil)
		cancel()
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("ip exited with %d: %s", res.ExitCode, res.Stderr)
		}
		if err != nil {
			t.Errorf("%s: `ip -j addr show` in the guest: %v", lm.Name, err)
			continue
		}
		guest, err := guestIPv4(res.Stdout, lm.Status.Domain.MAC)
		if err != nil {
			t.Errorf("%s: %v", lm.Name, err)
			continue
		}
		reported, err := sameAsGuest(lm.Status.Addresses, guest)
		if err != nil {
			t.Errorf("%s (MAC %s): %v", lm.Name, lm.Status.Domain.MAC, err)
		}
		t.Logf("%s: providerID %s = guest UUID, addresses %v = the guest's", lm.Name, lm.Spec.ProviderID, reported)
		s.checkSeedHasNoBootstrapData(t, lm)
	}
}

// checkSeedHasNoBootstrapData: once a machine bootstrapped, its seed volume
// on the host holds no user-data (join tokens, certificate keys).
func (s *suite) checkSeedHasNoBootstrapData(t *testing.T, lm infrav1.LibvirtMachine) {
	if !conditions.IsTrue(&lm, infrav1.BootstrapSucceededCondition) {
		return
	}
	s.waitFor(t, lm.Name+": bootstrap data removed from the seed", time.Minute, func() (bool, string) {
		cur := s.lm(lm.Name)
		return cur != nil && cur.Status.BootstrapDataRemoved, "status.bootstrapDataRemoved not set"
	})
	pool := lm.Annotations[scope.PoolAnnotation]
	info, err := s.host.VolumeInfo(s.ctx, pool, naming.SeedVolumeName(lm.Status.Domain.Name))
	if err != nil {
		t.Errorf("%s: seed volume: %v", lm.Name, err)
		return
	}
	b, err := os.ReadFile(info.Path)
	switch {
	case err != nil:
		t.Errorf("%s: reading the seed: %v", lm.Name, err)
	case bytes.Contains(b, []byte("#cloud-config")):
		t.Errorf("%s: the seed %s still holds the bootstrap data after bootstrap succeeded", lm.Name, info.Path)
	case !bytes.Contains(b, []byte(lm.Status.Domain.UUID)):
		t.Errorf("%s: the seed %s lost its instance-id: a reboot would bootstrap again", lm.Name, info.Path)
	default:
		t.Logf("%s: the seed holds no bootstrap data any more", lm.Name)
	}
}

// guestIPv4 returns the global IPv4 addresses of the interface with mac in
// the JSON output of `ip -j addr show` run in a guest.
func guestIPv4(ipJSON []byte, mac string) ([]string, error) {
	var links []struct {
		IfName   string `json:"ifname"`
		Address  string `json:"address"`
		AddrInfo []struct {
			Family string `json:"family"`
			Local  string `json:"local"`
			Scope  string `json:"scope"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(ipJSON, &links); err != nil {
		return nil, fmt.Errorf("parsing `ip -j addr show` output: %w", err)
	}
	var out []string
	found := false
	for _, l := range links {
		if !strings.EqualFold(l.Address, mac) {
			continue
		}
		found = true
		for _, a := range l.AddrInfo {
			if a.Family == "inet" && a.Scope == "global" {
				out = append(out, a.Local)
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("the guest has no interface with MAC %s", mac)
	}
	return out, nil
}

// sameAsGuest checks that the InternalIP addresses of status.addresses are
// exactly the guest's own (at least one), and returns them.
func sameAsGuest(status []clusterv1.MachineAddress, guest []string) ([]string, error) {
	var reported []string
	for _, a := range status {
		if a.Type == clusterv1.MachineInternalIP {
			reported = append(reported, a.Address)
		}
	}
	slices.Sort(reported)
	guest = slices.Sorted(slices.Values(guest))
	if len(guest) == 0 || !slices.Equal(reported, guest) {
		return reported, fmt.Errorf("InternalIP addresses %v, but the guest has %v", reported, guest)
	}
	return reported, nil
}

// rebootWithoutBootstrap reboots a bootstrapped worker from inside and
// checks that its bootstrap did not run again: the seed it boots from has
// no user-data any more and the same instance-id, so cloud-init sees the
// same instance and writes no new sentinel (it lives in /run, emptied by
// the reboot); the machine keeps its providerID and stays provisioned.
func (s *suite) rebootWithoutBootstrap(t *testing.T) {
	var lm *infrav1.LibvirtMachine
	for _, w := range s.workerMachines(t) {
		if w.Status.BootstrapDataRemoved && w.Status.Domain != nil {
			lm = w
			break
		}
	}
	if lm == nil {
		t.Fatal("no worker had its bootstrap data removed")
	}
	dom := lm.Status.Domain.Name
	read := func(path string) (string, error) {
		ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
		defer cancel()
		b, err := s.host.GuestReadFile(ctx, dom, path)
		return strings.TrimSpace(string(b)), err
	}
	bootBefore, err := read(bootIDFile)
	must(t, err)
	instanceBefore, err := read(instanceIDFile)
	must(t, err)
	stop := s.rep.phase("reboot a worker: bootstrap does not run again")
	defer stop()
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	_, err = s.host.GuestExec(ctx, dom, "sh", []string{"-c", "(sleep 2; systemctl reboot) >/dev/null 2>&1 &"}, nil)
	cancel()
	must(t, err)
	s.waitFor(t, lm.Name+": rebooted", bootTimeout, func() (bool, string) {
		id, err := read(bootIDFile)
		return err == nil && id != bootBefore, fmt.Sprintf("boot id %q, %v", id, err)
	})
	s.waitFor(t, lm.Name+": cloud-init done after the reboot", bootTimeout, func() (bool, string) {
		ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
		defer cancel()
		res, err := s.host.GuestExec(ctx, dom, "cloud-init", []string{"status"}, nil)
		return err == nil && strings.Contains(string(res.Stdout), "status: done"), fmt.Sprintf("%s %v", res.Stdout, err)
	})
	took := time.Since(start)
	if _, err := read(sentinelFile); !virt.IsNotFound(err) {
		t.Errorf("%s: after the reboot %s exists (%v): the bootstrap ran again", lm.Name, sentinelFile, err)
	}
	if id, err := read(instanceIDFile); err != nil || id != instanceBefore {
		t.Errorf("%s: instance-id %q after the reboot (%v), was %q", lm.Name, id, err, instanceBefore)
	}
	after := s.lm(lm.Name)
	if after == nil || after.Spec.ProviderID != lm.Spec.ProviderID || !after.Status.Initialization.IsProvisioned() {
		t.Errorf("%s changed across the reboot: %+v", lm.Name, after)
	}
	t.Logf("%s rebooted in %s without running its bootstrap again", lm.Name, took.Round(time.Second))
	s.rep.passed(t, "reboot of %s: back with cloud-init done in %s, bootstrap not run again (seed without user-data, same instance-id)", lm.Name, took.Round(time.Second))
}

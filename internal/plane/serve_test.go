package plane

import (
	"slices"
	"strings"
	"testing"
)

// TestManagerArgs: the plane's manager serves its webhooks, health and
// metrics on loopback; the caller's flags come last, so they win.
func TestManagerArgs(t *testing.T) {
	ports := managerPorts{webhook: 9443, health: 9440, metrics: 8443}
	base := []string{
		"--libvirt-uri=qemu:///system",
		"--leader-elect=false",
		"--webhook-host=127.0.0.1",
		"--webhook-port=9443",
		"--webhook-cert-dir=/state/webhook-certs",
		"--health-addr=127.0.0.1:9440",
		"--diagnostics-address=127.0.0.1:8443",
		"--insecure-diagnostics",
		"--image-file-dirs=/images",
	}
	for _, tc := range []struct {
		name  string
		extra []string
		want  []string
	}{
		{"defaults", nil, base},
		{"caller's flags last", []string{"--max-machine-vcpus=4"}, append(slices.Clone(base), "--max-machine-vcpus=4")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{LibvirtURI: "qemu:///system", ImageDir: "/images", ManagerArgs: tc.extra}
			if got := managerArgs(o, ports, "/state/webhook-certs"); !slices.Equal(got, tc.want) {
				t.Errorf("managerArgs:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

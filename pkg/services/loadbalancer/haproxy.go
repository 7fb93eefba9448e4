package loadbalancer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"text/template"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// Where HAProxy's configuration and statistics live in the VM.
const (
	// ConfigPath is the configuration the haproxy service loads.
	ConfigPath = "/etc/haproxy/haproxy.cfg"
	// StatsAddress is a read-only (level user) stats socket on the VM's
	// loopback: the controller reads `show info` through it to confirm
	// which configuration runs, with nothing but bash in the VM.
	StatsAddress = "127.0.0.1:9000"
	// idPrefix starts the global description that carries the
	// configuration's ID into `show info`.
	idPrefix = "capl-config-"
)

// Health checks: an API server that fails /readyz twice, 2 s apart, gets
// no new connections until it passes twice.
const (
	checkInterval = "2s"
	checkFall     = 2
	checkRise     = 2
)

// Config is the HAProxy configuration of a cluster's control-plane
// endpoint: one TCP frontend and one backend with a server per
// control-plane machine.
type Config struct {
	// FrontendPort is the control-plane endpoint's port.
	FrontendPort int32
	// BackendPort is where the API servers listen in the machines.
	BackendPort int32
	// Backends are the control-plane machines, in a stable order.
	Backends []infrav1.LoadBalancerBackend
}

// server is one backend line of the template.
type server struct {
	Name    string
	Address string
	Weight  int
}

// templateData is what the template renders; ID is empty while hashing.
type templateData struct {
	ID           string
	StatsAddress string
	FrontendPort int32
	Servers      []server
	Interval     string
	Fall, Rise   int
}

// configTemplate is HAProxy's configuration. The API servers are checked
// with a TLS GET of /readyz (anonymous access to it is the Kubernetes
// default), their certificates are not verified (the load balancer has no
// CA and holds no credential). A draining server has weight 0: it gets no
// new connections while its open ones continue. The timeouts are long
// because clients keep watches open for minutes.
//
// When every server fails its check the frontend still forwards, to the
// same servers unchecked: a guest under load (TCG on a busy host) answers
// /readyz slower than the check's timeout for minutes while it serves its
// clients, and a refused connection helps no client. A server that is
// really down refuses the forwarded connection just the same.
var configTemplate = template.Must(template.New("haproxy.cfg").Parse(`# Written by cluster-api-provider-libvirt through the guest agent.
# Local changes are replaced at the next backend change.
global
  log /dev/log local0
  log /dev/log local1 notice
  chroot /var/lib/haproxy
  stats socket /run/haproxy/admin.sock mode 660 level admin
  stats socket ipv4@{{ .StatsAddress }} level user
  stats timeout 30s
  user haproxy
  group haproxy
  daemon
  maxconn 4096
  description {{ .ID }}

defaults
  log global
  mode tcp
  option dontlognull
  timeout connect 5s
  timeout client 1h
  timeout server 1h
  timeout check 5s

frontend control-plane
  bind *:{{ .FrontendPort }}
  use_backend control-plane-unchecked if { nbsrv(control-plane) eq 0 }
  default_backend control-plane

backend control-plane
  balance roundrobin
  option httpchk GET /readyz
  http-check expect status 200
  default-server check check-ssl verify none inter {{ .Interval }} fall {{ .Fall }} rise {{ .Rise }}
{{- range .Servers }}
  server {{ .Name }} {{ .Address }} weight {{ .Weight }}
{{- end }}

backend control-plane-unchecked
  balance roundrobin
{{- range .Servers }}
  server {{ .Name }} {{ .Address }} weight {{ .Weight }}
{{- end }}
`))

// Render returns the configuration file and its ID, a hash of everything
// in it but the ID itself. The ID is written into the global description,
// so `show info` tells which configuration the running HAProxy loaded.
func (c Config) Render() ([]byte, string, error) {
	data := templateData{
		StatsAddress: StatsAddress, FrontendPort: c.FrontendPort,
		Interval: checkInterval, Fall: checkFall, Rise: checkRise,
	}
	for _, b := range c.Backends {
		weight := 1
		if b.State == infrav1.BackendDraining {
			weight = 0
		}
		data.Servers = append(data.Servers, server{
			Name: b.Machine, Address: net.JoinHostPort(b.Address, strconv.Itoa(int(c.BackendPort))), Weight: weight,
		})
	}
	var body bytes.Buffer
	if err := configTemplate.Execute(&body, data); err != nil {
		return nil, "", fmt.Errorf("rendering haproxy.cfg: %w", err)
	}
	sum := sha256.Sum256(body.Bytes())
	data.ID = idPrefix + hex.EncodeToString(sum[:16])
	var out bytes.Buffer
	if err := configTemplate.Execute(&out, data); err != nil {
		return nil, "", fmt.Errorf("rendering haproxy.cfg: %w", err)
	}
	return out.Bytes(), data.ID, nil
}

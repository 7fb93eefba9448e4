package tenancy

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
)

// libvirtSchemes are the transports a failure domain's uri may use, and
// the kind of credentials each takes from a Secret ("" for none). Those
// left out run a program (qemu+ext) or name a socket on the manager's
// side (qemu+unix), which a tenant must never choose.
var libvirtSchemes = map[string]string{
	"qemu": "", "qemu+tcp": "",
	"qemu+ssh": CredentialsSSH, "qemu+libssh": CredentialsSSH, "qemu+libssh2": CredentialsSSH,
	"qemu+tls": CredentialsTLS,
}

// The kinds of credentials a libvirt URI's transport takes.
const (
	// CredentialsSSH is an SSH private key and the known_hosts to check
	// the host's key against.
	CredentialsSSH = "ssh"
	// CredentialsTLS is a client certificate and key and the CA that
	// signed the host's certificate.
	CredentialsTLS = "tls"
)

// ParseLibvirtURI checks that raw is a libvirt URI of the system QEMU
// driver on a transport a tenant may name, and returns the kind of
// credentials its transport takes ("" for none). Schemes are compared
// whatever their case, as libvirt compares transports.
func ParseLibvirtURI(raw string) (credentials string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("is not a URI: %w", err)
	}
	scheme := strings.ToLower(u.Scheme)
	credentials, ok := libvirtSchemes[scheme]
	switch {
	case !ok:
		return "", fmt.Errorf("scheme %q is not one of qemu, qemu+ssh, qemu+libssh, qemu+libssh2, qemu+tls, qemu+tcp", u.Scheme)
	case u.Path != "/system":
		return "", fmt.Errorf("must name the system driver (path /system), not %q", u.Path)
	case scheme == "qemu" && u.Host != "":
		return "", errors.New("qemu:///system is the manager's own host and names no host; use a remote transport (qemu+ssh://host/system)")
	case scheme != "qemu" && u.Hostname() == "":
		return "", errors.New("a remote transport needs a host (qemu+ssh://host/system)")
	case u.Fragment != "" || u.Opaque != "":
		return "", errors.New("must not have a fragment")
	}
	if _, hasPassword := u.User.Password(); hasPassword {
		return "", errors.New("must not carry a password: put credentials in a Secret and name it in credentialsRef")
	}
	return credentials, nil
}

// CheckLibvirtURI refuses a failure domain's uri the operator did not
// allow: the manager's own URI and those listed in LibvirtURIs are always
// allowed; with Any, a URI ParseLibvirtURI accepts that has no query
// (libvirt's query parameters choose programs, sockets and key files on
// the manager's side), whose failure domain brings credentials (without,
// the manager would connect with its own SSH keys and TLS certificates)
// and whose host is no address of HostDenyNets.
func (p Policy) CheckLibvirtURI(raw string, withCredentials bool) error {
	if raw == "" || raw == p.ManagerURI {
		return nil
	}
	if _, err := ParseLibvirtURI(raw); err != nil {
		return err
	}
	if slices.Contains(p.LibvirtURIs, raw) {
		return nil
	}
	if !slices.Contains(p.LibvirtURIs, Any) {
		if len(p.LibvirtURIs) == 0 || denyAll(p.LibvirtURIs) {
			return fmt.Errorf("the operator allows no libvirt host but the manager's own (%s): ask for it in the manager's --libvirt-uris", p.ManagerURI)
		}
		return fmt.Errorf("must be one of %s (the manager's --libvirt-uris) or the manager's own %s", strings.Join(p.LibvirtURIs, ", "), p.ManagerURI)
	}
	if strings.Contains(raw, "?") {
		return errors.New("query parameters (transport options such as command=, socket= or keyfile=) are allowed only in a URI the operator lists exactly in --libvirt-uris")
	}
	if !withCredentials {
		return errors.New("needs credentialsRef: a URI the operator does not list exactly in --libvirt-uris connects only with the tenant's own SSH key or TLS certificate, never with the manager's")
	}
	u, _ := url.Parse(raw) // ParseLibvirtURI parsed it
	if a, err := netip.ParseAddr(u.Hostname()); err == nil {
		return DeniedAddress(a, p.HostDenyNets)
	}
	return nil
}

// OnlyAny tells whether raw is a libvirt URI that the operator admits only
// through Any: neither the manager's own nor listed exactly. Its host's
// addresses are checked on every connect (pkg/hosts).
func (p Policy) OnlyAny(raw string) bool {
	return raw != "" && raw != p.ManagerURI && !slices.Contains(p.LibvirtURIs, raw)
}

// DeniedAddress refuses a when one of deny holds it. The message names
// the address and the range, never what answers there: tenants read it.
func DeniedAddress(a netip.Addr, deny []netip.Prefix) error {
	a = a.Unmap().WithZone("")
	for _, d := range deny {
		if d.Contains(a) {
			return fmt.Errorf("leads to %s, in %s, which the operator denies (the manager's --image-url-deny-cidrs)", a, d)
		}
	}
	return nil
}

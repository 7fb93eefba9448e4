package plane

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

const (
	// DefaultLibvirtTLSPort is libvirt's own TLS port, so that a manager
	// in a guest names the host as qemu+tls://GATEWAY/system, no port.
	DefaultLibvirtTLSPort = 16514
	// libvirtTLSDirName holds the libvirt endpoint's certificate authority
	// and the client credentials it issued. Unlike the plane's other
	// authorities it is kept across starts: a cluster that manages itself
	// holds the client credentials in a Secret. Down removes it; so must a
	// user after certificateLifetime, when both have expired.
	libvirtTLSDirName = "libvirt-tls"
	// LibvirtClientDirName, in libvirtTLSDirName, is a libvirt client
	// pkipath (cacert.pem, clientcert.pem, clientkey.pem): on the host
	// qemu+tls://127.0.0.1/system?pkipath=DIR, in a pod the Secret
	// capl-libvirt-tls, which the release manifests mount where libvirt's
	// client looks.
	LibvirtClientDirName = "client"
	// libvirtHandshakeTimeout bounds a client's TLS handshake, so that a
	// connection that says nothing holds no goroutine.
	libvirtHandshakeTimeout = 10 * time.Second
	// libvirtClientName is the client certificate's common name.
	libvirtClientName = "capl-manager"
)

// libvirtEndpoint lets a manager that runs in a guest, in a pod of a
// cluster the plane made, drive the host's libvirtd: it serves TLS on
// libvirt's TLS port, requires a client certificate of its own authority,
// and relays each connection to libvirtd's local socket. libvirtd itself
// is neither reconfigured nor restarted (it listens on its socket only),
// and the relay answers only on loopback and on the bridges of the
// provider's networks, as the registry does: a guest of another libvirt
// network or a machine of the LAN gets no handshake.
type libvirtEndpoint struct {
	socket   string
	ca       *authority
	caPool   *x509.CertPool
	mu       sync.Mutex
	byIP     map[string]*tls.Certificate  // serving certificates by local address
	onBridge func(net.IP) (string, error) // netalloc.InterfaceHolding; tests stand in
}

// serveLibvirtTLS runs the libvirt endpoint on o.LibvirtTLSPort of every
// host address until ctx ends and returns the client pkipath directory;
// empty when it is off (a negative port), when the plane's libvirt is not
// this host's (no local socket to relay to) or when another process holds
// the port (libvirtd's own listen_tls, another plane).
func serveLibvirtTLS(ctx context.Context, o Options) (string, error) {
	if o.LibvirtTLSPort < 0 {
		return "", nil
	}
	socket, ok := localLibvirtSocket(o.LibvirtURI)
	if !ok {
		log.Printf("libvirt-tls: %s is not this host's libvirtd; the plane relays none", o.LibvirtURI)
		return "", nil
	}
	dir := filepath.Join(o.StateDir, libvirtTLSDirName)
	ca, err := loadOrCreateLibvirtAuthority(dir)
	if err != nil {
		return "", fmt.Errorf("libvirt-tls: %w", err)
	}
	l, err := net.Listen("tcp", ":"+strconv.Itoa(o.LibvirtTLSPort))
	if errors.Is(err, syscall.EADDRINUSE) {
		log.Printf("libvirt-tls: port %d is taken (libvirtd's own TLS listener, another plane?); this plane relays none", o.LibvirtTLSPort)
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("libvirt-tls: %w", err)
	}
	e := &libvirtEndpoint{socket: socket, ca: ca, caPool: x509.NewCertPool(), byIP: map[string]*tls.Certificate{},
		onBridge: netalloc.InterfaceHolding}
	e.caPool.AddCert(ca.cert)
	go e.serve(ctx, l)
	client := filepath.Join(dir, LibvirtClientDirName)
	log.Printf("libvirt-tls: relaying port %d to %s for clients of %s, on loopback and the provider's bridges", o.LibvirtTLSPort, socket, client)
	return client, nil
}

// localLibvirtSocket is the unix socket of a qemu:///system URI
// (libvirt's default path, or its ?socket= parameter).
func localLibvirtSocket(uri string) (string, bool) {
	u, err := url.Parse(uri)
	if err != nil || (u.Scheme != "qemu" && u.Scheme != "qemu+unix") || u.Host != "" || u.Path != "/system" {
		return "", false
	}
	if s := u.Query().Get("socket"); s != "" {
		return s, true
	}
	return "/var/run/libvirt/libvirt-sock", true
}

func (e *libvirtEndpoint) serve(ctx context.Context, l net.Listener) {
	go func() { <-ctx.Done(); _ = l.Close() }()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil {
				log.Printf("libvirt-tls: %v", err)
			}
			return
		}
		go e.relay(ctx, conn)
	}
}

// relay checks where conn came from, completes the handshake with a
// verified client certificate and copies bytes between it and libvirtd
// until either side closes.
func (e *libvirtEndpoint) relay(ctx context.Context, raw net.Conn) {
	defer raw.Close()
	if err := e.allow(raw.LocalAddr(), raw.RemoteAddr()); err != nil {
		log.Printf("libvirt-tls: refused %s: %v", raw.RemoteAddr(), err)
		return
	}
	conn := tls.Server(raw, &tls.Config{
		MinVersion: tls.VersionTLS12,
		// No TLS 1.3 session tickets: libvirt's client reads its one-byte
		// confirmation right after the handshake, and a ticket record
		// arriving first makes that read fail with EAGAIN ("Unable to read
		// TLS confirmation").
		SessionTicketsDisabled: true,
		ClientAuth:             tls.RequireAndVerifyClientCert,
		ClientCAs:              e.caPool,
		GetCertificate:         e.servingCertificate,
	})
	hs, cancel := context.WithTimeout(ctx, libvirtHandshakeTimeout)
	err := conn.HandshakeContext(hs)
	cancel()
	if err != nil {
		log.Printf("libvirt-tls: handshake with %s: %v", raw.RemoteAddr(), err)
		return
	}
	up, err := net.Dial("unix", e.socket)
	if err != nil {
		log.Printf("libvirt-tls: %s: %v", raw.RemoteAddr(), err)
		return
	}
	defer up.Close()
	// libvirt's TLS transport: once the handshake and the certificate
	// checks passed, the server confirms with one byte, 1, which the
	// client waits for before its first RPC call (libvirtd's
	// virNetServerClient does the same).
	if _, err := conn.Write([]byte{1}); err != nil {
		log.Printf("libvirt-tls: %s: %v", raw.RemoteAddr(), err)
		return
	}
	log.Printf("libvirt-tls: %s (%s) connected", raw.RemoteAddr(), conn.ConnectionState().PeerCertificates[0].Subject.CommonName)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, conn); done <- struct{}{} }()
	go func() { _, _ = io.Copy(conn, up); done <- struct{}{} }()
	select {
	case <-done: // one side closed: the RPC session is over
	case <-ctx.Done():
	}
}

// allow is the access rule of libvirtEndpoint.
func (e *libvirtEndpoint) allow(local, remote net.Addr) error {
	if ip := addrIP(remote); ip != nil && ip.IsLoopback() {
		return nil
	}
	if err := netalloc.OnProviderBridge(addrIP(local), e.onBridge); err != nil {
		return fmt.Errorf("the libvirt endpoint answers guests on the bridges of the provider's networks only: %w", err)
	}
	return nil
}

func addrIP(a net.Addr) net.IP {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP
	}
	return nil
}

// servingCertificate issues, once per address, a certificate for the
// local address the client reached: a guest names its network's gateway
// in the URI and libvirt's client checks the name, while the plane cannot
// know the gateways of networks made after it started.
func (e *libvirtEndpoint) servingCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	ip := addrIP(hello.Conn.LocalAddr())
	if ip == nil {
		return nil, errors.New("no local address")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.byIP[ip.String()]; ok && time.Until(c.Leaf.NotAfter) > 24*time.Hour {
		return c, nil
	}
	pair, err := e.ca.libvirtCertificate(x509.ExtKeyUsageServerAuth, ip.String())
	if err != nil {
		return nil, err
	}
	c, err := tls.X509KeyPair(pair.cert, pair.key)
	if err != nil {
		return nil, err
	}
	e.byIP[ip.String()] = &c
	return &c, nil
}

// libvirtCertificate issues a certificate libvirt's GnuTLS checks accept:
// key usage with key encipherment (it refuses a critical key usage
// without it) and valid from an hour ago, for a guest whose clock is
// behind the host's.
func (a *authority) libvirtCertificate(usage x509.ExtKeyUsage, name string) (keyPair, error) {
	template, err := certificateTemplate(pkix.Name{CommonName: name})
	if err != nil {
		return keyPair{}, err
	}
	if ip := net.ParseIP(name); ip != nil && usage == x509.ExtKeyUsageServerAuth {
		template.IPAddresses = []net.IP{ip}
	}
	template.NotBefore = template.NotBefore.Add(-time.Hour)
	template.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	template.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	return a.issue(template)
}

// loadOrCreateLibvirtAuthority reads the authority of dir, or makes it
// and the client credentials of LibvirtClientDirName when dir has none.
func loadOrCreateLibvirtAuthority(dir string) (*authority, error) {
	certFile, keyFile := filepath.Join(dir, "cacert.pem"), filepath.Join(dir, "cakey.pem")
	certPEM, certErr := os.ReadFile(certFile)
	keyPEM, keyErr := os.ReadFile(keyFile)
	if certErr == nil && keyErr == nil {
		return parseAuthority(certPEM, keyPEM)
	}
	if !errors.Is(certErr, os.ErrNotExist) || !errors.Is(keyErr, os.ErrNotExist) {
		return nil, fmt.Errorf("%s holds half an authority (%v, %v): remove the directory to make a new one, and give the new client credentials to the managers that used the old", dir, certErr, keyErr)
	}
	ca, err := newAuthority("capl-plane-libvirt-ca")
	if err != nil {
		return nil, err
	}
	client, err := ca.libvirtCertificate(x509.ExtKeyUsageClientAuth, libvirtClientName)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return nil, err
	}
	clientDir := filepath.Join(dir, LibvirtClientDirName)
	if err := os.MkdirAll(clientDir, 0o700); err != nil {
		return nil, err
	}
	// The authority's key last: its presence marks a complete directory.
	for name, content := range map[string][]byte{
		filepath.Join(clientDir, "cacert.pem"):     ca.certPEM,
		filepath.Join(clientDir, "clientcert.pem"): client.cert,
		filepath.Join(clientDir, "clientkey.pem"):  client.key,
		certFile: ca.certPEM,
	} {
		if err := os.WriteFile(name, content, 0o600); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	return ca, nil
}

// parseAuthority is an authority from its PEM certificate and EC key.
func parseAuthority(certPEM, keyPEM []byte) (*authority, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("the libvirt authority's files are not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("the libvirt authority's key does not match its certificate")
	}
	return &authority{cert: cert, key: key, certPEM: certPEM}, nil
}

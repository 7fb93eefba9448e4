package plane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestControlPlaneEtcdClientCertificates starts the control plane on etcd
// data an older plane wrote over plain HTTP (no certificates anywhere) and
// shows that etcd then serves its client and peer URLs on loopback only
// and refuses every client without a certificate of its authority, plain
// HTTP or TLS, while kube-apiserver, holding one, works; a client with
// kube-apiserver's certificate reads the data the old etcd wrote.
func TestControlPlaneEtcdClientCertificates(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Fatal("KUBEBUILDER_ASSETS is unset: run through `make test`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dataDir := filepath.Join(t.TempDir(), "etcd")
	key, value := "/capl-test/old-plane", "written over plain HTTP"
	writeWithPlainEtcd(ctx, t, assets, dataDir, key, value)

	cp, err := startControlPlane(ctx, controlPlaneSpec{assets: assets, etcdDataDir: dataDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	hc, err := rest.HTTPClientFor(cp.admin)
	must(t, err)
	must(t, getOK(ctx, hc, cp.admin.Host+"/readyz"))

	etcdArgs := processArgs(t, cp.etcd.pid)
	apiServerArgs := processArgs(t, cp.apiServer.pid)
	for _, name := range []string{"listen-client-urls", "listen-peer-urls"} {
		u, err := url.Parse(etcdArgs.flagValue(t, name))
		must(t, err)
		if u.Hostname() != "127.0.0.1" {
			t.Errorf("etcd's --%s is %s, not on loopback", name, u)
		}
		for _, scheme := range []string{"http", "https"} {
			target := scheme + "://" + u.Host + "/version"
			if err := getOK(ctx, noCertificateClient(), target); err == nil {
				t.Errorf("GET %s without a client certificate answered 200", target)
			}
		}
	}
	checkMode0600(t, apiServerArgs.flagValue(t, "etcd-keyfile"))
	checkMode0600(t, etcdArgs.flagValue(t, "key-file"))

	// kube-apiserver's own certificate reads what the old etcd wrote.
	authenticated := certificateClient(t, apiServerArgs.flagValue(t, "etcd-cafile"),
		apiServerArgs.flagValue(t, "etcd-certfile"), apiServerArgs.flagValue(t, "etcd-keyfile"))
	if got := etcdGet(ctx, t, authenticated, apiServerArgs.flagValue(t, "etcd-servers"), key); got != value {
		t.Errorf("etcd key %s after the restart with certificates: %q, want %q", key, got, value)
	}
}

// writeWithPlainEtcd runs etcd on dataDir as a plane before client
// certificates did (plain HTTP client and peer URLs), puts key=value and
// stops it.
func writeWithPlainEtcd(ctx context.Context, t *testing.T, assets, dataDir, key, value string) {
	t.Helper()
	ports, err := freePorts(2)
	must(t, err)
	clientURL := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcd, err := startChild("etcd", filepath.Join(assets, "etcd"), []string{
		"--data-dir=" + dataDir,
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=http://127.0.0.1:" + strconv.Itoa(ports[1]),
	}, nil, filepath.Join(t.TempDir(), "etcd.log"))
	must(t, err)
	defer func() { must(t, etcd.stop(controlPlaneStopGrace)) }()
	must(t, waitReady(ctx, etcd, http.DefaultClient, clientURL+"/health"))
	body, err := json.Marshal(map[string]string{
		"key": base64.StdEncoding.EncodeToString([]byte(key)), "value": base64.StdEncoding.EncodeToString([]byte(value)),
	})
	must(t, err)
	resp, err := http.Post(clientURL+"/v3/kv/put", "application/json", bytes.NewReader(body))
	must(t, err)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("putting %s into the plain etcd: %s", key, resp.Status)
	}
}

// etcdGet reads key through etcd's JSON gateway at servers (the first URL).
func etcdGet(ctx context.Context, t *testing.T, hc *http.Client, servers, key string) string {
	t.Helper()
	server, _, _ := strings.Cut(servers, ",")
	body, err := json.Marshal(map[string]string{"key": base64.StdEncoding.EncodeToString([]byte(key))})
	must(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, server+"/v3/kv/range", bytes.NewReader(body))
	must(t, err)
	resp, err := hc.Do(req)
	must(t, err)
	defer func() { _ = resp.Body.Close() }()
	var out struct {
		KVs []struct{ Value []byte } `json:"kvs"`
	}
	must(t, json.NewDecoder(resp.Body).Decode(&out))
	if resp.StatusCode != http.StatusOK || len(out.KVs) != 1 {
		t.Fatalf("range %s: %s, %d values", key, resp.Status, len(out.KVs))
	}
	return string(out.KVs[0].Value)
}

// noCertificateClient speaks TLS (trusting any server) or plain HTTP
// without a client certificate.
func noCertificateClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the refusal, not the server, is under test
	}}
}

// certificateClient trusts the authority in caFile and presents the
// certificate and key in certFile and keyFile.
func certificateClient(t *testing.T, caFile, certFile, keyFile string) *http.Client {
	t.Helper()
	caPEM, err := os.ReadFile(caFile)
	must(t, err)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("%s holds no certificate", caFile)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	must(t, err)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
	}}
}

// commandLine is a process's arguments.
type commandLine []string

// processArgs reads pid's arguments from /proc.
func processArgs(t *testing.T, pid int) commandLine {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	must(t, err)
	return strings.Split(string(bytes.TrimRight(data, "\x00")), "\x00")
}

// flagValue is the value of --name=value, failing the test without one.
func (c commandLine) flagValue(t *testing.T, name string) string {
	t.Helper()
	v, ok := process{args: c}.flag(name)
	if !ok {
		t.Fatalf("%s runs without --%s", c[0], name)
	}
	return v
}

func checkMode0600(t *testing.T, path string) {
	t.Helper()
	fi, err := os.Stat(path)
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
}

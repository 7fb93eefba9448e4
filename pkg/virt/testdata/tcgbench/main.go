// Command tcgbench measures, inside a guest, the kinds of work Kubernetes'
// Go binaries do (TLS handshakes, hashing, AEAD, JSON, copying), each for a
// fixed time, and prints one "name value unit" line per workload. Go's
// runtime and crypto choose code paths by CPUID, so the guest's CPU model
// decides which instructions TCG has to emulate (BenchmarkTCGGuestCPU).
package main

import (
	"bytes"
	"compress/gzip"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

func main() {
	duration := flag.Duration("d", 3*time.Second, "time per workload")
	flag.Parse()
	cert := selfSigned()
	payload := make([]byte, 1<<20)
	_, _ = rand.Read(payload)
	workloads := []struct {
		name, unit string
		per        float64 // units per op
		op         func()
	}{
		{"tls13-handshake-p256", "handshakes/s", 1, func() { handshake(cert) }},
		{"sha256-1MiB", "MB/s", 1, func() { sha256.Sum256(payload) }},
		{"aes128gcm-1MiB", "MB/s", 1, aesGCM(payload)},
		{"json-roundtrip", "ops/s", 1, jsonRoundTrip},
		{"gzip-1MiB", "MB/s", 1, func() { gz(payload) }},
		{"memmove-1MiB", "MB/s", 1, memmove(payload)},
	}
	for _, w := range workloads {
		n := 0
		start := time.Now()
		for time.Since(start) < *duration {
			w.op()
			n++
		}
		fmt.Printf("%s %.2f %s\n", w.name, w.per*float64(n)/time.Since(start).Seconds(), w.unit)
	}
}

func selfSigned() tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench"}, DNSNames: []string{"bench"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check(err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func handshake(cert tls.Certificate) {
	c, s := net.Pipe()
	pool := x509.NewCertPool()
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	pool.AddCert(leaf)
	done := make(chan error, 1)
	go func() {
		done <- tls.Server(s, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}).Handshake()
	}()
	check(tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "bench", MinVersion: tls.VersionTLS13}).Handshake())
	check(<-done)
	// Closing the pipe, not the TLS connections: their close_notify
	// writes would wait for a reader that never comes.
	c.Close()
	s.Close()
}

func aesGCM(payload []byte) func() {
	block, err := aes.NewCipher(make([]byte, 16))
	check(err)
	aead, err := cipher.NewGCM(block)
	check(err)
	nonce := make([]byte, aead.NonceSize())
	out := make([]byte, 0, len(payload)+aead.Overhead())
	return func() { aead.Seal(out[:0], nonce, payload, nil) }
}

type object struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Labels     map[string]string `json:"labels"`
	Containers []struct {
		Name  string   `json:"name"`
		Image string   `json:"image"`
		Args  []string `json:"args"`
	} `json:"containers"`
}

var document = []byte(`{"apiVersion":"v1","kind":"Pod","labels":{"app":"x","tier":"control-plane"},` +
	`"containers":[{"name":"kube-apiserver","image":"registry.k8s.io/kube-apiserver:v1.36.3",` +
	`"args":["--advertise-address=10.0.0.1","--allow-privileged=true","--authorization-mode=Node,RBAC"]}]}`)

func jsonRoundTrip() {
	var o object
	check(json.Unmarshal(document, &o))
	_, err := json.Marshal(&o)
	check(err)
}

func gz(payload []byte) {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	_, _ = w.Write(payload)
	check(w.Close())
}

func memmove(payload []byte) func() {
	dst := make([]byte, len(payload))
	return func() { copy(dst, payload) }
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

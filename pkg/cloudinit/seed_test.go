package cloudinit

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func validSeed() Seed {
	return Seed{
		InstanceID:    "0d5b5d3c-3c1e-4b6a-9d5e-6f1f3b8c2a10",
		LocalHostname: "cp-0",
		UserData:      []byte("#cloud-config\nruncmd: [kubeadm join --token abcdef.0123456789abcdef]\n"),
	}
}

func TestSeedValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Seed)
		wantErr string // substring; empty means valid
	}{
		{name: "valid label hostname", mutate: func(*Seed) {}},
		{name: "valid FQDN", mutate: func(s *Seed) { s.LocalHostname = "cp-0.cluster.example.com" }},
		{name: "valid 63-character label", mutate: func(s *Seed) { s.LocalHostname = strings.Repeat("a", 63) }},
		{name: "empty user-data is allowed", mutate: func(s *Seed) { s.UserData = nil }},
		{name: "missing instance-id", mutate: func(s *Seed) { s.InstanceID = "" }, wantErr: "instance-id is empty"},
		{name: "instance-id with newline", mutate: func(s *Seed) { s.InstanceID = "a\nlocal-hostname: evil" }, wantErr: "instance-id"},
		{name: "instance-id with slash", mutate: func(s *Seed) { s.InstanceID = "../etc" }, wantErr: "instance-id"},
		{name: "missing hostname", mutate: func(s *Seed) { s.LocalHostname = "" }, wantErr: "local-hostname is empty"},
		{name: "upper-case hostname", mutate: func(s *Seed) { s.LocalHostname = "CP-0" }, wantErr: "not a valid DNS name"},
		{name: "hostname with underscore", mutate: func(s *Seed) { s.LocalHostname = "cp_0" }, wantErr: "not a valid DNS name"},
		{name: "hostname starting with hyphen", mutate: func(s *Seed) { s.LocalHostname = "-cp" }, wantErr: "not a valid DNS name"},
		{name: "hostname with empty label", mutate: func(s *Seed) { s.LocalHostname = "cp..example" }, wantErr: "not a valid DNS name"},
		{name: "hostname label too long", mutate: func(s *Seed) { s.LocalHostname = strings.Repeat("a", 64) + ".example" }, wantErr: "longer than 63"},
		{name: "hostname too long", mutate: func(s *Seed) { s.LocalHostname = strings.Repeat(strings.Repeat("a", 60)+".", 5) + "com" }, wantErr: "not a valid DNS name"},
		{name: "both invalid reports both", mutate: func(s *Seed) { s.InstanceID, s.LocalHostname = "", "" }, wantErr: "instance-id is empty\nlocal-hostname is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := validSeed()
			tt.mutate(&s)
			err := s.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestMetaData(t *testing.T) {
	tests := []struct {
		name       string
		instanceID string
		hostname   string
	}{
		{name: "uuid", instanceID: "0d5b5d3c-3c1e-4b6a-9d5e-6f1f3b8c2a10", hostname: "cp-0"},
		// YAML 1.1, which cloud-init's PyYAML speaks, reads these unquoted as a bool and numbers.
		{name: "yaml 1.1 boolean", instanceID: "on", hostname: "yes"},
		{name: "integer", instanceID: "12345", hostname: "123"},
		{name: "float", instanceID: "1e3", hostname: "cp-0.example"},
		{name: "yaml indicators", instanceID: "#x:&y*z!{}[]'\"", hostname: "cp-0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Seed{InstanceID: tt.instanceID, LocalHostname: tt.hostname}
			doc, err := s.MetaData()
			if err != nil {
				t.Fatalf("MetaData() error = %v", err)
			}
			// Decoding into any, not into strings, catches a value that YAML would retype.
			var got map[string]any
			if err := yaml.Unmarshal(doc, &got); err != nil {
				t.Fatalf("meta-data is not YAML: %v\n%s", err, doc)
			}
			want := map[string]any{"instance-id": tt.instanceID, "local-hostname": tt.hostname}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("meta-data decodes to %#v, want %#v\n%s", got, want, doc)
			}
		})
	}
}

func TestMetaDataRejectsInvalidSeed(t *testing.T) {
	if _, err := (Seed{LocalHostname: "cp-0"}).MetaData(); err == nil {
		t.Fatal("MetaData() without instance-id succeeded")
	}
}

func TestSeedRedactsSecrets(t *testing.T) {
	const secret = "abcdef.0123456789abcdef"
	s := Seed{
		InstanceID:    "iid",
		LocalHostname: "cp-0",
		UserData:      []byte("token: " + secret),
		NetworkConfig: []byte("password: " + secret),
		VendorData:    []byte("#!/bin/sh\necho " + secret),
	}
	logged, err := json.Marshal(s.MarshalLog())
	if err != nil {
		t.Fatal(err)
	}
	outputs := map[string]string{
		"%v":         fmt.Sprintf("%v", s),
		"%+v":        fmt.Sprintf("%+v", s),
		"%#v":        fmt.Sprintf("%#v", s),
		"%s":         fmt.Sprintf("%s", s),
		"pointer %v": fmt.Sprintf("%v", &s),
		"MarshalLog": string(logged),
	}
	for format, out := range outputs {
		if strings.Contains(out, secret) {
			t.Errorf("%s leaks the secret: %s", format, out)
		}
		if !strings.Contains(out, "cp-0") {
			t.Errorf("%s omits the hostname: %s", format, out)
		}
	}
}

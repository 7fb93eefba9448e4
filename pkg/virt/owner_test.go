package virt

import (
	"reflect"
	"testing"
)

func TestOwnerMetadataGolden(t *testing.T) {
	doc, err := baseSpec().Owner.MetadataXML()
	if err != nil {
		t.Fatal(err)
	}
	assertGolden(t, "owner.xml", doc+"\n")
}

func TestParseOwner(t *testing.T) {
	owner := baseSpec().Owner
	ours, err := owner.MetadataXML()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		metadata string
		want     *Owner
		notFound bool
	}{
		{"ours alone", ours, &owner, false},
		{"as libvirt returns it with a prefix", `<capl:owner xmlns:capl="` + OwnerNamespace + `"><capl:kind>LibvirtMachine</capl:kind><capl:namespace>default</capl:namespace><capl:name>worker-0</capl:name><capl:uid>0b5c8f0e-1111-2222-3333-444455556666</capl:uid><capl:cluster>demo</capl:cluster></capl:owner>`, &owner, false},
		{"among other tools' metadata", `<other:x xmlns:other="urn:other"><other:owner>no</other:owner></other:x>` + ours, &owner, false},
		{"someone else's owner element", `<owner xmlns="urn:not-ours"><name>x</name></owner>`, nil, true},
		{"empty", "", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseOwner(tt.metadata)
			if tt.notFound {
				if !IsNotFound(err) {
					t.Fatalf("want not found, got %v, %v", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if _, err := ParseOwner("<unclosed"); err == nil || IsNotFound(err) {
		t.Errorf("malformed XML: want a parse error, got %v", err)
	}
}

func TestParseOwnerElement(t *testing.T) {
	// What virDomainGetMetadata returns: our element, namespace stripped.
	got, err := parseOwnerElement("<owner>\n  <kind>K</kind>\n  <namespace>n</namespace>\n  <name>x</name>\n  <uid>u</uid>\n  <cluster>c</cluster>\n</owner>")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Owner{Kind: "K", Namespace: "n", Name: "x", UID: "u", Cluster: "c"}); *got != want {
		t.Errorf("got %+v, want %+v", *got, want)
	}
	if _, err := parseOwnerElement("<other/>"); !IsNotFound(err) {
		t.Errorf("other element: want not found, got %v", err)
	}
}

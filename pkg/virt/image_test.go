package virt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestCheckedSource(t *testing.T) {
	endless := io.MultiReader(strings.NewReader("raw "), zeroReader{})
	r, err := checkedSource(endless, -1, ImageImport{Source: "http://x/img", Policy: SourcePolicy{MaxBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, r)
	if !errors.Is(err, ErrImageTooLarge) || n > 1<<20+1 {
		t.Fatalf("read %d bytes, error %v: want ErrImageTooLarge at the bound", n, err)
	}
	r, err = checkedSource(strings.NewReader("exactly these bytes"), -1, ImageImport{Policy: SourcePolicy{MaxBytes: 19}})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(r); err != nil || string(b) != "exactly these bytes" {
		t.Fatalf("read %q, %v", b, err)
	}
	if _, err := checkedSource(strings.NewReader("x"), 20, ImageImport{Policy: SourcePolicy{MaxBytes: 19}}); !errors.Is(err, ErrImageTooLarge) {
		t.Fatalf("announced length over the bound: %v", err)
	}
	// A qcow2 v2 header naming a backing file at offset 512 (the cases of
	// the header itself are diskimage's).
	backed := make([]byte, 1024)
	binary.BigEndian.PutUint32(backed, 0x514649fb)
	binary.BigEndian.PutUint32(backed[4:], 2)
	binary.BigEndian.PutUint64(backed[8:], 512)
	if _, err := checkedSource(bytes.NewReader(backed), -1, ImageImport{}); !errors.Is(err, ErrImageHasBackingFile) {
		t.Fatalf("qcow2 with a backing file: %v", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

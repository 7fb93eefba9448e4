package virt

import "fmt"

// use runs fn on a freshly looked-up libvirt object and frees it after;
// a lookup error is returned naming what was looked up.
func use[P interface{ Free() error }](obj P, err error, what string, fn func(P) error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer obj.Free()
	return fn(obj)
}

// decodeXML parses the XML description a libvirt getter returned into a
// libvirtxml document.
func decodeXML[T any, P interface {
	*T
	Unmarshal(string) error
}](doc string, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	v := P(new(T))
	if err := v.Unmarshal(doc); err != nil {
		return nil, err
	}
	return v, nil
}

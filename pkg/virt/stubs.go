package virt

import (
	"context"
	"errors"
	"os"
)

// errNotImplemented marks methods still being written.
var errNotImplemented = errors.New("virt: not implemented yet")

// GuestExec is being implemented.
func (c *Client) GuestExec(ctx context.Context, domain, path string, args []string, stdin []byte) (ExecResult, error) {
	return ExecResult{}, errNotImplemented
}

// GuestReadFile is being implemented.
func (c *Client) GuestReadFile(ctx context.Context, domain, path string) ([]byte, error) {
	return nil, errNotImplemented
}

// GuestWriteFile is being implemented.
func (c *Client) GuestWriteFile(ctx context.Context, domain, path string, data []byte, mode os.FileMode) error {
	return errNotImplemented
}

// GuestInterfaces is being implemented.
func (c *Client) GuestInterfaces(ctx context.Context, domain string) ([]GuestInterface, error) {
	return nil, errNotImplemented
}


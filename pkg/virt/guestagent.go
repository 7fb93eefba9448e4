package virt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// ExecResult is the outcome of a command run through the guest agent.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// GuestInterface is one network interface as the guest agent reports it.
type GuestInterface struct {
	Name string
	MAC  netalloc.MAC
	// Addresses are the interface's addresses with their prefix lengths.
	Addresses []netip.Prefix
}

// Guest-agent limits. Each agent command waits at most agentTimeout in
// libvirt; GuestExec polls the process until ctx ends or maxExecWait.
const (
	agentTimeout  = 10 // seconds, per agent command
	maxExecWait   = 10 * time.Minute
	fileChunk     = 64 << 10 // bytes per guest-file-read/-write: larger writes time out under TCG
	maxGuestFile  = 16 << 20 // GuestReadFile refuses larger files
	execPollFirst = 50 * time.Millisecond
	execPollMax   = time.Second
)

// agentRequest is one QEMU guest agent command.
type agentRequest struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
}

type execArgs struct {
	Path          string   `json:"path"`
	Arg           []string `json:"arg,omitempty"`
	InputData     []byte   `json:"input-data,omitempty"` // encoding/json base64-encodes []byte, as the agent expects
	CaptureOutput bool     `json:"capture-output"`
}

type execStarted struct {
	PID int `json:"pid"`
}

type pidArgs struct {
	PID int `json:"pid"`
}

type execStatus struct {
	Exited   bool   `json:"exited"`
	ExitCode *int   `json:"exitcode"`
	Signal   *int   `json:"signal"`
	OutData  []byte `json:"out-data"`
	ErrData  []byte `json:"err-data"`
}

type fileOpenArgs struct {
	Path string `json:"path"`
	Mode string `json:"mode"`
}

type handleArgs struct {
	Handle int `json:"handle"`
}

type fileReadArgs struct {
	Handle int `json:"handle"`
	Count  int `json:"count"`
}

type fileReadResult struct {
	Count int    `json:"count"`
	Buf   []byte `json:"buf-b64"`
	EOF   bool   `json:"eof"`
}

type fileWriteArgs struct {
	Handle int    `json:"handle"`
	Buf    []byte `json:"buf-b64"`
}

// result maps a finished guest-exec-status to an ExecResult. A process
// killed by a signal reports 128+signal, as a shell would.
func (s execStatus) result() ExecResult {
	r := ExecResult{Stdout: s.OutData, Stderr: s.ErrData}
	switch {
	case s.ExitCode != nil:
		r.ExitCode = *s.ExitCode
	case s.Signal != nil:
		r.ExitCode = 128 + *s.Signal
	}
	return r
}

// agentCommand runs one guest-agent command and decodes its "return"
// value into result (when not nil); op names the Host method it serves.
func (c *Client) agentCommand(ctx context.Context, op, domain string, req agentRequest, result any) error {
	cmd, err := json.Marshal(req)
	if err != nil {
		return err
	}
	var reply string
	err = c.withConn(ctx, op, func(conn *libvirt.Connect) error {
		return withDomain(conn, domain, func(dom *libvirt.Domain) error {
			var err error
			reply, err = dom.QemuAgentCommand(string(cmd), agentTimeout, 0)
			return err
		})
	})
	if err != nil {
		return classifyAgentError(domain, req.Execute, err)
	}
	if result == nil {
		return nil
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal([]byte(reply), &resp); err != nil {
		return fmt.Errorf("guest agent %s on %s: decoding reply: %w", req.Execute, domain, err)
	}
	if err := json.Unmarshal(resp.Return, result); err != nil {
		return fmt.Errorf("guest agent %s on %s: decoding reply: %w", req.Execute, domain, err)
	}
	return nil
}

// classifyAgentError turns libvirt's agent failures into ErrAgentUnavailable
// (agent not connected, not answering, domain not running) or ErrNotFound
// (the guest says the file does not exist), keeping libvirt's error.
func classifyAgentError(domain, cmd string, err error) error {
	if IsNotFound(err) {
		return err // the domain itself is gone
	}
	var lerr libvirt.Error
	if !errors.As(err, &lerr) {
		return err
	}
	switch {
	case lerr.Code == libvirt.ERR_AGENT_UNRESPONSIVE, lerr.Code == libvirt.ERR_AGENT_COMMAND_TIMEOUT,
		lerr.Code == libvirt.ERR_OPERATION_INVALID && strings.Contains(lerr.Message, "not running"),
		strings.Contains(lerr.Message, "guest agent is not connected"),
		strings.Contains(lerr.Message, "Guest agent is not responding"):
		return fmt.Errorf("%w: %s on %s: %w", ErrAgentUnavailable, cmd, domain, err)
	case strings.Contains(lerr.Message, "No such file or directory"):
		return fmt.Errorf("guest %s: %s: %w: %w", domain, cmd, ErrNotFound, err)
	}
	return fmt.Errorf("guest agent %s on %s: %w", cmd, domain, err)
}

// GuestExec runs path with args in the guest through the guest agent,
// feeding stdin, and waits for it to exit (until ctx ends, at most
// maxExecWait). Output is captured. If the libvirt connection drops at the
// moment the command is submitted, the retry may run it twice: pass
// idempotent commands.
func (c *Client) GuestExec(ctx context.Context, domain, path string, args []string, stdin []byte) (ExecResult, error) {
	ctx, cancel := context.WithTimeout(ctx, maxExecWait)
	defer cancel()
	var started execStarted
	req := agentRequest{Execute: "guest-exec", Arguments: execArgs{Path: path, Arg: args, InputData: stdin, CaptureOutput: true}}
	if err := c.agentCommand(ctx, "GuestExec", domain, req, &started); err != nil {
		return ExecResult{}, err
	}
	delay := execPollFirst
	for {
		var st execStatus
		if err := c.agentCommand(ctx, "GuestExec", domain, agentRequest{Execute: "guest-exec-status", Arguments: pidArgs{PID: started.PID}}, &st); err != nil {
			return ExecResult{}, err
		}
		if st.Exited {
			return st.result(), nil
		}
		select {
		case <-ctx.Done():
			return ExecResult{}, fmt.Errorf("waiting for %s in %s: %w", path, domain, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, execPollMax)
	}
}

// GuestReadFile reads a whole guest file through the guest agent; a
// missing file yields an error for which IsNotFound is true.
func (c *Client) GuestReadFile(ctx context.Context, domain, path string) ([]byte, error) {
	var h int
	if err := c.agentCommand(ctx, "GuestReadFile", domain, agentRequest{Execute: "guest-file-open", Arguments: fileOpenArgs{Path: path, Mode: "r"}}, &h); err != nil {
		return nil, err
	}
	defer c.closeGuestFile("GuestReadFile", domain, h)
	var out []byte
	for {
		var r fileReadResult
		if err := c.agentCommand(ctx, "GuestReadFile", domain, agentRequest{Execute: "guest-file-read", Arguments: fileReadArgs{Handle: h, Count: fileChunk}}, &r); err != nil {
			return nil, err
		}
		out = append(out, r.Buf...)
		if len(out) > maxGuestFile {
			return nil, fmt.Errorf("guest file %s in %s exceeds %d bytes", path, domain, maxGuestFile)
		}
		if r.EOF || r.Count == 0 {
			return out, nil
		}
	}
}

// closeGuestFile releases an agent file handle even when ctx has ended:
// the agent only has a few handles.
func (c *Client) closeGuestFile(op, domain string, h int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*agentTimeout*time.Second)
	defer cancel()
	_ = c.agentCommand(ctx, op, domain, agentRequest{Execute: "guest-file-close", Arguments: handleArgs{Handle: h}}, nil)
}

// GuestWriteFile replaces a guest file atomically: the data goes to a
// temporary file next to it, which gets the mode and is then renamed over
// path, so a reader (e.g. an HAProxy reload) never sees half a file. The
// agent has no chmod or rename, so those run through GuestExec.
func (c *Client) GuestWriteFile(ctx context.Context, domain, path string, data []byte, mode os.FileMode) error {
	tmp := path + ".capl-tmp"
	if err := c.writeGuestFile(ctx, domain, tmp, data); err != nil {
		return err
	}
	steps := [][]string{
		{"chmod", fmt.Sprintf("%04o", mode.Perm()), tmp},
		{"mv", "-f", tmp, path},
	}
	for _, s := range steps {
		res, err := c.GuestExec(ctx, domain, s[0], s[1:], nil)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit code %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
		}
		if err != nil {
			return fmt.Errorf("writing %s in %s: %s: %w", path, domain, s[0], err)
		}
	}
	return nil
}

func (c *Client) writeGuestFile(ctx context.Context, domain, path string, data []byte) error {
	var h int
	if err := c.agentCommand(ctx, "GuestWriteFile", domain, agentRequest{Execute: "guest-file-open", Arguments: fileOpenArgs{Path: path, Mode: "w"}}, &h); err != nil {
		return err
	}
	defer c.closeGuestFile("GuestWriteFile", domain, h)
	for off := 0; off < len(data); off += fileChunk {
		chunk := data[off:min(off+fileChunk, len(data))]
		var res struct {
			Count int `json:"count"`
		}
		if err := c.agentCommand(ctx, "GuestWriteFile", domain, agentRequest{Execute: "guest-file-write", Arguments: fileWriteArgs{Handle: h, Buf: chunk}}, &res); err != nil {
			return err
		}
		if res.Count != len(chunk) {
			return fmt.Errorf("guest file %s in %s: short write (%d of %d bytes)", path, domain, res.Count, len(chunk))
		}
	}
	return nil
}

// GuestInterfaces lists the guest's interfaces with their addresses as the
// guest agent reports them (guest-network-get-interfaces, through
// libvirt's typed API). Loopback is included; callers filter.
func (c *Client) GuestInterfaces(ctx context.Context, domain string) ([]GuestInterface, error) {
	var ifaces []libvirt.DomainInterface
	err := c.withConn(ctx, "GuestInterfaces", func(conn *libvirt.Connect) error {
		return withDomain(conn, domain, func(dom *libvirt.Domain) error {
			var err error
			ifaces, err = dom.ListAllInterfaceAddresses(libvirt.DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
			return err
		})
	})
	if err != nil {
		return nil, classifyAgentError(domain, "guest-network-get-interfaces", err)
	}
	return guestInterfaces(ifaces), nil
}

// guestInterfaces converts libvirt's interface list, dropping addresses
// that do not parse.
func guestInterfaces(in []libvirt.DomainInterface) []GuestInterface {
	out := make([]GuestInterface, 0, len(in))
	for _, i := range in {
		gi := GuestInterface{Name: i.Name, MAC: netalloc.CanonicalMAC(i.Hwaddr)}
		for _, a := range i.Addrs {
			ip, err := netip.ParseAddr(a.Addr)
			if err != nil || int(a.Prefix) > ip.BitLen() {
				continue
			}
			gi.Addresses = append(gi.Addresses, netip.PrefixFrom(ip.WithZone(""), int(a.Prefix)))
		}
		out = append(out, gi)
	}
	return out
}

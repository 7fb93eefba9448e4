package plane

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// tcpListenState is the st column of a listening socket in /proc/net/tcp.
const tcpListenState = "0A"

// parseProcNetTCP returns the listening sockets of a /proc/net/tcp or
// /proc/net/tcp6 table by inode, so that they can be matched with the
// socket:[inode] links of a process's file descriptors.
func parseProcNetTCP(table string) (map[uint64]netip.AddrPort, error) {
	out := map[uint64]netip.AddrPort{}
	for i, line := range strings.Split(strings.TrimSpace(table), "\n") {
		fields := strings.Fields(line)
		if i == 0 || len(fields) < 10 || fields[3] != tcpListenState {
			continue
		}
		addr, err := parseProcNetAddress(fields[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		inode, err := strconv.ParseUint(fields[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: inode: %w", i+1, err)
		}
		out[inode] = addr
	}
	return out, nil
}

// parseProcNetAddress reads ADDR:PORT of /proc/net/tcp{,6}: the address
// is hex of 32-bit words in the host's (little-endian) byte order, the
// port hex of the number.
func parseProcNetAddress(s string) (netip.AddrPort, error) {
	hexAddr, hexPort, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q: no port", s)
	}
	raw, err := hex.DecodeString(hexAddr)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q: %v", s, err)
	}
	for w := 0; w < len(raw); w += 4 {
		raw[w], raw[w+1], raw[w+2], raw[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: port: %w", s, err)
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}

// listeningAddresses are the TCP addresses pid listens on.
func listeningAddresses(pid int) ([]netip.AddrPort, error) {
	all := map[uint64]netip.AddrPort{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			return nil, err
		}
		l, err := parseProcNetTCP(string(data))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", table, err)
		}
		for inode, a := range l {
			all[inode] = a
		}
	}
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	var out []netip.AddrPort
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if err != nil {
			continue // closed since the listing
		}
		inode, ok := strings.CutPrefix(target, "socket:[")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(inode, "]"), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q", fdDir, target)
		}
		if a, ok := all[n]; ok {
			out = append(out, a)
		}
	}
	return out, nil
}

func TestParseProcNetTCP(t *testing.T) {
	const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	for _, tc := range []struct {
		name, table string
		want        map[uint64]netip.AddrPort
	}{
		{"loopback IPv4", header + "   0: 0100007F:0CEA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4711 1 0000000000000000 100 0 0 10 0",
			map[uint64]netip.AddrPort{4711: netip.MustParseAddrPort("127.0.0.1:3306")}},
		{"any IPv4 and an established socket", header +
			"   0: 00000000:24FB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 10 1 0 100 0 0 10 0\n" +
			"   1: 0100007F:24FB 0100007F:D1E2 01 00000000:00000000 00:00000000 00000000     0        0 11 1 0 100 0 0 10 0",
			map[uint64]netip.AddrPort{10: netip.MustParseAddrPort("0.0.0.0:9467")}},
		{"any and loopback IPv6", header +
			"   0: 00000000000000000000000000000000:24FB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 20 1 0 100 0 0 10 0\n" +
			"   1: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 21 1 0 100 0 0 10 0",
			map[uint64]netip.AddrPort{20: netip.MustParseAddrPort("[::]:9467"), 21: netip.MustParseAddrPort("[::1]:80")}},
		{"IPv4-mapped IPv6", header +
			"   0: 0000000000000000FFFF00000100007F:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 30 1 0 100 0 0 10 0",
			map[uint64]netip.AddrPort{30: netip.MustParseAddrPort("127.0.0.1:80")}},
		{"a private address", header + "   0: 0A7AA8C0:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 40 1 0 100 0 0 10 0",
			map[uint64]netip.AddrPort{40: netip.MustParseAddrPort("192.168.122.10:8080")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcNetTCP(tc.table)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

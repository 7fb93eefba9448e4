package imageimport

import (
	"fmt"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Defaults of Options, also the manager flags' defaults.
const (
	DefaultConnectTimeout = 30 * time.Second
	DefaultHeaderTimeout  = time.Minute
	DefaultIdleTimeout    = 2 * time.Minute
	DefaultDeadline       = 2 * time.Hour
	DefaultMinBackoff     = 10 * time.Second
	DefaultMaxBackoff     = 10 * time.Minute
	DefaultGCAfter        = 24 * time.Hour
	DefaultGCInterval     = 10 * time.Minute
)

// DefaultDenyCIDRs are the addresses downloads never reach unless the
// operator says otherwise: the manager's own host (loopback) and
// link-local (cloud metadata services). Private ranges stay reachable:
// homelab image servers live there.
var DefaultDenyCIDRs = []string{"127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "::/128"}

// Options bound the imports.
type Options struct {
	// Fetch bounds the phases of a download.
	Fetch virt.FetchLimits
	// Sources is what image sources may reach and how long they may be.
	Sources virt.SourcePolicy
	// Deadline bounds one attempt of an import, download and upload.
	Deadline time.Duration
	// MinBackoff and MaxBackoff space the attempts after failures: the
	// wait doubles from MinBackoff up to MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// GCAfter is how long an imported image no volume is backed by and no
	// reconcile asked for stays in its pool; zero keeps images forever.
	// GCInterval is how often the pools are checked; zero picks
	// min(GCAfter/2, DefaultGCInterval).
	GCAfter, GCInterval time.Duration
}

// withDefaults fills in the zero fields: an import is never unbounded.
func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.Fetch.ConnectTimeout, DefaultConnectTimeout)
	def(&o.Fetch.HeaderTimeout, DefaultHeaderTimeout)
	def(&o.Fetch.IdleTimeout, DefaultIdleTimeout)
	def(&o.Deadline, DefaultDeadline)
	def(&o.MinBackoff, DefaultMinBackoff)
	def(&o.MaxBackoff, DefaultMaxBackoff)
	if o.GCAfter > 0 && o.GCInterval <= 0 {
		o.GCInterval = min(o.GCAfter/2, DefaultGCInterval)
	}
	return o
}

// Backoff is the wait after the n-th consecutive failure (n ≥ 1).
func (o Options) Backoff(n int) time.Duration {
	d := o.MinBackoff
	for i := 1; i < n && d < o.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, o.MaxBackoff)
}

// Key identifies an import: one image into one pool for one disk size.
// A source refused for its size or content is not fetched again until
// one of these changes.
type Key struct {
	// Host is the libvirt host whose pool the image goes to; nil means the
	// Importer's own. Hosts compare by identity: one connection per host.
	Host                         virt.StorageHost
	Pool, Volume, Source, SHA256 string
	// DiskBytes is the size of the disk the image becomes, zero for the
	// image's own (virt.ImageImport.DiskBytes).
	DiskBytes uint64
}

// Waiter is an object whose reconcile waits for an import; Source
// triggers its reconcile when the import ends.
type Waiter struct {
	Kind, Namespace, Name string
}

// Phase is where an import stands.
type Phase string

// The phases of an import.
const (
	Running Phase = "Running"
	Done    Phase = "Done"
	Failed  Phase = "Failed"
	// Refused is a failure for what the source is (its size or format):
	// it is not fetched again while the Key stays the same.
	Refused Phase = "Refused"
)

// Status is an import's state as Ensure reports it.
type Status struct {
	Phase Phase
	// Read and Total are the bytes read from the source so far and its
	// length (zero until the source answered); Elapsed is the attempt's age.
	Read, Total int64
	Elapsed     time.Duration
	// Attempt counts the attempts, the running or last one included.
	Attempt int
	// Err is the last attempt's failure (Failed and Refused); RetryAt is
	// when the next attempt may start (Failed only).
	Err     error
	RetryAt time.Time
	// Volume is the imported image (Done only).
	Volume virt.VolumeInfo
}

// Progress describes a running import: "12.0 MiB of 150.0 MiB (8%),
// 2.0 MiB/s", or what it waits for before the source answered.
func (s Status) Progress() string {
	if s.Total == 0 && s.Read == 0 {
		return fmt.Sprintf("waiting for the source to answer (%s so far)", s.Elapsed.Round(time.Second))
	}
	// A server that sent no length leaves Total zero.
	text := bytesIEC(float64(s.Read)) + " so far"
	if s.Total > 0 {
		text = fmt.Sprintf("%s of %s (%d%%)", bytesIEC(float64(s.Read)), bytesIEC(float64(s.Total)), s.Read*100/s.Total)
	}
	if secs := s.Elapsed.Seconds(); secs >= 1 {
		text += fmt.Sprintf(", %s/s", bytesIEC(float64(s.Read)/secs))
	}
	return text
}

// bytesIEC formats n bytes with a binary unit.
func bytesIEC(n float64) string {
	if n < 1024 {
		return fmt.Sprintf("%.0f B", n)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	i := -1
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// Package imageimport runs the imports of base images into storage pools
// outside the reconciles that need them: one import per image and pool,
// shared by every object waiting for it, bounded by timeouts, cancelled
// when nobody waits any more and retried with backoff after a failure.
// Reconciles ask for an import's status (Ensure) without ever blocking on
// the network, and are triggered again through Source when it ends.
package imageimport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/metrics"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Importer runs the imports; it is a manager Runnable (Start cancels every
// import when the manager stops).
type Importer struct {
	host virt.StorageHost
	opts Options
	now  func() time.Time

	// ctx outlives reconciles (imports do); it ends with Start's.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	jobs    map[Key]*job
	sources map[string]chan event.GenericEvent // kind → reconcile triggers
	// wanted is when a reconcile last asked for each image, and hosts
	// every host asked about: what the image collector spares and where
	// it looks.
	wanted map[imageRef]time.Time
	hosts  map[virt.StorageHost]struct{}
	// gcPools, when set, limits the collector to the pools it accepts
	// (tests share their libvirtd with others).
	gcPools func(pool string) bool
}

// job is one image's import and those waiting for it.
type job struct {
	key     Key
	waiters map[Waiter]struct{}
	status  Status
	// attempt is the running attempt; nil when none runs.
	attempt  *attempt
	failures int
}

// attempt is one run of ImportImage.
type attempt struct {
	started     time.Time
	cancel      context.CancelFunc
	read, total atomic.Int64
}

// New returns an Importer into host's pools.
func New(host virt.StorageHost, opts Options) *Importer {
	ctx, cancel := context.WithCancel(context.Background())
	return &Importer{
		host: host, opts: opts.withDefaults(), now: time.Now, ctx: ctx, cancel: cancel,
		jobs: map[Key]*job{}, sources: map[string]chan event.GenericEvent{},
		wanted: map[imageRef]time.Time{}, hosts: map[virt.StorageHost]struct{}{host: {}},
	}
}

// Source is the controller-runtime source of reconcile requests for the
// waiters of kind kind: each gets one when its import ends. Call it before
// the manager starts.
func (im *Importer) Source(kind string) source.Source {
	im.mu.Lock()
	defer im.mu.Unlock()
	ch, ok := im.sources[kind]
	if !ok {
		ch = make(chan event.GenericEvent, 1024)
		im.sources[kind] = ch
	}
	return source.Channel(ch, &handler.EnqueueRequestForObject{})
}

// Start waits for ctx to end, then cancels the imports and waits for them
// to clean up.
func (im *Importer) Start(ctx context.Context) error {
	<-ctx.Done()
	im.cancel()
	im.wg.Wait()
	return nil
}

// NeedLeaderElection is false: only reconciles start imports, and the
// imports of a replica that stops must end with it.
func (im *Importer) NeedLeaderElection() bool { return false }

// Ensure registers w as waiting for key's import, and for no other (an
// object waits for one image: a changed spec leaves the old import), starts
// the import unless it runs, is done, was refused, or waits out its
// backoff, and returns its status. It never blocks on libvirt or the
// network.
func (im *Importer) Ensure(key Key, w Waiter) Status {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.releaseLocked(w, key)
	host := im.hostOf(key)
	im.hosts[host] = struct{}{}
	im.wanted[imageRef{host: host, pool: key.Pool, volume: key.Volume}] = im.now()
	j, ok := im.jobs[key]
	if !ok {
		j = &job{key: key, waiters: map[Waiter]struct{}{}}
		im.jobs[key] = j
	}
	j.waiters[w] = struct{}{}
	switch {
	case j.status.Phase == Done, j.status.Phase == Refused:
	case j.status.Phase == Failed && im.now().Before(j.status.RetryAt):
	case j.attempt == nil:
		im.startLocked(j)
	}
	st := j.status
	if a := j.attempt; a != nil {
		st.Read, st.Total, st.Elapsed = a.read.Load(), a.total.Load(), im.now().Sub(a.started)
	}
	return st
}

// Want records that a reconcile uses the image volume pool/volume of host
// (nil: the Importer's own) as a base it names itself (spec.image.volume):
// the collector spares it for GCAfter, as it spares the images reconciles
// import, though no import asked for it.
func (im *Importer) Want(host virt.StorageHost, pool, volume string) {
	im.mu.Lock()
	defer im.mu.Unlock()
	if host == nil {
		host = im.host
	}
	im.hosts[host] = struct{}{}
	im.wanted[imageRef{host: host, pool: pool, volume: volume}] = im.now()
}

// Release ends w's wait on every import: an import nobody waits for any
// more is cancelled, and the volume it was writing removed.
func (im *Importer) Release(w Waiter) {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.releaseLocked(w, Key{})
}

// releaseLocked ends w's wait on every import but keep's.
func (im *Importer) releaseLocked(w Waiter, keep Key) {
	for key, j := range im.jobs {
		if _, ok := j.waiters[w]; !ok || key == keep {
			continue
		}
		delete(j.waiters, w)
		if len(j.waiters) > 0 {
			continue
		}
		if j.attempt != nil {
			j.attempt.cancel()
			j.attempt = nil
		}
		delete(im.jobs, key)
	}
}

func (im *Importer) startLocked(j *job) {
	ctx, cancel := context.WithTimeout(im.ctx, im.opts.Deadline)
	a := &attempt{started: im.now(), cancel: cancel}
	j.attempt = a
	j.status = Status{Phase: Running, Attempt: j.status.Attempt + 1}
	im.wg.Add(1)
	go func() {
		defer im.wg.Done()
		defer cancel()
		im.run(ctx, j, a)
	}()
}

// run is one attempt; it records the outcome and triggers the waiters'
// reconciles, unless the attempt was cancelled meanwhile.
func (im *Importer) run(ctx context.Context, j *job, a *attempt) {
	log := ctrl.Log.WithName("imageimport").WithValues("source", virt.RedactURL(j.key.Source), "pool", j.key.Pool, "volume", j.key.Volume)
	log.Info("Importing image")
	host := im.hostOf(j.key)
	info, err := host.ImportImage(ctx, virt.ImageImport{
		Pool: j.key.Pool, Volume: j.key.Volume, Source: j.key.Source, SHA256: j.key.SHA256,
		DiskBytes: j.key.DiskBytes,
		Fetch:     im.opts.Fetch,
		Policy:    im.opts.Sources,
		Progress:  a.progress,
	})
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		err = fmt.Errorf("import did not finish within %s: %w", im.opts.Deadline, err)
	}
	im.mu.Lock()
	if j.attempt != a {
		im.mu.Unlock()
		observeAttempt(metrics.ImportCancelled, im.now().Sub(a.started), nil)
		log.Info("Image import cancelled: nothing waits for it", "err", fmt.Sprint(err))
		return
	}
	j.attempt = nil
	observeAttempt(result(err), im.now().Sub(a.started), err)
	if err == nil {
		j.failures = 0
		j.status = Status{Phase: Done, Attempt: j.status.Attempt, Read: a.read.Load(), Total: a.total.Load(),
			Elapsed: im.now().Sub(a.started), Volume: info}
		log.Info("Image imported", "took", j.status.Elapsed.Round(time.Millisecond).String())
	} else if refused(err) {
		j.status = Status{Phase: Refused, Attempt: j.status.Attempt, Read: a.read.Load(), Total: a.total.Load(),
			Elapsed: im.now().Sub(a.started), Err: err}
		log.Info("Image refused: not fetched again until the image or disk size changes", "err", err.Error())
	} else {
		j.failures++
		wait := im.opts.Backoff(j.failures)
		j.status = Status{Phase: Failed, Attempt: j.status.Attempt, Read: a.read.Load(), Total: a.total.Load(),
			Elapsed: im.now().Sub(a.started), Err: err, RetryAt: im.now().Add(wait)}
		log.Info("Image import failed", "err", err.Error(), "retryIn", wait.String())
		logChecksum(log, err)
	}
	waiters := make([]Waiter, 0, len(j.waiters))
	for w := range j.waiters {
		waiters = append(waiters, w)
	}
	im.mu.Unlock()
	for _, w := range waiters {
		im.notify(w)
	}
}

// result is an attempt's result for capl_image_import_duration_seconds.
func result(err error) string {
	switch {
	case err == nil:
		return metrics.ImportImported
	case refused(err):
		return metrics.ImportRefused
	default:
		return metrics.ImportFailed
	}
}

// hostOf is the host key's image goes to.
func (im *Importer) hostOf(key Key) virt.StorageHost {
	if key.Host == nil {
		return im.host
	}
	return key.Host
}

// refused tells whether err refuses the source for what it sent: too long
// for the operator's bound or the disk, or a format that is not imported.
// Fetching it again would read the same bytes again (an endless body
// endlessly). Connection and pool failures are retried, and so is a
// checksum mismatch: a body cut short by the network, which a server
// without Content-Length cannot be told from, mismatches too.
func refused(err error) bool {
	return errors.Is(err, virt.ErrImageTooLarge) || errors.Is(err, virt.ErrImageLargerThanDisk) || virt.IsImageRefused(err)
}

// logChecksum logs what a source whose checksum did not match hashed to:
// only the operator's log shows it.
func logChecksum(log logr.Logger, err error) {
	var sum *virt.ChecksumError
	if errors.As(err, &sum) {
		log.V(4).Info("Image checksum", "expected", sum.Expected, "computed", sum.Actual)
	}
}

// notify triggers w's reconcile.
func (im *Importer) notify(w Waiter) {
	im.mu.Lock()
	ch := im.sources[w.Kind]
	im.mu.Unlock()
	if ch == nil {
		return // no controller listens: its requeue comes back anyway
	}
	obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: w.Name}}
	select {
	case ch <- event.GenericEvent{Object: client.Object(obj)}:
	case <-im.ctx.Done():
	}
}

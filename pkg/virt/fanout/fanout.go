// Package fanout hands each published value to every subscriber without
// ever blocking the publisher, which may be libvirt's event loop: a
// subscriber whose buffer is full loses the value, and the loss is counted.
package fanout

import (
	"sync"
	"sync/atomic"
)

// Broker fans values of T out to its subscribers.
type Broker[T any] struct {
	size    int
	mu      sync.RWMutex
	subs    map[chan T]struct{}
	closed  bool
	dropped atomic.Uint64
}

// New returns a broker whose subscribers each buffer size values.
func New[T any](size int) *Broker[T] {
	return &Broker[T]{size: size, subs: map[chan T]struct{}{}}
}

// Subscribe returns a new subscriber's channel; closed at once when the
// broker is.
func (b *Broker[T]) Subscribe() chan T {
	ch := make(chan T, b.size)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		close(ch)
		return ch
	}
	b.subs[ch] = struct{}{}
	return ch
}

// Unsubscribe closes ch and stops sending to it; twice is harmless.
func (b *Broker[T]) Unsubscribe(ch chan T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[ch]; ok {
		delete(b.subs, ch)
		close(ch)
	}
}

// Publish hands v to every subscriber with room for it.
func (b *Broker[T]) Publish(v T) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for ch := range b.subs {
		select {
		case ch <- v:
		default:
			b.dropped.Add(1)
		}
	}
}

// Drop counts a value lost before it reached Publish.
func (b *Broker[T]) Drop() { b.dropped.Add(1) }

// Dropped is how many values subscribers lost.
func (b *Broker[T]) Dropped() uint64 { return b.dropped.Load() }

// Close closes every subscriber's channel; later subscribers get closed
// channels.
func (b *Broker[T]) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for ch := range b.subs {
		delete(b.subs, ch)
		close(ch)
	}
}

package fanout

import "testing"

func TestBrokerFanOutAndDrop(t *testing.T) {
	b := New[string](2)
	a, c := b.Subscribe(), b.Subscribe()
	for _, v := range []string{"a", "b", "c"} {
		b.Publish(v)
	}
	for _, ch := range []chan string{a, c} {
		if got := len(ch); got != 2 {
			t.Errorf("subscriber buffered %d values, want 2", got)
		}
		if v := <-ch; v != "a" {
			t.Errorf("first value %q, want a (order kept)", v)
		}
	}
	if got := b.Dropped(); got != 2 {
		t.Errorf("dropped %d, want one per subscriber", got)
	}
	b.Unsubscribe(a)
	b.Unsubscribe(a) // twice is harmless
	b.Publish("d")
	if got := len(c); got != 2 {
		t.Errorf("remaining subscriber has %d values, want 2", got)
	}
	b.Close()
	for range c {
	}
	if _, open := <-b.Subscribe(); open {
		t.Error("subscribing to a closed broker yields an open channel")
	}
}

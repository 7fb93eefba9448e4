//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
)

// waitFor polls fn until it returns true, failing the test with fn's last
// status after timeout.
func (s *suite) waitFor(t *testing.T, what string, timeout time.Duration, fn func() (bool, string)) {
	t.Helper()
	if err := s.poll(t, what, timeout, fn); err != nil {
		t.Fatal(err)
	}
}

// waitWorkload is waitFor for conditions that ask the workload cluster:
// every 10 s, since under TCG each request costs its API server dearly.
func (s *suite) waitWorkload(t *testing.T, what string, timeout time.Duration, fn func() (bool, string)) {
	t.Helper()
	if err := s.pollEvery(t, what, timeout, workloadPollInterval, fn); err != nil {
		s.diagnoseWorkload(t)
		t.Fatal(err)
	}
}

// workloadCall runs one call to the workload cluster until it succeeds:
// a TCG control plane under load times requests out now and then, which
// is no finding of the phase that made the call.
func (s *suite) workloadCall(t *testing.T, what string, call func() error) {
	t.Helper()
	s.waitWorkload(t, what, workloadCallTimeout, func() (bool, string) {
		err := call()
		return err == nil, errString(err)
	})
}

// workloadCallTimeout bounds workloadCall's retries.
// 10 minutes: a saturated TCG control plane left requests unanswered for
// more than 5 (2026-11-27).
const workloadCallTimeout = 10 * time.Minute

// poll is waitFor returning the failure instead.
func (s *suite) poll(t *testing.T, what string, timeout time.Duration, fn func() (bool, string)) error {
	t.Helper()
	interval := pollInterval
	if s.selfHost.inside.Load() {
		// The management cluster is the workload cluster itself.
		interval = workloadPollInterval
	}
	return s.pollEvery(t, what, timeout, interval, fn)
}

// pollEvery is poll asking every interval.
func (s *suite) pollEvery(t *testing.T, what string, timeout, interval time.Duration, fn func() (bool, string)) error {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, status := fn()
		if ok {
			return nil
		}
		if status != last && status != "" {
			t.Logf("%s waiting for %s: %s", time.Now().Format(time.TimeOnly), what, status)
			last = status
		}
		if time.Now().After(deadline) || s.ctx.Err() != nil {
			return fmt.Errorf("timed out after %s waiting for %s; last: %s", timeout, what, status)
		}
		time.Sleep(interval)
	}
}

// lm reads a LibvirtMachine; nil when it is gone.
func (s *suite) lm(name string) *infrav1.LibvirtMachine {
	lm := &infrav1.LibvirtMachine{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: name}, lm); err != nil {
		return nil
	}
	return lm
}

// libvirtCluster reads a LibvirtCluster, failing the test when it cannot.
func (s *suite) libvirtCluster(t *testing.T, name string) *infrav1.LibvirtCluster {
	t.Helper()
	lc := &infrav1.LibvirtCluster{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: name}, lc))
	return lc
}

// condition returns "Status/Reason: message" of obj's condition, or
// "absent".
func condition(obj conditions.Getter, condType string) (metav1.ConditionStatus, string, string) {
	c := conditions.Get(obj, condType)
	if c == nil {
		return "", "", "absent"
	}
	return c.Status, c.Reason, c.Message
}

// isTrue tells whether obj's condition is True.
func isTrue(obj conditions.Getter, condType string) bool {
	st, _, _ := condition(obj, condType)
	return st == metav1.ConditionTrue
}

// waitMachineCondition waits until the LibvirtMachine's condition is True.
func (s *suite) waitMachineCondition(t *testing.T, name, condType string, timeout time.Duration) *infrav1.LibvirtMachine {
	t.Helper()
	var got *infrav1.LibvirtMachine
	s.waitFor(t, name+" "+condType, timeout, func() (bool, string) {
		got = s.lm(name)
		if got == nil {
			return false, "not found"
		}
		st, reason, msg := condition(got, condType)
		return st == metav1.ConditionTrue, fmt.Sprintf("%s %s: %s", st, reason, msg)
	})
	return got
}

// deleteAndWait deletes obj and waits until it and every object in more
// are gone.
func (s *suite) deleteAndWait(t *testing.T, obj client.Object, timeout time.Duration, more ...client.Object) {
	t.Helper()
	if err := s.c.Delete(s.ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	s.waitGone(t, timeout, append([]client.Object{obj}, more...)...)
}

// waitGone waits until every object is gone from the API server.
func (s *suite) waitGone(t *testing.T, timeout time.Duration, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		s.waitFor(t, fmt.Sprintf("deletion of %T %s", o, o.GetName()), timeout, func() (bool, string) {
			err := s.c.Get(s.ctx, client.ObjectKeyFromObject(o), o)
			if apierrors.IsNotFound(err) {
				return true, ""
			}
			if err != nil {
				return false, err.Error()
			}
			return false, fmt.Sprintf("still there (finalizers %v)", o.GetFinalizers())
		})
	}
}

// clusterNetwork is the libvirt network of the cluster under test.
func (s *suite) clusterNetwork() string { return s.clusterNetworkOf(s.cut.infrastructure) }

// clusterNetworkOf is the libvirt network of LibvirtCluster cluster of the
// namespace.
func (s *suite) clusterNetworkOf(cluster string) string {
	lc := &infrav1.LibvirtCluster{}
	if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: cluster}, lc); err == nil && lc.Status.Network != nil {
		return lc.Status.Network.Name
	}
	return naming.ClusterNetworkName(namespace, cluster)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// errString is err's message, "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Message
	}
	return err.Error()
}

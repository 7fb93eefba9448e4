package webhooks

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
)

// placements refuses a change of a failure domain's host (its uri) or its
// removal while a VM is placed there: deletion looks for a VM on the host
// its failure domain names, so a VM whose failure domain moved to
// another host, or vanished, would be looked for in the wrong place and
// left running, uncounted. reader nil checks nothing.
func placements(ctx context.Context, reader client.Reader, oldC, newC *infrav1.LibvirtCluster) field.ErrorList {
	if reader == nil {
		return nil
	}
	path := field.NewPath("spec", "failureDomains")
	var errs field.ErrorList
	for i, old := range oldC.Spec.FailureDomains {
		now, kept := failureDomain(newC, old.Name)
		if kept && now.URI == old.URI {
			continue
		}
		users, err := placedOn(ctx, reader, oldC, old.Name)
		if err != nil {
			errs = append(errs, field.InternalError(path.Index(i), fmt.Errorf("listing the VMs placed on failure domain %s: %w", old.Name, err)))
			continue
		}
		if len(users) == 0 {
			continue
		}
		why := fmt.Sprintf("failure domain %s holds %s: its host cannot change or go while they are there (delete them, or move them to another failure domain, first)",
			old.Name, strings.Join(users, ", "))
		if kept {
			errs = append(errs, field.Forbidden(path.Key(old.Name).Child("uri"), why))
		} else {
			errs = append(errs, field.Forbidden(path.Key(old.Name), why))
		}
	}
	return errs
}

func failureDomain(lc *infrav1.LibvirtCluster, name string) (infrav1.FailureDomainSpec, bool) {
	for _, fd := range lc.Spec.FailureDomains {
		if fd.Name == name {
			return fd, true
		}
	}
	return infrav1.FailureDomainSpec{}, false
}

// placedOn names the VMs of lc's cluster placed on failure domain fd: its
// LibvirtMachines that recorded fd, and its HAProxy VM once it exists
// (its identity recorded) when fd is the load balancer's.
func placedOn(ctx context.Context, reader client.Reader, lc *infrav1.LibvirtCluster, fd string) ([]string, error) {
	var out []string
	if lc.Annotations[scope.LoadBalancerUUIDAnnotation] != "" && hosts.LoadBalancerFailureDomain(lc) == fd {
		out = append(out, "the HAProxy VM")
	}
	opts := []client.ListOption{client.InNamespace(lc.Namespace)}
	if cluster := lc.Labels[clusterv1.ClusterNameLabel]; cluster != "" {
		opts = append(opts, client.MatchingLabels{clusterv1.ClusterNameLabel: cluster})
	}
	var machines infrav1.LibvirtMachineList
	if err := reader.List(ctx, &machines, opts...); err != nil {
		return nil, err
	}
	for _, m := range machines.Items {
		if m.Spec.FailureDomain == fd {
			out = append(out, "LibvirtMachine "+m.Name)
		}
	}
	return out, nil
}

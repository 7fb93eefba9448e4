// Package webhooks holds the defaulting and validating admission webhooks of
// the provider's four kinds. They apply the defaults the controllers would
// otherwise apply silently, so that `kubectl get -o yaml` shows what a VM
// really gets, and they check what the CRDs' OpenAPI and CEL rules cannot:
// values that need parsing (URLs, reserved address blocks), rules across
// an update (immutability), and facts outside the object (base image sizes).
//
// Templates follow Cluster API's contract: spec.template.spec is immutable,
// except for the server-side-apply dry-run requests the topology controller
// makes to compute differences for ClusterClass-managed clusters.
package webhooks

import (
	"context"
	"fmt"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"sigs.k8s.io/cluster-api/util/topology"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// Options are what the webhooks need beyond the objects they judge.
type Options struct {
	// Volumes looks up base image volumes so that a diskSizeGiB smaller
	// than the image's virtual size is reported. Nil skips the comparison.
	Volumes VolumeInspector
	// Reader finds a LibvirtMachine's Cluster and LibvirtCluster, whose
	// storage pool holds images given without a pool. Nil leaves such
	// images unchecked.
	Reader client.Reader
	// LiveReader reads the API server without a cache: a check that
	// guards libvirt objects (what is placed on a failure domain) must
	// not miss an object created a moment before. Nil skips such checks.
	LiveReader client.Reader
	// Tenancy is the operator's policy of what a namespace may name
	// (pools, image volumes, networks, bridges). Nil checks none of it.
	Tenancy *tenancy.Policy
}

// SetupWithManager registers the defaulting and validating webhooks of
// LibvirtCluster, LibvirtClusterTemplate, LibvirtMachine and
// LibvirtMachineTemplate with mgr's webhook server.
func SetupWithManager(mgr ctrl.Manager, opts Options) error {
	images := imageChecker{volumes: opts.Volumes, reader: opts.Reader}
	refs := references{policy: opts.Tenancy}
	cluster := &LibvirtCluster{refs: refs, reader: opts.LiveReader}
	clusterTemplate := &LibvirtClusterTemplate{refs: refs}
	machine := &LibvirtMachine{images: images, refs: refs}
	machineTemplate := &LibvirtMachineTemplate{images: images, refs: refs}
	for _, complete := range []func() error{
		ctrl.NewWebhookManagedBy(mgr, &infrav1.LibvirtCluster{}).WithDefaulter(cluster).WithValidator(cluster).Complete,
		ctrl.NewWebhookManagedBy(mgr, &infrav1.LibvirtClusterTemplate{}).WithDefaulter(clusterTemplate).WithValidator(clusterTemplate).Complete,
		ctrl.NewWebhookManagedBy(mgr, &infrav1.LibvirtMachine{}).WithDefaulter(machine).WithValidator(machine).Complete,
		ctrl.NewWebhookManagedBy(mgr, &infrav1.LibvirtMachineTemplate{}).WithDefaulter(machineTemplate).WithValidator(machineTemplate).Complete,
	} {
		if err := complete(); err != nil {
			return err
		}
	}
	return nil
}

// templateImmutableMsg explains why a template's spec cannot change: Cluster
// API compares machines with their template by name, so an edited template
// would leave existing machines silently different from it.
const templateImmutableMsg = "is immutable: create a new template and point the MachineDeployment, KubeadmControlPlane or ClusterClass at it"

// checkTemplateSpecUnchanged rejects a change of a template's
// spec.template.spec, except in the topology controller's dry-run
// requests: it computes the difference between a ClusterClass and a
// cluster's current templates by dry-running an apply of the desired
// template, and rotates the template (a new name) when they differ.
func checkTemplateSpecUnchanged(ctx context.Context, obj metav1.Object, oldSpec, newSpec any) *field.Error {
	if apiequality.Semantic.DeepEqual(oldSpec, newSpec) {
		return nil
	}
	req, err := admission.RequestFromContext(ctx)
	if err == nil && topology.IsDryRunRequest(req, obj) {
		return nil
	}
	return field.Forbidden(field.NewPath("spec", "template", "spec"), templateImmutableMsg)
}

// invalid turns errs into the API's 422 Invalid error naming every field,
// or nil when errs is empty.
func invalid(kind, name string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(infrav1.GroupVersion.WithKind(kind).GroupKind(), name, errs)
}

// immutable reports path as changed when old and new differ.
func immutable(path *field.Path, oldValue, newValue any, why string) field.ErrorList {
	if apiequality.Semantic.DeepEqual(oldValue, newValue) {
		return nil
	}
	return field.ErrorList{field.Forbidden(path, fmt.Sprintf("is immutable%s", why))}
}

package webhooks

import (
	"context"
	"net/netip"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
)

// +kubebuilder:webhook:verbs=create;update,path=/mutate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtmachine,mutating=true,failurePolicy=fail,matchPolicy=Equivalent,groups=infrastructure.cluster.x-k8s.io,resources=libvirtmachines,versions=v1alpha1,name=default.libvirtmachine.infrastructure.cluster.x-k8s.io,sideEffects=None,admissionReviewVersions=v1
// +kubebuilder:webhook:verbs=create;update,path=/validate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtmachine,mutating=false,failurePolicy=fail,matchPolicy=Equivalent,groups=infrastructure.cluster.x-k8s.io,resources=libvirtmachines,versions=v1alpha1,name=validation.libvirtmachine.infrastructure.cluster.x-k8s.io,sideEffects=None,admissionReviewVersions=v1
// +kubebuilder:webhook:verbs=create;update,path=/mutate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtmachinetemplate,mutating=true,failurePolicy=fail,matchPolicy=Equivalent,groups=infrastructure.cluster.x-k8s.io,resources=libvirtmachinetemplates,versions=v1alpha1,name=default.libvirtmachinetemplate.infrastructure.cluster.x-k8s.io,sideEffects=None,admissionReviewVersions=v1
// +kubebuilder:webhook:verbs=create;update,path=/validate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtmachinetemplate,mutating=false,failurePolicy=fail,matchPolicy=Equivalent,groups=infrastructure.cluster.x-k8s.io,resources=libvirtmachinetemplates,versions=v1alpha1,name=validation.libvirtmachinetemplate.infrastructure.cluster.x-k8s.io,sideEffects=None,admissionReviewVersions=v1

// LibvirtMachine defaults and validates LibvirtMachines.
type LibvirtMachine struct {
	images imageChecker
	refs   references
}

var (
	_ admission.Defaulter[*infrav1.LibvirtMachine] = &LibvirtMachine{}
	_ admission.Validator[*infrav1.LibvirtMachine] = &LibvirtMachine{}
)

// Default fills the zero fields of the spec.
func (*LibvirtMachine) Default(_ context.Context, m *infrav1.LibvirtMachine) error {
	DefaultMachineSpec(&m.Spec)
	return nil
}

// ValidateCreate checks a new LibvirtMachine and warns when its disk is
// smaller than its base image.
func (w *LibvirtMachine) ValidateCreate(ctx context.Context, m *infrav1.LibvirtMachine) (admission.Warnings, error) {
	path := field.NewPath("spec")
	errs, warnings := validateMachineSpec(&m.Spec, path)
	pool := w.images.machinePool(ctx, m)
	errs = append(errs, w.refs.machine(m.Namespace, &m.Spec, pool, m.Annotations, path, annotationsPath)...)
	if len(errs) == 0 {
		warnings = append(warnings, w.images.diskWarnings(ctx, &m.Spec, pool, path)...)
	}
	return warnings, invalid("LibvirtMachine", m.Name, errs)
}

// ValidateUpdate checks a changed LibvirtMachine. Everything but
// providerID (which the provider sets once) is immutable: a machine is
// replaced, not changed, and the provider never recreates a VM to follow
// an edit.
func (w *LibvirtMachine) ValidateUpdate(ctx context.Context, oldM, newM *infrav1.LibvirtMachine) (admission.Warnings, error) {
	path := field.NewPath("spec")
	errs, warnings := validateMachineSpec(&newM.Spec, path)
	oldSpec := oldM.Spec.DeepCopy()
	DefaultMachineSpec(oldSpec)
	o, n := oldSpec, &newM.Spec
	const why = ": machines are replaced, not changed; change the LibvirtMachineTemplate and let Cluster API roll out new machines"
	for _, f := range []struct {
		name     string
		old, new any
	}{
		{"image", o.Image, n.Image},
		{"cpus", o.CPUs, n.CPUs},
		{"memoryMiB", o.MemoryMiB, n.MemoryMiB},
		{"domainType", o.DomainType, n.DomainType},
		{"cpuMode", o.CPUMode, n.CPUMode},
		{"cpuModel", o.CPUModel, n.CPUModel},
		{"cpuFeatures", o.CPUFeatures, n.CPUFeatures},
		{"tcgTranslationCacheMiB", o.TCGTranslationCacheMiB, n.TCGTranslationCacheMiB},
		{"cpuShares", o.CPUShares, n.CPUShares},
		{"diskSizeGiB", o.DiskSizeGiB, n.DiskSizeGiB},
		{"dataDisks", o.DataDisks, n.DataDisks},
		{"hostDevices", o.HostDevices, n.HostDevices},
		{"network", o.Network, n.Network},
	} {
		errs = append(errs, immutable(path.Child(f.name), f.old, f.new, why)...)
	}
	if w.refs.policy != nil {
		errs = append(errs, ratchet(w.refs.machine(newM.Namespace, &newM.Spec, w.images.machinePool(ctx, newM), newM.Annotations, path, annotationsPath),
			w.refs.machine(oldM.Namespace, oldSpec, w.images.machinePool(ctx, oldM), oldM.Annotations, path, annotationsPath))...)
	}
	errs = append(errs, placementUnchanged(oldM.Annotations, newM.Annotations)...)
	return warnings, invalid("LibvirtMachine", newM.Name, errs)
}

// ValidateDelete allows every deletion.
func (*LibvirtMachine) ValidateDelete(context.Context, *infrav1.LibvirtMachine) (admission.Warnings, error) {
	return nil, nil
}

// LibvirtMachineTemplate defaults and validates LibvirtMachineTemplates.
type LibvirtMachineTemplate struct {
	images imageChecker
	refs   references
}

var (
	_ admission.Defaulter[*infrav1.LibvirtMachineTemplate] = &LibvirtMachineTemplate{}
	_ admission.Validator[*infrav1.LibvirtMachineTemplate] = &LibvirtMachineTemplate{}
)

// Default fills the zero fields of the template's spec.
func (*LibvirtMachineTemplate) Default(_ context.Context, t *infrav1.LibvirtMachineTemplate) error {
	DefaultMachineSpec(&t.Spec.Template.Spec)
	return nil
}

// ValidateCreate checks a new LibvirtMachineTemplate. Its disk is compared
// with the base image only when the image names its pool: a template is
// shared by clusters whose pools may differ.
func (w *LibvirtMachineTemplate) ValidateCreate(ctx context.Context, t *infrav1.LibvirtMachineTemplate) (admission.Warnings, error) {
	path := field.NewPath("spec", "template", "spec")
	errs, warnings := validateMachineSpec(&t.Spec.Template.Spec, path)
	errs = append(errs, w.refs.machine(t.Namespace, &t.Spec.Template.Spec, "", t.Spec.Template.ObjectMeta.Annotations, path, templateAnnotationsPath)...)
	if len(errs) == 0 {
		warnings = append(warnings, w.images.diskWarnings(ctx, &t.Spec.Template.Spec, "", path)...)
	}
	return warnings, invalid("LibvirtMachineTemplate", t.Name, errs)
}

// ValidateUpdate checks a changed LibvirtMachineTemplate: its spec is
// immutable except in the topology controller's dry-run requests, while
// spec.template.metadata may change (Cluster API propagates it in place).
func (w *LibvirtMachineTemplate) ValidateUpdate(ctx context.Context, oldT, newT *infrav1.LibvirtMachineTemplate) (admission.Warnings, error) {
	path := field.NewPath("spec", "template", "spec")
	errs, warnings := validateMachineSpec(&newT.Spec.Template.Spec, path)
	oldSpec := oldT.Spec.Template.Spec.DeepCopy()
	DefaultMachineSpec(oldSpec)
	errs = append(errs, ratchet(w.refs.machine(newT.Namespace, &newT.Spec.Template.Spec, "", newT.Spec.Template.ObjectMeta.Annotations, path, templateAnnotationsPath),
		w.refs.machine(oldT.Namespace, oldSpec, "", oldT.Spec.Template.ObjectMeta.Annotations, path, templateAnnotationsPath))...)
	if err := checkTemplateSpecUnchanged(ctx, newT, *oldSpec, newT.Spec.Template.Spec); err != nil {
		errs = append(errs, err)
	}
	return warnings, invalid("LibvirtMachineTemplate", newT.Name, errs)
}

// ValidateDelete allows every deletion.
func (*LibvirtMachineTemplate) ValidateDelete(context.Context, *infrav1.LibvirtMachineTemplate) (admission.Warnings, error) {
	return nil, nil
}

// validateMachineSpec checks a LibvirtMachine spec at path.
func validateMachineSpec(spec *infrav1.LibvirtMachineSpec, path *field.Path) (field.ErrorList, admission.Warnings) {
	errs := append(validateImageSource(&spec.Image, path.Child("image")), validateNetworkAttachment(spec.Network, path.Child("network"))...)
	return errs, hardwareWarnings(&spec.VirtualHardware, path)
}

// validateNetworkAttachment refuses nameservers that are not IP addresses,
// and pools on a network the provider made for a cluster (whose DHCP
// server reserves the addresses); the controller refuses pools on the
// cluster's own network, which only it knows.
func validateNetworkAttachment(n *infrav1.NetworkAttachment, path *field.Path) field.ErrorList {
	if n == nil {
		return nil
	}
	var errs field.ErrorList
	for i, ns := range n.Nameservers {
		if _, err := netip.ParseAddr(ns); err != nil {
			errs = append(errs, field.Invalid(path.Child("nameservers").Index(i), ns, "must be an IP address"))
		}
	}
	if _, ours := naming.NameNamespace(n.Name); ours && len(n.AddressesFromPools) > 0 {
		errs = append(errs, field.Invalid(path.Child("addressesFromPools"), len(n.AddressesFromPools),
			"needs a host bridge or an existing libvirt network: network "+n.Name+" is one the provider made for a cluster, whose DHCP server reserves the machines' addresses"))
	}
	return errs
}

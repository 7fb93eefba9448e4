package webhooks

import (
	"context"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// +kubebuilder:webhook:verbs=create;update,path=/mutate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtcluster,mutating=true,failurePolicy=fail,matchPolicy=Equivalent,groups=infrastructure.cluster.x-k8s.io,resources=libvirtclusters,versions=v1alpha1,name=default.libvirtcluster.infrastructure.cluster.x-k8s.io,sideEffects=None,admissionReviewVersions=v1
// +kubebuilder:webhook:verbs=create;update,path=/validate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtcluster,mutating=false,failurePolicy=fail,matchPolicy=Equivalent,groups=infrastructure.cluster.x-k8s.io,resources=libvirtclusters,versions=v1alpha1,name=validation.libvirtcluster.infrastructure.cluster.x-k8s.io,sideEffects=None,admissionReviewVersions=v1
// +kubebuilder:webhook:verbs=create;update,path=/mutate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtclustertemplate,mutating=true,failurePolicy=fail,matchPolicy=Equivalent,groups=infrastructure.cluster.x-k8s.io,resources=libvirtclustertemplates,versions=v1alpha1,name=default.libvirtclustertemplate.infrastructure.cluster.x-k8s.io,sideEffects=None,admissionReviewVersions=v1
// +kubebuilder:webhook:verbs=create;update,path=/validate-infrastructure-cluster-x-k8s-io-v1alpha1-libvirtclustertemplate,mutating=false,failurePolicy=fail,matchPolicy=Equivalent,groups=infrastructure.cluster.x-k8s.io,resources=libvirtclustertemplates,versions=v1alpha1,name=validation.libvirtclustertemplate.infrastructure.cluster.x-k8s.io,sideEffects=None,admissionReviewVersions=v1

// LibvirtCluster defaults and validates LibvirtClusters.
type LibvirtCluster struct {
	refs references
	// reader finds the VMs placed on a failure domain; nil checks none.
	reader client.Reader
}

var (
	_ admission.Defaulter[*infrav1.LibvirtCluster] = &LibvirtCluster{}
	_ admission.Validator[*infrav1.LibvirtCluster] = &LibvirtCluster{}
)

// Default fills the zero fields of the spec.
func (*LibvirtCluster) Default(_ context.Context, c *infrav1.LibvirtCluster) error {
	DefaultClusterSpec(&c.Spec)
	return nil
}

// ValidateCreate checks a new LibvirtCluster.
func (w *LibvirtCluster) ValidateCreate(_ context.Context, c *infrav1.LibvirtCluster) (admission.Warnings, error) {
	path := field.NewPath("spec")
	errs, warnings := validateClusterSpec(&c.Spec, path, false)
	errs = append(errs, w.refs.cluster(c.Namespace, &c.Spec, c.Annotations, path, annotationsPath)...)
	return warnings, invalid("LibvirtCluster", c.Name, errs)
}

// ValidateUpdate checks a changed LibvirtCluster: what the cluster's
// machines and endpoint were built on cannot move under them.
func (w *LibvirtCluster) ValidateUpdate(ctx context.Context, oldC, newC *infrav1.LibvirtCluster) (admission.Warnings, error) {
	path := field.NewPath("spec")
	errs, warnings := validateClusterSpec(&newC.Spec, path, false)
	// Objects stored before the defaulting webhook existed compare as if
	// they had been defaulted, so that defaulting alone is never a change.
	oldSpec := oldC.Spec.DeepCopy()
	DefaultClusterSpec(oldSpec)
	if oldSpec.ControlPlaneEndpoint.Host != "" {
		errs = append(errs, immutable(path.Child("controlPlaneEndpoint"), oldSpec.ControlPlaneEndpoint, newC.Spec.ControlPlaneEndpoint,
			" once its host is set: workload cluster certificates and kubeconfigs name it")...)
	}
	errs = append(errs, immutable(path.Child("network"), oldSpec.Network, newC.Spec.Network,
		": the cluster's machines and load balancer are plugged into it; create a new cluster to move")...)
	errs = append(errs, immutable(path.Child("loadBalancer", "type"), oldSpec.LoadBalancer.Type, newC.Spec.LoadBalancer.Type,
		": it decides who owns the control-plane endpoint")...)
	errs = append(errs, immutable(path.Child("loadBalancer", "addressFromPool"), oldSpec.LoadBalancer.AddressFromPool, newC.Spec.LoadBalancer.AddressFromPool,
		": the HAProxy VM holds the pool's address as the endpoint")...)
	errs = append(errs, ratchet(w.refs.cluster(newC.Namespace, &newC.Spec, newC.Annotations, path, annotationsPath),
		w.refs.cluster(oldC.Namespace, oldSpec, oldC.Annotations, path, annotationsPath))...)
	errs = append(errs, placementUnchanged(oldC.Annotations, newC.Annotations)...)
	errs = append(errs, placements(ctx, w.reader, oldC, newC)...)
	return warnings, invalid("LibvirtCluster", newC.Name, errs)
}

// ValidateDelete allows every deletion.
func (*LibvirtCluster) ValidateDelete(context.Context, *infrav1.LibvirtCluster) (admission.Warnings, error) {
	return nil, nil
}

// LibvirtClusterTemplate defaults and validates LibvirtClusterTemplates.
type LibvirtClusterTemplate struct {
	refs references
}

var (
	_ admission.Defaulter[*infrav1.LibvirtClusterTemplate] = &LibvirtClusterTemplate{}
	_ admission.Validator[*infrav1.LibvirtClusterTemplate] = &LibvirtClusterTemplate{}
)

// Default fills the zero fields of the template's spec.
func (*LibvirtClusterTemplate) Default(_ context.Context, t *infrav1.LibvirtClusterTemplate) error {
	DefaultClusterSpec(&t.Spec.Template.Spec)
	return nil
}

// ValidateCreate checks a new LibvirtClusterTemplate.
func (w *LibvirtClusterTemplate) ValidateCreate(_ context.Context, t *infrav1.LibvirtClusterTemplate) (admission.Warnings, error) {
	path := field.NewPath("spec", "template", "spec")
	errs, warnings := validateClusterSpec(&t.Spec.Template.Spec, path, true)
	errs = append(errs, w.refs.cluster(t.Namespace, &t.Spec.Template.Spec, t.Spec.Template.ObjectMeta.Annotations, path, templateAnnotationsPath)...)
	return warnings, invalid("LibvirtClusterTemplate", t.Name, errs)
}

// ValidateUpdate checks a changed LibvirtClusterTemplate: its spec is
// immutable except in the topology controller's dry-run requests.
func (w *LibvirtClusterTemplate) ValidateUpdate(ctx context.Context, oldT, newT *infrav1.LibvirtClusterTemplate) (admission.Warnings, error) {
	path := field.NewPath("spec", "template", "spec")
	errs, warnings := validateClusterSpec(&newT.Spec.Template.Spec, path, true)
	oldSpec := oldT.Spec.Template.Spec.DeepCopy()
	DefaultClusterSpec(oldSpec)
	errs = append(errs, ratchet(w.refs.cluster(newT.Namespace, &newT.Spec.Template.Spec, newT.Spec.Template.ObjectMeta.Annotations, path, templateAnnotationsPath),
		w.refs.cluster(oldT.Namespace, oldSpec, oldT.Spec.Template.ObjectMeta.Annotations, path, templateAnnotationsPath))...)
	if err := checkTemplateSpecUnchanged(ctx, newT, *oldSpec, newT.Spec.Template.Spec); err != nil {
		errs = append(errs, err)
	}
	return warnings, invalid("LibvirtClusterTemplate", newT.Name, errs)
}

// ValidateDelete allows every deletion.
func (*LibvirtClusterTemplate) ValidateDelete(context.Context, *infrav1.LibvirtClusterTemplate) (admission.Warnings, error) {
	return nil, nil
}

// validateClusterSpec checks a LibvirtCluster spec at path. A template's
// spec is shared by many clusters, so it must not name an endpoint host;
// a cluster's spec with loadBalancer type None must.
func validateClusterSpec(spec *infrav1.LibvirtClusterSpec, path *field.Path, template bool) (field.ErrorList, admission.Warnings) {
	var errs field.ErrorList
	var warnings admission.Warnings

	if cidr := spec.Network.CIDR; cidr != "" {
		p, err := netip.ParsePrefix(cidr)
		if err == nil {
			err = netalloc.ValidatePrefix(p)
		}
		if err != nil {
			errs = append(errs, field.Invalid(path.Child("network", "cidr"), cidr, err.Error()))
		}
	}

	endpoint := path.Child("controlPlaneEndpoint", "host")
	switch {
	case template && spec.ControlPlaneEndpoint.Host != "":
		errs = append(errs, field.Forbidden(endpoint,
			"a template is shared by clusters, which cannot share an endpoint: set Cluster.spec.controlPlaneEndpoint instead"))
	case !template && spec.LoadBalancer.Type == infrav1.LoadBalancerNone && spec.ControlPlaneEndpoint.Host == "":
		errs = append(errs, field.Required(endpoint,
			"loadBalancer type None means you serve the endpoint (kube-vip, an external load balancer): name its host"))
	}

	lb := path.Child("loadBalancer")
	// On a libvirt network the HAProxy VM's address, the endpoint, is
	// reserved in the DHCP server libvirt runs; a host bridge has none of
	// ours, so there the VM holds the user's endpoint as a static address.
	// With addressFromPool the pool's address is the endpoint.
	if h := spec.ControlPlaneEndpoint.Host; !template && spec.LoadBalancer.Type == infrav1.LoadBalancerHAProxy && spec.Network.Bridge != "" &&
		spec.LoadBalancer.AddressFromPool == nil {
		if _, err := netip.ParseAddr(h); err != nil {
			errs = append(errs, field.Invalid(endpoint, h,
				"on a host bridge the HAProxy VM holds the endpoint as a static address: name a free IP address of the LAN, outside its DHCP range"))
		}
	}
	if spec.LoadBalancer.Type == infrav1.LoadBalancerNone {
		// domainType is left out: the CRD defaults it whatever the type.
		hw := spec.LoadBalancer.VirtualHardware
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"cpus", hw.CPUs != 0},
			{"memoryMiB", hw.MemoryMiB != 0},
			{"cpuMode", hw.CPUMode != ""},
			{"cpuModel", hw.CPUModel != ""},
			{"cpuFeatures", len(hw.CPUFeatures) > 0},
			{"tcgTranslationCacheMiB", hw.TCGTranslationCacheMiB != 0},
			{"cpuShares", hw.CPUShares != 0},
		} {
			if f.set {
				errs = append(errs, field.Forbidden(lb.Child(f.name), "applies only to loadBalancer type HAProxy"))
			}
		}
	} else {
		warnings = append(warnings, hardwareWarnings(&spec.LoadBalancer.VirtualHardware, lb)...)
	}
	if spec.LoadBalancer.Image != nil {
		errs = append(errs, validateImageSource(spec.LoadBalancer.Image, lb.Child("image"))...)
	}

	return append(errs, validateFailureDomains(spec, path)...), warnings
}

// validateFailureDomains checks the failure domains' names, URIs and
// credentials, that control-plane machines have somewhere to go and that
// the load balancer's failure domain is one of them.
func validateFailureDomains(spec *infrav1.LibvirtClusterSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	fds := path.Child("failureDomains")
	seen := map[string]bool{}
	controlPlane := false
	for i, fd := range spec.FailureDomains {
		if seen[fd.Name] {
			errs = append(errs, field.Duplicate(fds.Index(i).Child("name"), fd.Name))
		}
		seen[fd.Name] = true
		controlPlane = controlPlane || fd.ControlPlane != nil && *fd.ControlPlane
		if fd.URI == "" {
			continue
		}
		kind, err := tenancy.ParseLibvirtURI(fd.URI)
		if err != nil {
			errs = append(errs, field.Invalid(fds.Index(i).Child("uri"), fd.URI, err.Error()))
			continue
		}
		if fd.CredentialsRef != nil && kind == "" {
			errs = append(errs, field.Forbidden(fds.Index(i).Child("credentialsRef"),
				"the "+strings.SplitN(fd.URI, ":", 2)[0]+" transport takes no credentials: use qemu+ssh:// (an SSH key) or qemu+tls:// (a client certificate)"))
		}
	}
	if len(spec.FailureDomains) > 0 && !controlPlane {
		errs = append(errs, field.Required(fds,
			"at least one failure domain needs controlPlane: true, or control-plane machines have nowhere to go"))
	}
	if lb := spec.LoadBalancer.FailureDomain; lb != "" && !seen[lb] {
		errs = append(errs, field.Invalid(path.Child("loadBalancer", "failureDomain"), lb, "must be one of spec.failureDomains"))
	}
	return errs
}

// hardwareWarnings reports settings the VM will not get.
func hardwareWarnings(hw *infrav1.VirtualHardware, path *field.Path) admission.Warnings {
	if hw.TCGTranslationCacheMiB != 0 && hw.DomainType != infrav1.DomainTypeQEMU {
		return admission.Warnings{path.Child("tcgTranslationCacheMiB").String() + " is ignored: it applies only to domainType qemu"}
	}
	return nil
}

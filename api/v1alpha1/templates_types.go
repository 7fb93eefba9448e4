package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// LibvirtMachineTemplateSpec is the desired state of a LibvirtMachineTemplate.
type LibvirtMachineTemplateSpec struct {
	// template is copied into every LibvirtMachine made from this template.
	// +required
	Template LibvirtMachineTemplateResource `json:"template"`
}

// LibvirtMachineTemplateResource is the LibvirtMachine a template stamps out.
type LibvirtMachineTemplateResource struct {
	// metadata is copied to the LibvirtMachines made from the template.
	// +optional
	ObjectMeta clusterv1.ObjectMeta `json:"metadata,omitempty,omitzero"`

	// spec of the LibvirtMachines made from the template.
	// +required
	// +kubebuilder:validation:XValidation:rule="!has(self.providerID)",message="providerID must not be set in a template: the provider sets it per machine"
	// +kubebuilder:validation:XValidation:rule="!has(self.failureDomain)",message="failureDomain must not be set in a template: the provider sets it per machine from the Machine's spec.failureDomain"
	Spec LibvirtMachineSpec `json:"spec"`
}

// LibvirtMachineTemplateStatus is what the provider reports of a
// template: what every machine made from it will offer, for the cluster
// autoscaler to scale a MachineDeployment from zero (Cluster API's
// "autoscaling from zero" contract).
type LibvirtMachineTemplateStatus struct {
	// capacity is what a Node of a machine made from the template has:
	// cpu (its vCPUs), memory and ephemeral-storage (its root disk).
	// +optional
	Capacity corev1.ResourceList `json:"capacity,omitempty"`

	// nodeInfo is the architecture and operating system of the Node.
	// +optional
	NodeInfo NodeInfo `json:"nodeInfo,omitempty,omitzero"`
}

// Architecture is a Node's CPU architecture, as Kubernetes names it.
// +kubebuilder:validation:Enum=amd64;arm64;s390x;ppc64le
type Architecture string

// ArchitectureAmd64 is x86_64, the architecture of every domain the
// provider defines.
const ArchitectureAmd64 Architecture = "amd64"

// NodeInfo is the architecture and operating system of a template's Nodes.
// +kubebuilder:validation:MinProperties=1
type NodeInfo struct {
	// architecture is the Node's CPU architecture.
	// +optional
	Architecture Architecture `json:"architecture,omitempty"`
	// operatingSystem is the Node's operating system (linux).
	// +optional
	// +kubebuilder:validation:MaxLength=32
	OperatingSystem string `json:"operatingSystem,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=libvirtmachinetemplates,scope=Namespaced,categories=cluster-api
// +kubebuilder:storageversion
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="CPU",type="string",JSONPath=".status.capacity.cpu",description="vCPUs of each machine (status.capacity, for the autoscaler)"
// +kubebuilder:printcolumn:name="Memory",type="string",JSONPath=".status.capacity.memory",description="Memory of each machine (status.capacity)"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// LibvirtMachineTemplate stamps out LibvirtMachines for MachineDeployments,
// MachineSets and control planes.
type LibvirtMachineTemplate struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state.
	// +optional
	Spec LibvirtMachineTemplateSpec `json:"spec,omitempty,omitzero"`

	// status is what the provider reports of the template.
	// +optional
	Status LibvirtMachineTemplateStatus `json:"status,omitempty,omitzero"`
}

// +kubebuilder:object:root=true

// LibvirtMachineTemplateList is a list of LibvirtMachineTemplates.
type LibvirtMachineTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the LibvirtMachineTemplates.
	Items []LibvirtMachineTemplate `json:"items"`
}

// LibvirtClusterTemplateSpec is the desired state of a LibvirtClusterTemplate.
type LibvirtClusterTemplateSpec struct {
	// template is copied into the LibvirtCluster of each Cluster using it.
	// +required
	Template LibvirtClusterTemplateResource `json:"template"`
}

// LibvirtClusterTemplateResource is the LibvirtCluster a template stamps out.
type LibvirtClusterTemplateResource struct {
	// metadata is copied to the LibvirtClusters made from the template.
	// +optional
	ObjectMeta clusterv1.ObjectMeta `json:"metadata,omitempty,omitzero"`

	// spec of the LibvirtClusters made from the template.
	// +required
	Spec LibvirtClusterSpec `json:"spec"`
}

// +kubebuilder:object:root=true
// +kubebuilder:resource:path=libvirtclustertemplates,scope=Namespaced,categories=cluster-api
// +kubebuilder:storageversion
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1alpha1"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"

// LibvirtClusterTemplate stamps out LibvirtClusters for ClusterClass.
type LibvirtClusterTemplate struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state.
	// +optional
	Spec LibvirtClusterTemplateSpec `json:"spec,omitempty,omitzero"`
}

// +kubebuilder:object:root=true

// LibvirtClusterTemplateList is a list of LibvirtClusterTemplates.
type LibvirtClusterTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the LibvirtClusterTemplates.
	Items []LibvirtClusterTemplate `json:"items"`
}

func init() {
	SchemeBuilder.Register(
		&LibvirtMachineTemplate{}, &LibvirtMachineTemplateList{},
		&LibvirtClusterTemplate{}, &LibvirtClusterTemplateList{},
	)
}

package v1alpha1

// Default fills the zero fields of hw: cpus and memoryMiB as given (they
// differ between machines and the load-balancer VM), domain type kvm, and
// the CPU mode that suits the domain type: host-passthrough with KVM,
// maximum under TCG, which needs it to boot current distribution kernels.
// The webhooks write these defaults into objects; the controllers apply the
// same to objects stored before the webhooks ran.
func (hw *VirtualHardware) Default(cpus, memoryMiB int32) {
	if hw.CPUs == 0 {
		hw.CPUs = cpus
	}
	if hw.MemoryMiB == 0 {
		hw.MemoryMiB = memoryMiB
	}
	if hw.DomainType == "" {
		hw.DomainType = DomainTypeKVM
	}
	if hw.CPUMode == "" {
		hw.CPUMode = CPUModeHostPassthrough
		if hw.DomainType == DomainTypeQEMU {
			hw.CPUMode = CPUModeMaximum
		}
	}
}

#!/usr/bin/env bash
# Runs make test's packages in lanes (gotestsum, a line per package and the
# skipped tests at the end of each lane), so that one libvirtd serves them
# safely and the 2-core host is busy while pkg/controllers waits on its
# guests:
#   1. pkg/virt alone: its reconnect tests stop and start libvirtd, which
#      must not cut another package's calls mid-test;
#   2. then pkg/controllers in two processes, its LibvirtCluster tests
#      (the HAProxy VMs, the load balancer, several hosts) apart from its
#      LibvirtMachine tests: one process took 28 minutes, most of them
#      guests booting on one core and reconciles waiting; beside them
#      every other package, one after the other (-p 1), and the images/oci
#      module.
# Test objects on libvirt are named per process and swept per process
# (internal/testharness/testlibvirt: Name, HostLockPath), so the two lanes
# of step 2 do not see each other's. Each lane writes its events to
# ARTIFACTS/test-<lane>.json; test.json is their concatenation.
#
# Usage: hack/test.sh GOTESTSUM ARTIFACTS GO_TEST_FLAGS...
set -euo pipefail
cd "$(dirname "$0")/.."
gotestsum=$1 artifacts=$2
shift 2
flags=("$@")
module=$(go list -m)
virt=$module/pkg/virt
controllers=$module/pkg/controllers
mapfile -t others < <(go list ./... | grep -vx -e "$virt" -e "$controllers")

lane() {
  local name=$1
  shift
  "$gotestsum" --format pkgname --jsonfile "$artifacts/test-$name.json" -- "$@"
}

rc=0
lane virt "${flags[@]}" "$virt" || rc=$?

# The LibvirtCluster side of pkg/controllers; the other process runs the rest.
cluster_tests='^(TestLibvirtCluster|TestLoadBalancerOnBridge|TestMultiHost|TestPublicNetworkRange|TestTenantIsolation|TestTemplateCapacityForTheAutoscaler|TestLoadBalancerAddressFromPool)$'
lane controllers-clusters "${flags[@]}" -run "$cluster_tests" "$controllers" &
clusters_pid=$!
lane controllers-machines "${flags[@]}" -skip "$cluster_tests" "$controllers" &
machines_pid=$!
others_rc=0
lane others "${flags[@]}" "${others[@]}" || others_rc=$?
(cd images/oci && "$gotestsum" --format pkgname --jsonfile "$artifacts/test-oci.json" -- -count=1 ./...) || others_rc=$?
controllers_rc=0
wait "$clusters_pid" || controllers_rc=$?
wait "$machines_pid" || controllers_rc=$?

cat "$artifacts"/test-{virt,controllers-clusters,controllers-machines,others,oci}.json >"$artifacts/test.json"
for r in "$rc" "$others_rc" "$controllers_rc"; do
  if [ "$r" != 0 ]; then
    echo "make test: FAILED (pkg/virt exit $rc, pkg/controllers exit $controllers_rc, the other packages exit $others_rc)" >&2
    exit 1
  fi
done

// Package testharness holds, in its sub-packages, the code written for tests
// only: testenv (an API server with the CRDs, the manager in process, the
// controllers' activity), testlibvirt (test pools, names, leak checks,
// libvirtd restarts, the multi-host test bed), testprereq (a missing
// prerequisite fails under CI), fakehost (an in-memory libvirt host for the
// services' unit tests) and servicetest (the services' shared fixture).
// No binary users run links any of it (TestProductCodeImportsNoTestHarness).
package testharness

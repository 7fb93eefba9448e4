// Package policytest runs the provider's webhooks in a real API server
// under an operator's policy, the manager's flag defaults with
// --libvirt-uris=*: the policy is fixed when the webhook server starts, so
// these tests have an API server of their own, apart from pkg/webhooks'
// tests, which run without a policy.
package policytest

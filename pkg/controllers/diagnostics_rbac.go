package controllers

// The manager's diagnostics endpoint (--diagnostics-address, served by
// pkg/manager with Cluster API's options) authenticates the bearer token
// of each /metrics request with a TokenReview and asks whether its holder
// may read the path with a SubjectAccessReview; a Prometheus scraping the
// provider's pod is refused without both. config/rbac/metrics_reader_role.yaml
// is what the scraper's ServiceAccount needs.

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

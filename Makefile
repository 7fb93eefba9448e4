# Build, generate and test the libvirt infrastructure provider.
# `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN := $(ROOT)/bin
# Go's own install directory last: sudo's secure_path drops it, and `sudo make
# up` must still find Go 1.26 there; a go earlier on PATH wins.
export PATH := $(BIN):$(PATH)$(if $(wildcard /usr/local/go/bin/go),:/usr/local/go/bin)
export GOTOOLCHAIN := local

CONTROLLER_GEN_VERSION := v0.23.0
CONTROLLER_GEN := $(BIN)/controller-gen
KUSTOMIZE_VERSION := v5.8.1
KUSTOMIZE := $(BIN)/kustomize
HELM_VERSION := v3.22.0
HELM := $(BIN)/helm
# gotestsum runs make test's packages, as Cluster API's own Makefile does:
# one line per package, then the output of every failure and every skipped
# test with its reason, and how many ran, failed and skipped.
GOTESTSUM_VERSION := v1.13.0
GOTESTSUM := $(BIN)/gotestsum

# Where the test images are built and cached between runs (outside the
# checkout so that a fresh clone on the same host reuses them).
export CAPL_IMAGE_DIR ?= /var/cache/capi-libvirt/images
TEST_IMAGE := $(CAPL_IMAGE_DIR)/capl-debian-12.qcow2
# The Kubernetes release of the node image: the k8s.io/kubernetes pin of the
# tools module its binaries (and envtest's) are built from.
KUBERNETES_VERSION ?= $(shell awk '$$1 == "k8s.io/kubernetes" {print $$2; exit}' hack/tools/envtest/go.mod)
NODE_IMAGE := $(CAPL_IMAGE_DIR)/capl-node-$(KUBERNETES_VERSION).qcow2
# The previous minor, for upgrade tests: its latest patch the Go module proxy
# serves (make node-images builds its node image next to KUBERNETES_VERSION's).
KUBERNETES_VERSION_PREVIOUS ?= v1.35.4
LIBVIRT_URI ?= qemu:///system

# Tests run against the real libvirtd and the test image; a test that needs
# them skips only when these are unset, which the Makefile never leaves them.
TEST_ENV = KUBEBUILDER_ASSETS="$$(hack/envtest.sh)" \
	CAPL_TEST_DIST=$(DIST_DIR) \
	CAPL_TEST_LIBVIRT_URI=$(LIBVIRT_URI) \
	CAPL_TEST_IMAGE=$(TEST_IMAGE) \
	CAPL_TEST_NODE_IMAGE=$(NODE_IMAGE)
# -p 1 within a lane of hack/test.sh: packages share one libvirtd; pkg/virt,
# whose reconnect tests restart it, runs before the others, alone.
GO_TEST_FLAGS ?= -count=1 -p 1 -timeout=60m
# FUZZTIME is how long make fuzz runs FuzzInspect.
FUZZTIME ?= 60s

##@ Main

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2} /^##@/ {printf "\n%s\n", substr($$0, 5)}' $(MAKEFILE_LIST)

.PHONY: prepare-host
prepare-host: ## Install packages and start libvirtd on this Debian/Ubuntu host (root).
	hack/prepare-host.sh

.PHONY: run
run: ## Run the manager against the management cluster of the current kubeconfig.
	go run ./cmd/manager --libvirt-uri=$(LIBVIRT_URI) --health-addr=127.0.0.1:9440 --diagnostics-address=127.0.0.1:8443

# What `manager --version` and `capl-dev version` say: the release of a
# checkout at its tag, else RELEASE_VERSION-dev; the commit (-dirty with
# changes); the commit's time, not the build's, so that a rebuild of one
# commit is the same binary.
VERSION_PKG := github.com/capi-libvirt/cluster-api-provider-libvirt/internal/version
VERSION = $(shell git describe --tags --exact-match --match 'v[0-9]*' 2>/dev/null || echo $(RELEASE_VERSION)-dev)
GIT_COMMIT = $(shell git rev-parse HEAD 2>/dev/null)$(shell test -z "$$(git status --porcelain 2>/dev/null)" || echo -dirty)
GIT_COMMIT_DATE = $(shell TZ=UTC git show -s --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd HEAD 2>/dev/null)
VERSION_LDFLAGS = -X $(VERSION_PKG).gitVersion=$(VERSION) -X $(VERSION_PKG).gitCommit=$(GIT_COMMIT) -X $(VERSION_PKG).buildDate=$(GIT_COMMIT_DATE)

.PHONY: build
build: ## Build the manager and capl-dev (the one-host management plane) into bin/, with their version (VERSION_LDFLAGS).
	@ldflags='$(VERSION_LDFLAGS)' && \
	hack/timed.sh --key "go build manager" --what "bin/manager (go build, incremental)" -- go build -ldflags "$$ldflags" -o $(BIN)/manager ./cmd/manager && \
	hack/timed.sh --key "go build capl-dev" --what "bin/capl-dev (go build, incremental)" -- go build -ldflags "$$ldflags" -o $(BIN)/capl-dev ./cmd/capl-dev

# Where `make dist` writes the one-host plane's release directory.
DIST_DIR ?= $(ROOT)/dist/capl-dev-linux-amd64
.PHONY: dist
dist: envtest build ## The one-host plane as a directory that runs anywhere on this kind of host: capl-dev, manager, kube-apiserver, etcd, kube-controller-manager, kubectl and the templates ($(DIST_DIR)).
	rm -rf $(DIST_DIR) && mkdir -p $(DIST_DIR)/templates
	cp $(BIN)/capl-dev $(BIN)/manager $(DIST_DIR)/
	assets="$$(hack/envtest.sh)" && for b in kube-apiserver etcd kube-controller-manager kubectl; do cp -L "$$assets/$$b" $(DIST_DIR)/; done
	cp templates/*.yaml $(DIST_DIR)/templates/

# Where `make up` keeps the management plane's etcd data, kubeconfig and logs.
STATE_DIR ?= /var/lib/capi-libvirt/devplane
# Extra flags for `capl-dev up`, e.g. UP_ARGS="--control-plane=3 --workers=2",
# UP_ARGS=--domain-type=qemu, or UP_ARGS=--stand-in for VMs without Kubernetes.
UP_ARGS ?=
# Extra flags for `capl-dev down`, e.g. DOWN_ARGS=--all to sweep every
# libvirt object the provider owns on this host, not just the plane's.
DOWN_ARGS ?=

.PHONY: up
up: prepare-host envtest images node-image build ## One host, whole system: management plane (kube-apiserver, etcd, kube-controller-manager, Cluster API, this provider) and a kubeadm cluster of real VMs with Ready nodes.
	KUBEBUILDER_ASSETS="$$(hack/envtest.sh)" $(BIN)/capl-dev up --state-dir=$(STATE_DIR) --libvirt-uri=$(LIBVIRT_URI) \
		--manager=$(BIN)/manager --image-dir=$(CAPL_IMAGE_DIR) --kubernetes-version=$(KUBERNETES_VERSION) \
		$$(test -f $(MANAGER_IMAGE_DIR)/oci/index.json && echo --registry-layout=$(MANAGER_IMAGE_DIR)/oci) \
		$$(test -f $(CLUSTERCTL_REPO_DIR)/oci/index.json && echo --registry-layout=$(CLUSTERCTL_REPO_DIR)/oci) $(UP_ARGS)

.PHONY: down
down: ## Delete the cluster, stop the management plane and remove every VM, volume and network it made.
	@test -x $(BIN)/capl-dev || $(MAKE) build
	$(BIN)/capl-dev down --state-dir=$(STATE_DIR) --libvirt-uri=$(LIBVIRT_URI) $(DOWN_ARGS)

##@ Test

.PHONY: test
test: envtest images clusterctl dist $(GOTESTSUM) ## Unit and integration tests (envtest + real libvirtd); those that boot guests the e2e boots the same way run in test-soak. Ends with every skipped test and why; under CI=true a missing prerequisite fails instead.
	@mkdir -p $(ARTIFACTS)
	$(TEST_ENV) hack/test.sh $(GOTESTSUM) $(ARTIFACTS) $(GO_TEST_FLAGS)

# Where the end-to-end suite writes its benchmark report and logs.
ARTIFACTS ?= $(ROOT)/_artifacts
# Extra flags for the end-to-end suite, e.g. E2E_ARGS="-e2e.kill-rounds=30".
E2E_ARGS ?=
E2E_TIMEOUT ?= 60m
# Extra environment of the end-to-end suite (the scenario targets set it).
TEST_E2E_ENV ?=

.PHONY: test-e2e
test-e2e: envtest images node-image build clusterctl image-current ## End-to-end on real VMs: a kubeadm cluster from the template (nodes Ready with our providerIDs, CNI, a Service by DNS, contract, guests, bad input, manager kills, a libvirtd restart, deletion while creating, leak checks); report in $(ARTIFACTS).
	$(TEST_ENV) CAPL_E2E_ARTIFACTS=$(ARTIFACTS) CAPL_E2E_BIN=$(BIN) CAPL_TEST_MANAGER_IMAGE_DIR=$(MANAGER_IMAGE_DIR)/oci $(TEST_E2E_ENV) \
		go test -tags e2e -count=1 -timeout=$(E2E_TIMEOUT) -v ./e2e/ -args $(E2E_ARGS)

.PHONY: test-e2e-kubeadm
test-e2e-kubeadm: ## test-e2e plus the manager image of make image pulled through the plane's registry, MachineHealthCheck remediation and worker scaling 1 → 2 → 1 (outside CI: a third TCG guest next to two starves a 2-core host).
	$(MAKE) test-e2e E2E_TIMEOUT=150m E2E_ARGS="-e2e.lifecycle $(E2E_ARGS)"

.PHONY: test-e2e-multihost
test-e2e-multihost: ## A kubeadm cluster over two libvirt hosts (hack/testbed-hosts.sh: libvirtds in their own namespaces, bridges on one LAN): placement, a Service across hosts, a host's libvirtd stopped and back, deletion; outside CI like test-e2e-kubeadm.
	$(MAKE) test-e2e E2E_TIMEOUT=90m E2E_ARGS="-e2e.multihost $(E2E_ARGS)"

.PHONY: test-e2e-upgrade
test-e2e-upgrade: ## Day two on real VMs, shaped to fit a 2-core TCG host: a kubeadm cluster at KUBERNETES_VERSION_PREVIOUS with its etcd on the host, its control plane then its workers (maxSurge 0) moved to KUBERNETES_VERSION (new machine templates, PodDisruptionBudget honoured); then, in its place, a ClusterClass cluster whose workers roll out a changed variable; the endpoint probed throughout; outside CI like test-e2e-kubeadm.
	$(MAKE) node-image KUBERNETES_VERSION=$(KUBERNETES_VERSION_PREVIOUS)
	$(MAKE) node-image
	CAPL_TEST_NODE_IMAGE_FROM=$(CAPL_IMAGE_DIR)/capl-node-$(KUBERNETES_VERSION_PREVIOUS).qcow2 \
	CAPL_TEST_NODE_VERSIONS=$(NODE_IMAGE_VERSIONS) \
		$(MAKE) test-e2e E2E_TIMEOUT=180m E2E_ARGS="-e2e.upgrade $(E2E_ARGS)"

.PHONY: test-e2e-move
test-e2e-move: ## Bootstrap and pivot on real VMs: a kubeadm cluster moved by the real clusterctl to a second plane (nothing in libvirt changes), the first plane's down leaves it alone, workers scaled from the second, a host power cut; outside CI like test-e2e-kubeadm.
	$(MAKE) test-e2e E2E_TIMEOUT=120m E2E_ARGS="-e2e.move $(E2E_ARGS)"

.PHONY: test-e2e-self-hosted
test-e2e-self-hosted: image-current clusterctl-repo ## A cluster becomes a management cluster on real VMs: a kubeadm cluster from the template, then the real clusterctl init into it from make clusterctl-repo's local repository (offline, every image through the plane's registry, the provider reaching libvirt through the plane's libvirt endpoint); outside CI like test-e2e-kubeadm.
	$(MAKE) test-e2e E2E_TIMEOUT=120m E2E_ARGS="-e2e.self-hosted $(E2E_ARGS)" TEST_E2E_ENV="CAPL_TEST_CLUSTERCTL_REPO=$(CLUSTERCTL_REPO_DIR)"

# The integration tests that skip without CAPL_TEST_SOAK: they boot guests
# the way the e2e's cluster boots them.
SOAK_TESTS := ^(TestBootGuestThroughReservedLease|TestGuestAgent|TestLibvirtMachine|TestNodeImageReadyForKubeadm)$$
.PHONY: test-soak
test-soak: envtest images node-image ## Outside CI: the integration tests that boot guests the e2e covers (CAPL_TEST_SOAK=1), capl-dev driven on a kubeadm cluster (e2e TestCLI: create cluster, exec, load image, logs, stop/start), then the stand-in cluster 3 + 2 (endpoint balancing, reboot, control-plane deletion, worker scaling, 10 manager-kill rounds).
	$(TEST_ENV) CAPL_TEST_SOAK=1 go test $(GO_TEST_FLAGS) -run '$(SOAK_TESTS)' ./pkg/virt/ ./pkg/controllers/ ./images/
	$(MAKE) test-e2e E2E_TIMEOUT=150m E2E_ARGS="-e2e.cli -e2e.stand-in -e2e.soak -e2e.kill-rounds=10 $(E2E_ARGS)"

.PHONY: test-node-image
test-node-image: envtest node-image ## Only the node image's boot test, verbose, with its figures (CAPL_TEST_NODE_KUBEADM_INIT=1 adds a kubeadm init).
	$(TEST_ENV) CAPL_TEST_SOAK=1 go test -count=1 -timeout=40m -v -run TestNodeImageReadyForKubeadm ./images/

.PHONY: test-image
test-image: ## The manager image built twice into fresh directories (same digest, same bytes), then /manager and ssh (also through pkg/hosts' qemu+ssh wrapper) run in a chroot of its root file system as its user (root, minutes).
	go test -tags image -count=1 -timeout=40m -v -run '^TestManagerImage$$' ./images/manager/

.PHONY: test-unit
test-unit: ## Unit tests only: nothing outside the process.
	go test -count=1 -short ./...

.PHONY: fuzz
fuzz: ## Fuzz the image header inspection (FuzzInspect) for FUZZTIME (60s): nothing outside the process.
	go test -run '^$$' -fuzz '^FuzzInspect$$' -fuzztime=$(FUZZTIME) ./pkg/virt/diskimage/

.PHONY: bench
bench: envtest images ## Benchmarks of the libvirt engine; prints figures.
	$(TEST_ENV) go test -run '^$$' -bench . -benchtime=5x ./pkg/...

# Machines of make bench-scale: it measures 100, 300 and N machines (those
# of 100 and 300 below N); SCALE_ARGS adds flags of the benchmark
# (-scale.sizes=, -scale.boot=, -scale.rest=, ...: internal/scalebench).
N ?= 1000
SCALE_ARGS ?=

.PHONY: bench-scale
bench-scale: envtest ## Outside CI: the manager at 100, 300 and N (1000) machines on a simulated libvirt host, with a real kube-apiserver, etcd and Cluster API's core controllers: creation rate and latency, CPU and memory at rest, API requests, libvirt calls, deletion; table and SVG plots in $(ARTIFACTS)/scale (docs/performance.md).
	@mkdir -p $(ARTIFACTS)/scale
	KUBEBUILDER_ASSETS="$$(hack/envtest.sh)" CAPL_SCALE_ARTIFACTS=$(ARTIFACTS)/scale \
		go test -tags scale -count=1 -timeout=6h -v -run '^TestScale$$' ./internal/scalebench/ -args -scale.n=$(N) $(SCALE_ARGS)

.PHONY: bench-tcg
bench-tcg: envtest images ## Guest CPU models under TCG: boot time and in-guest throughput per model (docs/tcg.md).
	$(TEST_ENV) CAPL_BENCH_TCG=1 go test -count=1 -timeout=60m -run '^$$' -bench BenchmarkTCGGuestCPU -benchtime=1x ./pkg/virt/

.PHONY: envtest
envtest: ## Build kube-apiserver and etcd for envtest from the Go module proxy (cached in bin/).
	@hack/envtest.sh >/dev/null

.PHONY: images
images: ## Build the offline test images (cached in $(CAPL_IMAGE_DIR)).
	@hack/timed.sh -- images/build.sh >/dev/null

.PHONY: node-image
node-image: ## Build the Kubernetes node image $(NODE_IMAGE) offline (KUBERNETES_VERSION; cached).
	@KUBERNETES_VERSION=$(KUBERNETES_VERSION) hack/timed.sh -- images/build.sh node >/dev/null

# What the node image of KUBERNETES_VERSION holds (its binaries' VERSIONS,
# in the image as /etc/capl-node-versions).
NODE_IMAGE_VERSIONS = $(CAPL_IMAGE_DIR)/node-bin/$$(KUBERNETES_VERSION=$(KUBERNETES_VERSION) images/node/binaries.sh --key)/VERSIONS

.PHONY: node-image-versions
node-image-versions: node-image ## Print the versions the node image of KUBERNETES_VERSION holds (an upgrade sets CoreDNS's as dns.imageTag).
	@cat $(NODE_IMAGE_VERSIONS)

.PHONY: node-images
node-images: ## Both node images: KUBERNETES_VERSION_PREVIOUS and KUBERNETES_VERSION (the upgrade e2e's)
	@KUBERNETES_VERSION=$(KUBERNETES_VERSION_PREVIOUS) hack/timed.sh -- images/build.sh node >/dev/null
	@KUBERNETES_VERSION=$(KUBERNETES_VERSION) hack/timed.sh -- images/build.sh node >/dev/null

##@ Generate and verify

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code, CRDs, RBAC and webhook configurations, and the plane's embedded copy of them and of Cluster API's.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths=./pkg/controllers/... output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) webhook paths=./pkg/webhooks/... output:webhook:artifacts:config=config/webhook
	hack/plane-manifests.sh

.PHONY: verify
verify: generate $(KUSTOMIZE) ## Fail when generated files are stale, code is not gofmt'ed, go vet complains or config/ does not build.
	@git diff --exit-code -- api config internal/plane/manifests || { echo "generated files are stale: run make generate and commit" >&2; exit 1; }
	@test -z "$$(git status --porcelain -- api config internal/plane/manifests)" || { git status --porcelain -- api config internal/plane/manifests; echo "untracked generated files: run make generate and commit" >&2; exit 1; }
	@out=$$(gofmt -l $$(git ls-files '*.go')); test -z "$$out" || { echo "not gofmt'ed: $$out" >&2; exit 1; }
	go vet ./...
	go vet -tags e2e ./e2e/...
	go vet -tags scale ./internal/scalebench/
	go vet -tags image ./images/manager/
	go vet -tags release ./config/
	cd images/oci && go vet ./...
	$(KUSTOMIZE) build config/default >/dev/null

##@ Release

# The version clusterctl sees in out/ and in the local override; it must be
# in a release series of metadata.yaml.
RELEASE_VERSION ?= v0.1.0
# The manager image the release manifests run (make image and docker-build
# tag it).
IMG ?= ghcr.io/capi-libvirt/cluster-api-provider-libvirt:$(RELEASE_VERSION)
# Where make image writes the manager image: oci/ (an OCI image layout),
# image.tar (the same as one tarball), digest, ref (IMG@digest), revision and
# packages; release-manifests refers to IMG by that digest while it is this
# commit's build of IMG.
MANAGER_IMAGE_DIR ?= $(ROOT)/dist/manager-image
RELEASE_DIR ?= $(ROOT)/out
# clusterctl's configuration directory (XDG), where overrides live.
CLUSTERCTL_CONFIG_DIR ?= $(HOME)/.config/cluster-api
CLUSTERCTL := $(BIN)/clusterctl
# Cluster API release of hack/tools/clusterctl (same as go.mod's).
CLUSTERCTL_VERSION := $(shell awk '{for (i = 1; i < NF; i++) if ($$i == "sigs.k8s.io/cluster-api") print $$(i+1)}' hack/tools/clusterctl/go.mod)

.PHONY: release-manifests
release-manifests: $(KUSTOMIZE) ## Write infrastructure-components.yaml (image $(IMG), by digest after make image), metadata.yaml and the templates to $(RELEASE_DIR).
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)/.kustomize
	printf 'resources:\n- %s\n' "$$(realpath --relative-to=$(RELEASE_DIR)/.kustomize $(ROOT)/config/default)" > $(RELEASE_DIR)/.kustomize/kustomization.yaml
	img=$$(IMG=$(IMG) images/manager/build.sh --ref $(MANAGER_IMAGE_DIR)) && cd $(RELEASE_DIR)/.kustomize && $(KUSTOMIZE) edit set image controller=$$img
	$(KUSTOMIZE) build $(RELEASE_DIR)/.kustomize > $(RELEASE_DIR)/infrastructure-components.yaml
	rm -rf $(RELEASE_DIR)/.kustomize
	cp metadata.yaml templates/*.yaml $(RELEASE_DIR)/

# cert-manager for clusterctl-repo: the newest release whose controllers are
# in its root module. From v1.12 on they are modules of their own that were
# never tagged, so the Go module proxy serves none of them.
CERT_MANAGER_VERSION ?= v1.11.5
# Where make clusterctl-repo writes clusterctl's local repository, its
# clusterctl.yaml and the providers' images (oci/).
CLUSTERCTL_REPO_DIR ?= $(ROOT)/dist/clusterctl-repo

.PHONY: clusterctl-repo
clusterctl-repo: release-manifests $(KUSTOMIZE) $(HELM) ## Everything `clusterctl init --infrastructure libvirt` installs, offline: Cluster API $(CLUSTERCTL_VERSION)'s core and kubeadm providers and cert-manager $(CERT_MANAGER_VERSION) built from their Go modules (images in oci/, pushed by make up into the plane's registry), a local repository with this provider's release manifests, and clusterctl.yaml, in $(CLUSTERCTL_REPO_DIR).
	CERT_MANAGER_VERSION=$(CERT_MANAGER_VERSION) KUBERNETES_VERSION=$(KUBERNETES_VERSION) INFRA_RELEASE_DIR=$(RELEASE_DIR) INFRA_VERSION=$(RELEASE_VERSION) KUSTOMIZE=$(KUSTOMIZE) HELM=$(HELM) \
		hack/timed.sh --key "clusterctl-repo" --what "Cluster API's providers and cert-manager for clusterctl init (images/providers/build.sh)" -- \
		images/providers/build.sh $(CLUSTERCTL_REPO_DIR)

# Where make release writes the release directory.
RELEASE_OUT ?= $(ROOT)/dist/release

.PHONY: release
release: image-current $(KUSTOMIZE) ## What a GitHub release of the provider holds, in $(RELEASE_OUT): infrastructure-components.yaml (the manager by digest), metadata.yaml, the templates, the manager image (manager-image.tar, .digest) and a clusterctl.yaml whose local repository holds it and Cluster API's providers (hack/release.sh).
	$(MAKE) release-manifests RELEASE_DIR=$(RELEASE_OUT)
	IMG=$(IMG) KUSTOMIZE=$(KUSTOMIZE) hack/release.sh $(RELEASE_OUT) $(RELEASE_VERSION) $(MANAGER_IMAGE_DIR)

.PHONY: test-release
test-release: envtest release clusterctl ## make release, then the real clusterctl reads it: init into an envtest API server (kube-apiserver, etcd), generate provider, every flavour through generate cluster; the image's digest checked against the components'.
	$(TEST_ENV) CAPL_TEST_RELEASE_DIR=$(RELEASE_OUT) go test -tags release -count=1 -timeout=10m -v -run '^TestRelease' ./config/

.PHONY: clusterctl-override
clusterctl-override: release-manifests ## Install $(RELEASE_DIR) as clusterctl's local override of infrastructure-libvirt $(RELEASE_VERSION) and register the provider.
	hack/clusterctl-override.sh $(RELEASE_DIR) $(RELEASE_VERSION) $(CLUSTERCTL_CONFIG_DIR)

.PHONY: image
image: ## Build the manager image $(IMG) reproducibly, without Docker, a registry or a base image (Debian .debs and Go modules from their caches, fetched when missing), into $(MANAGER_IMAGE_DIR) (root; images/manager/build.sh).
	IMG=$(IMG) RELEASE_VERSION=$(RELEASE_VERSION) images/manager/build.sh $(MANAGER_IMAGE_DIR)

.PHONY: image-current
image-current: ## make image, unless $(MANAGER_IMAGE_DIR) holds this commit's build of $(IMG) already (a clean checkout).
	@case "$$(IMG=$(IMG) images/manager/build.sh --ref $(MANAGER_IMAGE_DIR) 2>/dev/null)" in \
	*@sha256:*) echo "manager image: $(MANAGER_IMAGE_DIR) holds this commit's build of $(IMG)" ;; \
	*) $(MAKE) image ;; \
	esac

.PHONY: docker-build
docker-build: ## Build the manager image $(IMG) with the Dockerfile (needs a Docker engine; see its header for how it differs from make image).
	docker build -t $(IMG) .

.PHONY: clusterctl
clusterctl: $(CLUSTERCTL) ## Build clusterctl $(CLUSTERCTL_VERSION) from the Go module proxy into bin/.

$(CLUSTERCTL):
	cd hack/tools/clusterctl && GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath \
		-ldflags "-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=$(CLUSTERCTL_VERSION) -X sigs.k8s.io/cluster-api/version.gitTreeState=clean" \
		-o $(CLUSTERCTL) sigs.k8s.io/cluster-api/cmd/clusterctl

$(CONTROLLER_GEN):
	GOBIN=$(BIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)

$(KUSTOMIZE):
	GOBIN=$(BIN) go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)

$(HELM):
	GOBIN=$(BIN) go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

$(GOTESTSUM):
	GOBIN=$(BIN) go install gotest.tools/gotestsum@$(GOTESTSUM_VERSION)

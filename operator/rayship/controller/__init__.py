"""The controller: per-kind render, plan and status (pure), the shared pod builders, the only Kubernetes
I/O (`k8s`), and the kopf wiring. It stands on the contract (`rayship.api`) and never imports the
workloads (KubeRay: `controllers/` beside `apis/ray/v1`)."""

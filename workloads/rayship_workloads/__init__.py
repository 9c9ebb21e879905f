"""rayship_workloads: the Ray Train and Ray Serve programs baked into the workload image."""

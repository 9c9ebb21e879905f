"""The local Kubernetes control plane (no Docker): `build` makes the binaries, `cluster` runs them."""

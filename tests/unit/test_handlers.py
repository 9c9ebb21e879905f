"""The kopf wiring's own logic (no cluster): liveness of the reconcile loop."""

from __future__ import annotations


def test_liveness_fails_while_a_reconcile_is_wedged() -> None:
    import time
    from types import SimpleNamespace

    import pytest

    from rayship import handlers

    memo = SimpleNamespace(config=SimpleNamespace(wedged_seconds=300))
    assert handlers.reconciles_not_wedged(memo=memo) == 0
    handlers._running[-1] = ("TrainingJob ns/stuck", time.monotonic() - 301)
    try:
        with pytest.raises(RuntimeError, match="TrainingJob ns/stuck has been running for 30"):
            handlers.reconciles_not_wedged(memo=memo)
    finally:
        del handlers._running[-1]

"""Shared status building blocks (`rayship.conditions`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rayship.conditions import MAX_MESSAGE, condition, find, owned_changes

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_transition_time_kept_while_status_unchanged() -> None:
    first = condition({}, "Ready", True, "Ready", "up", 3, NOW)
    stored = {"conditions": [first]}
    same = condition(stored, "Ready", True, "Ready", "still up", 4, NOW + timedelta(minutes=5))
    flipped = condition(stored, "Ready", False, "Down", "gone", 4, NOW + timedelta(minutes=9))
    assert same["lastTransitionTime"] == "2026-01-01T00:00:00Z" and same["observedGeneration"] == 4
    assert flipped["lastTransitionTime"] == "2026-01-01T00:09:00Z"


def test_long_messages_are_truncated_under_the_api_limit() -> None:
    cond = condition({}, "Failed", True, "AppFailed", "x" * 100_000, 1, NOW)
    assert len(cond["message"]) <= MAX_MESSAGE < 32768 and cond["message"].endswith("(truncated)")


def test_find_and_owned_changes() -> None:
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert (
        find(status, "Ready")["status"] == "True" and find(status, "Missing") == {} and find(None, "x") == {}
    )
    assert owned_changes(status, {"phase": "Running"}) == {}
    assert owned_changes(status, {"phase": "Failed", "conditions": []}) == {
        "phase": "Failed",
        "conditions": [],
    }

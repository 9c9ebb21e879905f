"""When runs are due, against CronJob's documented behaviour (kube-controller-manager uses robfig/cron):
time zones, daylight-saving changes, missed times, and at most one catch-up run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rayship.controller.trainingschedule import TOO_MANY_MISSED, due, next_after
from rayship.controller.trainingschedule.cron import Due


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def test_every_minute_is_due_at_the_next_whole_minute() -> None:
    assert next_after("* * * * *", None, utc(2026, 11, 28, 5, 0, 30)) == utc(2026, 11, 28, 5, 1)
    assert next_after("* * * * *", None, utc(2026, 11, 28, 5, 1)) == utc(2026, 11, 28, 5, 2)  # strictly after


def test_the_schedule_is_read_in_its_time_zone_across_summer_time() -> None:
    # 03:00 in Berlin is 02:00 UTC in winter (CET) and 01:00 UTC in summer (CEST)
    assert next_after("0 3 * * *", "Europe/Berlin", utc(2026, 1, 10)) == utc(2026, 1, 10, 2)
    assert next_after("0 3 * * *", "Europe/Berlin", utc(2026, 7, 10)) == utc(2026, 7, 10, 1)
    assert next_after("0 3 * * *", None, utc(2026, 7, 10)) == utc(2026, 7, 10, 3)  # unset: Etc/UTC


def test_a_time_the_clock_skips_does_not_run() -> None:
    # New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT, so 02:30 never happens that day (robfig/cron:
    # "jobs scheduled during daylight-savings leap-ahead transitions will not be run")
    after = utc(2026, 3, 7, 12)
    assert next_after("30 2 * * *", "America/New_York", after) == utc(
        2026, 3, 9, 6, 30
    )  # 02:30 EDT on the 9th
    # the hour after the jump runs as usual
    assert next_after("30 3 * * *", "America/New_York", after) == utc(2026, 3, 8, 7, 30)  # 03:30 EDT
    assert due("30 2 * * *", "America/New_York", after, utc(2026, 3, 9)).count == 0


def test_a_time_the_clock_repeats_runs_at_both_instants() -> None:
    # New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST, so 01:30 happens twice (as in robfig/cron)
    first = next_after("30 1 * * *", "America/New_York", utc(2026, 10, 31, 12))
    assert first == utc(2026, 11, 1, 5, 30)  # 01:30 EDT
    assert next_after("30 1 * * *", "America/New_York", first) == utc(2026, 11, 1, 6, 30)  # 01:30 EST


def test_only_the_latest_missed_time_is_due_with_the_count_of_missed_ones() -> None:
    found = due("0 * * * *", None, utc(2026, 11, 28, 0, 30), utc(2026, 11, 28, 5, 10))
    assert found.time == utc(2026, 11, 28, 5) and found.count == 5  # 01:00 ... 05:00


def test_nothing_is_due_in_an_empty_window_or_before_the_first_time() -> None:
    assert due("0 * * * *", None, utc(2026, 11, 28, 5, 0), utc(2026, 11, 28, 5, 59)).time is None
    assert due("0 * * * *", None, utc(2026, 11, 28, 6), utc(2026, 11, 28, 5)).time is None
    # the window is (after, until]: a time equal to `after` ran already; one equal to `until` is due
    assert due("0 * * * *", None, utc(2026, 11, 28, 5), utc(2026, 11, 28, 6)).time == utc(2026, 11, 28, 6)


def test_too_many_missed_times_are_counted_as_such_and_the_latest_still_found() -> None:
    # the operator was down for a week under an every-minute schedule
    found = due("* * * * *", None, utc(2026, 11, 21), utc(2026, 11, 28, 5, 7, 30))
    assert found.count == TOO_MANY_MISSED + 1 and found.time == utc(2026, 11, 28, 5, 7)


def test_the_latest_missed_time_found_backwards_skips_a_time_the_clock_skipped() -> None:
    # 200 days of a daily 02:30 in New York ending on the day 02:30 did not exist
    found = due("30 2 * * *", "America/New_York", utc(2025, 8, 20), utc(2026, 3, 8, 12))
    assert found.count == TOO_MANY_MISSED + 1 and found.time == utc(2026, 3, 7, 7, 30)  # 02:30 EST on the 7th


@pytest.mark.parametrize("schedule", ["@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@midnight"])
def test_macros_are_due_as_cron_defines_them(schedule: str) -> None:
    found = next_after(schedule, None, utc(2026, 11, 28, 5, 7))
    assert found is not None and found.minute == 0 and found > utc(2026, 11, 28, 5, 7)
    assert found - utc(2026, 11, 28, 5, 7) <= timedelta(days=366)


def test_a_schedule_that_is_never_due_has_no_next_time() -> None:
    assert next_after("0 0 30 2 *", None, utc(2026, 11, 28)) is None  # February 30th
    assert due("0 0 30 2 *", None, utc(2026, 11, 28), utc(2031, 1, 1)) == Due(None, 0)

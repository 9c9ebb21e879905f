"""When a TrainingSchedule's runs are due, by CronJob's rules (its controller uses robfig/cron), all
pure: croniter walks the schedule in the schedule's time zone (`zoneinfo`).

- A wall-clock time that a daylight-saving change skips does not run (robfig/cron: "jobs scheduled
  during daylight-savings leap-ahead transitions will not be run"); croniter would move it to the
  next existing minute, so its times are kept only where the wall clock matches the expression.
  A wall-clock time the change repeats runs at both instants, as robfig/cron does.
- Missed times (the operator down, suspended, Forbid): only the most recent one since the last run
  is started (at most one catch-up run), and only within startingDeadlineSeconds when that is set;
  more than 100 missed times are reported as such (CronJob's "too many missed start times").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

DEFAULT_ZONE = "Etc/UTC"
TOO_MANY_MISSED = 100
# The next due time is looked for at most this far ahead (a schedule such as "0 0 30 2 *" never runs).
HORIZON = timedelta(days=5 * 366)


@dataclass(frozen=True)
class Due:
    """The most recent time a run was due in a window, and how many times were (capped at
    TOO_MANY_MISSED + 1)."""

    time: datetime | None
    count: int


def zone(name: str | None) -> ZoneInfo:
    return ZoneInfo(name or DEFAULT_ZONE)


def _on_the_wall(schedule: str, moment: datetime) -> bool:
    """Whether `moment`'s wall-clock time (in its zone) matches the schedule, rather than being where
    croniter moved a time the clock skipped."""
    return bool(croniter.match(schedule, moment.replace(tzinfo=None)))


def next_after(schedule: str, zone_name: str | None, moment: datetime) -> datetime | None:
    """The first due time strictly after `moment` (UTC), None within HORIZON."""
    walk = croniter(schedule, moment.astimezone(zone(zone_name)))
    limit = moment + HORIZON
    try:
        while (found := walk.get_next(datetime)) <= limit:
            if _on_the_wall(schedule, found):
                return found.astimezone(UTC)
    except CroniterBadDateError:  # a date that never comes (February 30th): croniter gives up
        pass
    return None


def due(schedule: str, zone_name: str | None, after: datetime, until: datetime) -> Due:
    """The due times in (after, until]: the most recent, and their count."""
    if until <= after:
        return Due(None, 0)
    tz = zone(zone_name)
    forward = croniter(schedule, after.astimezone(tz))
    count, latest = 0, None
    try:
        while count <= TOO_MANY_MISSED and (found := forward.get_next(datetime)) <= until:
            if _on_the_wall(schedule, found):
                count, latest = count + 1, found
    except CroniterBadDateError:  # a date that never comes (February 30th): nothing is due
        return Due(None, 0)
    if count <= TOO_MANY_MISSED:
        return Due(latest.astimezone(UTC) if latest else None, count)
    # Too many to walk: the latest is found walking back from `until` (a second past it: croniter's
    # previous time is strictly before its start).
    backward = croniter(schedule, (until + timedelta(seconds=1)).astimezone(tz))
    while (found := backward.get_prev(datetime)) > after:
        if _on_the_wall(schedule, found):
            return Due(found.astimezone(UTC), count)
    raise AssertionError("unreachable: a due time was found walking forward")

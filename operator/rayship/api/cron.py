"""A cron schedule as Kubernetes' CronJob reads it (robfig/cron v3's standard parser, which the CronJob
API validation calls): what it refuses, in its own words. croniter, which rayship computes run times
with, takes more (day of week 7, `L`, a reversed range); a schedule rayship took must be one a CronJob
would, so a user moving between the two meets the same rules."""

from __future__ import annotations

from dataclasses import dataclass

DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")


@dataclass(frozen=True)
class _Bounds:
    low: int
    high: int
    names: tuple[str, ...] = ()  # names[i] means low + i


_FIELDS = (
    _Bounds(0, 59),  # minute
    _Bounds(0, 23),  # hour
    _Bounds(1, 31),  # day of month
    _Bounds(1, 12, ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")),
    _Bounds(0, 6, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),  # day of week
)


def _number(text: str) -> int:
    """Go's strconv.Atoi, then robfig's refusal of negatives."""
    body = text[1:] if text[:1] in "+-" else text
    if not body.isascii() or not body.isdigit():
        raise ValueError(f'failed to parse int from {text}: strconv.Atoi: parsing "{text}": invalid syntax')
    number = int(text)
    if number < 0:
        raise ValueError(f"negative number ({number}) not allowed: {text}")
    return number


def _value(text: str, bounds: _Bounds) -> int:
    lowered = text.lower()
    if lowered in bounds.names:
        return bounds.low + bounds.names.index(lowered)
    return _number(text)


def _range(expr: str, bounds: _Bounds) -> None:
    """robfig's getRange: `*`/`?`, a value, low-high, each with an optional /step."""
    range_and_step = expr.split("/")
    low_and_high = range_and_step[0].split("-")
    if low_and_high[0] in ("*", "?"):
        start, end = bounds.low, bounds.high
    else:
        start = _value(low_and_high[0], bounds)
        if len(low_and_high) == 1:
            end = start
        elif len(low_and_high) == 2:
            end = _value(low_and_high[1], bounds)
        else:
            raise ValueError(f"too many hyphens: {expr}")
    if len(range_and_step) == 1:
        step = 1
    elif len(range_and_step) == 2:
        step = _number(range_and_step[1])
        if len(low_and_high) == 1:
            end = bounds.high  # "N/step" means "N-max/step"
    else:
        raise ValueError(f"too many slashes: {expr}")
    if start < bounds.low:
        raise ValueError(f"beginning of range ({start}) below minimum ({bounds.low}): {expr}")
    if end > bounds.high:
        raise ValueError(f"end of range ({end}) above maximum ({bounds.high}): {expr}")
    if start > end:
        raise ValueError(f"beginning of range ({start}) beyond end of range ({end}): {expr}")
    if step == 0:
        raise ValueError(f"step of range should be a positive number: {expr}")


def problem(schedule: str) -> str | None:
    """Why a CronJob would refuse `schedule` (robfig's words), or None. `@every` is refused too:
    rayship computes run times with croniter, which has no such form."""
    if schedule.startswith("@every"):
        return (
            "@every is a CronJob form rayship does not take (its run times come from croniter): five fields"
        )
    if schedule.startswith("@"):
        return None if schedule in DESCRIPTORS else f"unrecognized descriptor: {schedule}"
    fields = schedule.split()
    if len(fields) != len(_FIELDS):
        return f"expected exactly 5 fields, found {len(fields)}: {fields}"
    try:
        for field, bounds in zip(fields, _FIELDS, strict=True):
            for expr in field.split(","):
                _range(expr, bounds)
    except ValueError as err:
        return str(err)
    return None

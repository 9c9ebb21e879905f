"""The operator fixtures' check for refused requests (`refused_lines`), on log lines the operator wrote."""

from __future__ import annotations

from datetime import datetime

from tests.operator.conftest import refused_lines

LOG = """\
[2026-11-25 16:05:27,403] kopf.objects [INFO] reconciled
HTTP response headers: HTTPHeaderDict({'Audit-Id': 'a7622e4a-92c3-403d-8b9e-c77128bf8acb', 'Retry-After': '1'})
[2026-11-25 16:05:28,100] kopf.objects [ERROR] Handler 'create' failed: (403)
Reason: Forbidden
HTTP response body: serviceaccounts is forbidden
[2026-11-25 16:05:40,001] kopf.objects [WARNING] Event: namespace cp-test is being terminated: Forbidden, because it is being terminated
"""


def test_ids_and_milliseconds_are_not_refusals_and_a_real_one_is_caught_with_its_lines() -> None:
    assert refused_lines(LOG) == [
        "[2026-11-25 16:05:28,100] kopf.objects [ERROR] Handler 'create' failed: (403)",
        "Reason: Forbidden",
        "HTTP response body: serviceaccounts is forbidden",
    ]


def test_unstamped_lines_take_the_time_of_the_line_before_them() -> None:
    assert refused_lines(LOG, expected_until=datetime(2026, 11, 25, 16, 5, 28)) == []
    assert len(refused_lines(LOG, expected_until=datetime(2026, 11, 25, 16, 5, 27))) == 3

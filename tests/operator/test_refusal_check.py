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
[2026-11-26 13:31:54,988] rayship [INFO] ModelService op-1/mlp: the API server does not know the owner's kind yet: secrets "mlp-ray-token" is forbidden: cannot set blockOwnerDeletion in this case because cannot find RESTMapping for APIVersion rayship.dev/v1alpha1 Kind ModelService: no matches for kind "ModelService" in version "rayship.dev/v1alpha1"; again in 5 s (attempt 2 of 3)
"""


def test_ids_milliseconds_and_discovery_lag_are_not_refusals_and_a_real_one_is_caught() -> None:
    assert refused_lines(LOG) == [
        "[2026-11-25 16:05:28,100] kopf.objects [ERROR] Handler 'create' failed: (403)",
        "Reason: Forbidden",
        "HTTP response body: serviceaccounts is forbidden",
    ]


def test_unstamped_lines_take_the_time_of_the_line_before_them() -> None:
    assert refused_lines(LOG, expected_until=datetime(2026, 11, 25, 16, 5, 28)) == []
    assert len(refused_lines(LOG, expected_until=datetime(2026, 11, 25, 16, 5, 27))) == 3

"""rayship_workloads.serve: the Ray Serve application over real HTTP on local Ray (CPU).

One Serve instance per module (a free loopback port): an MLP app under /tabular (text models:
`test_serve_llm`). Models are made here; nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch

from rayship.api import ServeArgs
from rayship_workloads import haproxy_launcher, models, recipes
from rayship_workloads import serve as serve_module
from rayship_workloads.serve import BadRequest, app_builder, parse_instances, serve_locally
from rayship_workloads.serve_ingress import HAPROXY_BINARY_ENV, haproxy_folder, shutdown_serve
from tests.workloads.serve_http import call, declared_but_not_sent, free_port

pytestmark = pytest.mark.workloads

IN_FEATURES, HIDDEN, OUT_FEATURES = 8, [16, 16], 2
CLIENTS = 16


def expected(model: torch.nn.Module, rows: list[list[float]]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(rows))


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> tuple[recipes.MLP, Path]:
    torch.manual_seed(1234)
    model = recipes.MLP(IN_FEATURES, HIDDEN, OUT_FEATURES).eval()
    setup = recipes.ModelSetup({"in_features": IN_FEATURES, "hidden": HIDDEN, "out_features": OUT_FEATURES})
    return model, models.export(tmp_path_factory.mktemp("mlp"), "mlp", setup, model.state_dict())


@pytest.fixture(scope="module")
def server(ray_session: None, mlp: tuple[recipes.MLP, Path]) -> Iterator[str]:
    """The MLP served under /tabular; Serve is shut down with the module."""

    try:
        yield serve_locally(
            str(mlp[1]),
            port=free_port(),
            route_prefix="/tabular",
            max_batch_size=CLIENTS,
            batch_wait_timeout_s=0.05,
            num_cpus=0.5,
        )
    finally:
        shutdown_serve()


def test_predict_matches_the_model(server: str, mlp: tuple[recipes.MLP, Path]) -> None:
    rows = torch.randn(5, IN_FEATURES, generator=torch.Generator().manual_seed(7)).tolist()
    for batch in (rows, rows[:1]):
        status, body = call("POST", f"{server}/predict", {"instances": batch})
        assert status == 200, body
        predictions = torch.tensor(body["predictions"])
        assert predictions.shape == (len(batch), OUT_FEATURES)
        torch.testing.assert_close(predictions, expected(mlp[0], batch), rtol=0, atol=1e-5)


def test_concurrent_requests_share_batches(server: str, mlp: tuple[recipes.MLP, Path]) -> None:
    before = call("GET", f"{server}/stats")[1]
    generator = torch.Generator().manual_seed(11)
    inputs = [torch.randn(1 + i % 3, IN_FEATURES, generator=generator).tolist() for i in range(CLIENTS)]
    results: dict[int, tuple[int, dict[str, Any]]] = {}
    barrier = threading.Barrier(CLIENTS)

    def client(i: int) -> None:
        barrier.wait()
        results[i] = call("POST", f"{server}/predict", {"instances": inputs[i]})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert sorted(results) == list(range(CLIENTS))
    for i, (status, body) in results.items():  # every client gets its own rows back, in order
        assert status == 200, body
        torch.testing.assert_close(
            torch.tensor(body["predictions"]), expected(mlp[0], inputs[i]), rtol=0, atol=1e-5
        )
    after = call("GET", f"{server}/stats")[1]
    new = after["batch_sizes"][len(before["batch_sizes"]) :]
    assert sum(new) == CLIENTS, new  # each request went through the batcher exactly once
    assert max(new) > 1, f"no batch of more than one request formed: {new}"
    # the counters say the same as the window (which a long run fills)
    assert after["batches"] - before["batches"] == len(new)
    assert after["batched_requests"] - before["batched_requests"] == CLIENTS


GOOD_ROW = [0.5] * IN_FEATURES


def test_rows_of_plain_numbers_take_the_fast_path_and_everything_else_the_checks() -> None:
    """parse_instances reads a row of finite numbers in one pass; what that pass cannot vouch for goes
    through the value-by-value checks, with the same result or the same error as before."""
    assert parse_instances({"instances": [[1, 2.5, -3]]}, 3) == [[1.0, 2.5, -3.0]]
    assert serve_module._plain_numbers([1, 2.5, -3], 3) == [1.0, 2.5, -3.0]
    for unplain in ([1, True, 3], [1, "2", 3], [1, float("nan"), 3], [1e308, 1e308, 0], [1, 2]):
        assert serve_module._plain_numbers(unplain, 3) is None, unplain
    # finite values whose sum is past the float range: the checks accept them one by one
    assert parse_instances({"instances": [[1e308, 1e308, 0]]}, 3) == [[1e308, 1e308, 0.0]]
    for row, error in (
        ([1, True, 3], "instances[0][1] is not a number"),
        ([1, float("inf"), 3], "instances[0][1] is not finite"),
        ([10**400, 2, 3], "instances[0][0] is out of range"),
        ([1, 2], "instances[0] has 2 features"),
    ):
        with pytest.raises(BadRequest, match=re.escape(error)):
            parse_instances({"instances": [row]}, 3)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"instances": [[1, 2', "not valid JSON"),
        (b"\xff\xfe garbage", "not valid JSON"),
        (b"[[1, 2, 3]]", "must be a JSON object"),
        (json.dumps({"rows": [GOOD_ROW]}).encode(), "missing field 'instances'"),
        (json.dumps({"instances": [GOOD_ROW], "extra": 1}).encode(), "unknown field 'extra'"),
        (json.dumps({"instances": []}).encode(), "non-empty list"),
        (json.dumps({"instances": GOOD_ROW}).encode(), "instances[0] must be a list"),
        (json.dumps({"instances": [GOOD_ROW, [1.0, 2.0]]}).encode(), "instances[1] has 2 features"),
        (json.dumps({"instances": [[*GOOD_ROW[:-1], "x"]]}).encode(), f"instances[0][{IN_FEATURES - 1}]"),
        (json.dumps({"instances": [[True, *GOOD_ROW[1:]]]}).encode(), "is not a number"),
        (json.dumps({"instances": [[float("nan"), *GOOD_ROW[1:]]]}).encode(), "not finite"),
        (json.dumps({"instances": [[10**400, *GOOD_ROW[1:]]]}).encode(), "out of range"),
        (json.dumps({"instances": [[1e300, *GOOD_ROW[1:]]]}).encode(), "out of range for torch.float32"),
    ],
    ids=[
        "truncated-json",
        "not-utf8",
        "array-body",
        "missing-instances",
        "unknown-field",
        "empty-list",
        "flat-row",
        "wrong-feature-count",
        "string-value",
        "boolean-value",
        "nan-value",
        "huge-integer",
        "float32-range",
    ],
)
def test_malformed_predict_is_400(server: str, raw: bytes, message: str) -> None:
    status, body = call("POST", f"{server}/predict", raw=raw)
    assert status == 400, body
    assert message in body["error"], body


def test_outputs_that_overflow_are_400(server: str, mlp: tuple[recipes.MLP, Path]) -> None:
    row = [3e38] * IN_FEATURES  # finite in float32, but the first layer's sums are not
    assert not torch.isfinite(expected(mlp[0], [row])).all()
    status, body = call("POST", f"{server}/predict", {"instances": [row]})
    assert status == 400 and "non-finite outputs" in body["error"], body


def test_healthz(server: str, mlp: tuple[recipes.MLP, Path]) -> None:
    assert call("GET", f"{server}/healthz") == (
        200,
        {"status": "ok", "recipe": "mlp", "model_uri": str(mlp[1])},
    )


# --- the ingress: HAProxy as rayship starts it (rayship-haproxy) ---------------------------------------


def test_a_client_that_trickles_its_request_is_cut_off_in_time_while_others_are_served(
    server: str, mlp: tuple[recipes.MLP, Path]
) -> None:
    """Slow loris against the real endpoint: connections that send their headers, or a declared body, a
    byte at a time (each byte restarting `timeout client`, Serve's only bound: 3600 s) are answered 408
    and closed: headers by HAProxy once its request time bound has passed, a body by the server once
    its body time bound has; other clients are served all along."""
    assert os.environ[HAPROXY_BINARY_ENV].endswith("rayship-haproxy"), "Serve starts rayship's launcher"
    parts = urllib.parse.urlsplit(server)
    head = f"POST {parts.path}/predict HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
    started = time.monotonic()
    trickling = [socket.create_connection((parts.hostname, parts.port), timeout=10) for _ in range(4)]
    answers: dict[int, tuple[float, bytes]] = {}  # connection -> (seconds after its first byte, reply)
    bounds = {1: haproxy_launcher.REQUEST_TIMEOUT_S, 0: serve_module.BODY_TIMEOUT_S}  # by i % 2
    try:
        for i, sock in enumerate(trickling):  # half trickle headers, half a declared body
            sock.sendall(head.encode() if i % 2 else f"{head}Content-Length: 1000\r\n\r\n{{".encode())
        while len(answers) < len(trickling) and time.monotonic() - started < max(bounds.values()) + 10:
            for i, sock in enumerate(trickling):
                if i in answers:
                    continue
                if select.select([sock], [], [], 0)[0]:  # answered (and closed)
                    answers[i] = (time.monotonic() - started, sock.recv(4096))
                    continue
                sock.sendall(f"X-Slow-{i}: 1\r\n".encode() if i % 2 else b" ")
            status, body = call("POST", f"{server}/predict", {"instances": [[0.5] * IN_FEATURES]})
            assert status == 200 and len(body["predictions"]) == 1, body
            time.sleep(0.5)
    finally:
        for sock in trickling:
            sock.close()
    assert len(answers) == len(trickling), f"still open: {sorted(set(range(4)) - set(answers))}"
    for i, (after, reply) in answers.items():
        assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
        assert bounds[i % 2] - 1 <= after <= bounds[i % 2] + 5, (
            f"{i}: answered {after:.1f} s after its first byte"
        )
    body_reply = answers[0][1]
    assert b"request body not received within 30 s" in body_reply, body_reply[-300:]


def test_headers_over_haproxy_s_buffer_are_refused_and_the_connection_closed(server: str) -> None:
    parts = urllib.parse.urlsplit(server)
    big = "X-Big: " + "a" * 20_000
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(f"GET {parts.path}/-/healthz HTTP/1.1\r\nHost: x\r\n{big}\r\n\r\n".encode())
        reply = sock.recv(4096)
        while chunk := sock.recv(4096):  # then closed: recv gives b"" (a hang fails on the timeout)
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]


def test_haproxy_s_stats_page_listens_on_loopback_only(server: str) -> None:
    """Serve's template binds the stats listener on every interface; rayship's launcher moves it to
    127.0.0.1. The HAProxy running for this node is read from the kernel's own list of its sockets."""
    import psutil
    import ray

    folder = os.path.join(haproxy_folder(ray.get_runtime_context().get_node_id()), "")
    stats = int(os.environ["RAY_SERVE_HAPROXY_STATS_PORT"])

    def listening() -> set[tuple[str, int]]:
        """What the HAProxy processes reading a config in `folder` listen on (one of a reload may end
        meanwhile: it is passed over)."""
        found = set()
        for process in psutil.process_iter(["cmdline"]):
            if any(arg.startswith(folder) for arg in (process.info["cmdline"] or [])):
                with contextlib.suppress(psutil.NoSuchProcess):  # gone since the listing
                    found |= {(c.laddr.ip, c.laddr.port) for c in process.net_connections("tcp")
                              if c.status == psutil.CONN_LISTEN}  # fmt: skip
        return found

    deadline = time.monotonic() + 30
    while ("127.0.0.1", stats) not in (found := listening()) and time.monotonic() < deadline:
        time.sleep(0.5)  # an HAProxy between reloads
    assert ("127.0.0.1", stats) in found, (folder, stats, found)
    assert not [addr for addr in found if addr[1] == stats and addr[0] != "127.0.0.1"], found
    metrics = int(os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"])
    assert any(port == metrics for _, port in found), "the Prometheus exporter stays where it was"


def test_generate_on_an_mlp_is_400(server: str) -> None:
    status, body = call("POST", f"{server}/generate", {"prompt": "hello", "max_new_tokens": 4})
    assert status == 400, body
    assert "causal-lm" in body["error"] and "'mlp'" in body["error"], body


# --- request limits -----------------------------------------------------------------------------

LIMIT_BYTES, LIMIT_ROWS = 2048, 4


@pytest.fixture(scope="module")
def limited_server(server: str, mlp: tuple[recipes.MLP, Path]) -> Iterator[str]:
    """The MLP again under /limited with small limits, from camelCase args."""
    from ray import serve

    args = {
        "modelUri": str(mlp[1]),
        "routePrefix": "/limited",
        "numCpus": 0.25,
        "maxRequestBytes": LIMIT_BYTES,
        "maxRowsPerRequest": LIMIT_ROWS,
    }
    serve.run(app_builder(args), name="rayship-limited", route_prefix="/limited")
    try:
        yield server.removesuffix("/tabular") + "/limited"
    finally:
        serve.delete("rayship-limited")


def padded(body: dict[str, Any], size: int) -> bytes:
    """`body` as JSON padded with spaces to exactly `size` bytes."""
    raw = json.dumps(body).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def test_body_over_the_byte_limit_is_413(limited_server: str) -> None:
    raw = padded({"instances": [GOOD_ROW]}, LIMIT_BYTES + 1)
    status, body = call("POST", f"{limited_server}/predict", raw=raw)
    assert status == 413, body
    assert f"over {LIMIT_BYTES} bytes (maxRequestBytes)" in body["error"] and "\n" not in body["error"], body


def test_chunked_body_over_the_byte_limit_is_413(limited_server: str) -> None:
    """No Content-Length: the body is cut while it is read."""
    raw = padded({"instances": [GOOD_ROW]}, LIMIT_BYTES + 1)
    chunks = iter([raw[:1000], raw[1000:2000], raw[2000:]])
    request = urllib.request.Request(
        f"{limited_server}/predict", data=chunks, method="POST", headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=60)
    assert request.get_header("Transfer-encoding") == "chunked"
    assert err.value.code == 413
    assert "maxRequestBytes" in json.loads(err.value.read())["error"]


def test_body_at_the_byte_limit_is_served(limited_server: str, mlp: tuple[recipes.MLP, Path]) -> None:
    status, body = call(
        "POST", f"{limited_server}/predict", raw=padded({"instances": [GOOD_ROW]}, LIMIT_BYTES)
    )
    assert status == 200, body
    torch.testing.assert_close(
        torch.tensor(body["predictions"]), expected(mlp[0], [GOOD_ROW]), rtol=0, atol=1e-5
    )


def test_rows_over_the_row_limit_are_413(limited_server: str) -> None:
    status, body = call("POST", f"{limited_server}/predict", {"instances": [GOOD_ROW] * (LIMIT_ROWS + 1)})
    assert status == 413, body
    assert f"over {LIMIT_ROWS} rows per request (maxRowsPerRequest)" in body["error"], body


def test_rows_at_the_row_limit_are_served(limited_server: str) -> None:
    status, body = call("POST", f"{limited_server}/predict", {"instances": [GOOD_ROW] * LIMIT_ROWS})
    assert status == 200, body
    assert len(body["predictions"]) == LIMIT_ROWS


def test_default_limits(server: str) -> None:
    """8 MiB and 4096 rows unless configured: the module's server keeps the defaults. An oversized
    Content-Length is refused before the body is read."""
    args = ServeArgs(model_uri="/m")
    assert (args.max_request_bytes, args.max_rows_per_request) == (8 * 1024 * 1024, 4096)
    status, body = declared_but_not_sent(f"{server}/predict", 50 * 1024 * 1024)
    assert status == 413 and "over 8388608 bytes (maxRequestBytes)" in body["error"], body
    status, body = call("POST", f"{server}/predict", {"instances": [GOOD_ROW] * 4097})
    assert status == 413 and "over 4096 rows" in body["error"], body
    status, body = call("POST", f"{server}/predict", {"instances": [GOOD_ROW] * 4096})
    assert status == 200 and len(body["predictions"]) == 4096, body


def test_serve_args_validation() -> None:
    args = ServeArgs.model_validate({"modelUri": "s3://b/m", "maxBatchSize": 8, "batchWaitTimeoutS": 0.1})
    limits = ServeArgs.model_validate({"modelUri": "/m", "maxRequestBytes": 100, "maxRowsPerRequest": 2})
    assert (limits.max_request_bytes, limits.max_rows_per_request) == (100, 2)
    assert (args.model_uri, args.max_batch_size, args.batch_wait_timeout_s) == ("s3://b/m", 8, 0.1)
    assert ServeArgs(model_uri="/m", min_replicas=2, max_replicas=2).max_replicas == 2
    bad: list[dict[str, Any]] = [
        {"modelUri": "/m", "minReplicas": 3, "maxReplicas": 2},
        {},
        {"modelUri": "/m", "modelURI": "/n"},  # unknown key (typo): rejected, not ignored
        {"modelUri": "/m", "maxBatchSize": 0},
        {"modelUri": "/m", "maxBatchSize": 2000},
        {"modelUri": "/m", "batchWaitTimeoutS": 11},
        {"modelUri": "/m", "maxBatchSize": True},
        {"modelUri": "/m", "routePrefix": "api"},
        {"modelUri": "/m", "targetOngoingRequests": float("inf")},
        {"modelUri": "/m", "maxRequestBytes": 0},
        {"modelUri": "/m", "maxRowsPerRequest": 0},
    ]
    for case in bad:
        with pytest.raises(pydantic.ValidationError):
            ServeArgs.model_validate(case)
    with pytest.raises(pydantic.ValidationError, match=r"min_replicas \(3\) > max_replicas \(2\)"):
        ServeArgs.model_validate(bad[0])


def test_app_builder_takes_a_camel_case_dict() -> None:
    from ray.serve import Application
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    args = {"modelUri": "/m", "maxBatchSize": 4, "minReplicas": 1, "maxReplicas": 3, "numCpus": 0.5}
    # The call Ray makes for serveConfigV2 `import_path` + `args`.
    app = call_user_app_builder_with_args_if_necessary(app_builder, args)
    assert isinstance(app, Application)
    deployment = app._bound_deployment  # no public accessor for a bound application's options
    autoscaling = deployment._deployment_config.autoscaling_config
    assert (autoscaling.min_replicas, autoscaling.max_replicas) == (1, 3)
    assert autoscaling.target_ongoing_requests == 5
    assert deployment.ray_actor_options["num_cpus"] == 0.5
    assert deployment.max_ongoing_requests >= 4  # room for a full batch
    with pytest.raises(pydantic.ValidationError):
        app_builder({"modelUri": "/m", "minReplicas": 2, "maxReplicas": 1})

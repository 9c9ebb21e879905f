"""Text models over HTTP: /generate and the OpenAI-compatible /v1 routes (completions, chat, streaming,
sampling parameters) with a tiny randomly initialised GPT-2 served from its save_pretrained directory.
Every expected text is what transformers' own generate() gives for the same model, prompt and seed.
Nothing is downloaded."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rayship_workloads import llm, models
from rayship_workloads.serve import serve_locally
from rayship_workloads.serve_ingress import shutdown_serve
from tests.workloads.serve_http import call, declared_but_not_sent, free_port, http_chunks, sse_events

pytestmark = pytest.mark.workloads

POSITIONS = 64
MODEL_NAME = "tiny-gpt2"


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=260, n_positions=POSITIONS)
    model = AutoModelForCausalLM.from_config(config).eval()
    directory = tmp_path_factory.mktemp("lm")
    model.save_pretrained(directory)
    models.write_manifest(directory, "causal-lm", {"n_layer": 1, "n_embd": 16}, tokenizer="bytes")
    return model, directory


@pytest.fixture(scope="module")
def lm(ray_session: None, tiny_lm: tuple[torch.nn.Module, Path]) -> Iterator[str]:
    """The tiny LM served under /lm (its own Serve instance, shut down with the module)."""

    try:
        yield serve_locally(
            str(tiny_lm[1]), port=free_port(), route_prefix="/lm", num_cpus=0.5, model_name=MODEL_NAME
        )
    finally:
        shutdown_serve()


def text(ids: list[int]) -> str:
    """The byte-level tokenizer's decoding (ids >= 256 are special: no text)."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def reference(
    model: torch.nn.Module,
    prompt: str,
    max_new_tokens: int,
    *,
    temperature: float = 0,
    top_p: float = 1,
    seed: int = 0,
) -> str:
    """transformers' generate() on the test's own copy of the model: greedy, or seeded sampling."""
    ids = torch.tensor([list(prompt.encode())])
    options: dict[str, Any] = {"do_sample": False}
    if temperature > 0:
        options = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            pad_token_id=model.config.eos_token_id,
            **options,
        )
    return text(out[0, ids.shape[1] :].tolist())


def streamed(url: str, body: dict[str, Any]) -> list[dict[str, Any] | str]:
    """The events of one streamed request, checked chunk by chunk: text/event-stream, every HTTP chunk
    whole `data: ...` events, JSON payloads, then `data: [DONE]` last."""
    headers, chunks = http_chunks(url, {**body, "stream": True})
    assert headers["content-type"].startswith("text/event-stream"), headers
    payloads: list[dict[str, Any] | str] = []
    for event in sse_events(chunks):
        assert event.startswith(b"data: ") and event.endswith(b"\n\n"), event
        data = event[len(b"data: ") : -2].decode()
        payloads.append(data if data == "[DONE]" else json.loads(data))
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1], payloads
    return payloads


# --- /generate ----------------------------------------------------------------------------------


def test_generate_greedy(lm: str, tiny_lm: tuple[torch.nn.Module, Path]) -> None:
    want = reference(tiny_lm[0], "hello", 8)
    first = call("POST", f"{lm}/generate", {"prompt": "hello", "max_new_tokens": 8})
    assert first == (200, {"text": want})
    assert call("POST", f"{lm}/generate", {"prompt": "hello", "max_new_tokens": 8}) == first  # deterministic
    assert call("GET", f"{lm}/healthz")[1]["recipe"] == "causal-lm"


def test_generate_takes_the_tutorials_max_length_and_temperature(
    lm: str, tiny_lm: tuple[torch.nn.Module, Path]
) -> None:
    """Hugging Face's max_length counts the prompt: "hello" (5 tokens) + 7 new ones."""
    body = {"prompt": "hello", "max_length": 12, "temperature": 0.9, "seed": 5}
    assert call("POST", f"{lm}/generate", body) == (
        200,
        {"text": reference(tiny_lm[0], "hello", 7, temperature=0.9, seed=5)},
    )
    assert call("POST", f"{lm}/generate", {"prompt": "hello", "max_length": 12})[1] == {
        "text": reference(tiny_lm[0], "hello", 7)
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_new_tokens": 4}, "prompt: Field required"),
        ({"prompt": ""}, "prompt: String should have at least 1 character"),
        ({"prompt": "hi", "max_new_tokens": "4"}, "max_new_tokens: Input should be a valid integer"),
        ({"prompt": "hi", "max_new_tokens": 0}, "max_new_tokens: Input should be greater than or equal to 1"),
        ({"prompt": "hi", "max_new_tokens": 63}, "exceeds the model's 64 positions"),
        ({"prompt": "hello", "max_length": 5}, "max_length (5) leaves no room after the prompt (5 tokens)"),
        (
            {"prompt": "hi", "max_length": 9, "max_new_tokens": 2},
            "give max_new_tokens or max_length, not both",
        ),
        ({"prompt": "hi", "temperature": -1}, "temperature: Input should be greater than or equal to 0"),
        ({"prompt": "hi", "num_beams": 2}, "unknown field 'num_beams'; allowed: "),
    ],
)
def test_bad_generate_is_400(lm: str, body: dict[str, Any], message: str) -> None:
    status, answer = call("POST", f"{lm}/generate", body)
    assert status == 400 and message in answer["error"], answer
    assert "\n" not in answer["error"]


# --- /v1/completions ----------------------------------------------------------------------------


def test_completion(lm: str, tiny_lm: tuple[torch.nn.Module, Path]) -> None:
    """temperature 0: greedy decoding (OpenAI's default temperature is 1: sampling)."""
    status, body = call(
        "POST",
        f"{lm}/v1/completions",
        {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 10, "temperature": 0},
    )
    assert status == 200, body
    assert (
        body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == MODEL_NAME
    )
    assert body["choices"] == [
        {"index": 0, "text": reference(tiny_lm[0], "hello", 10), "finish_reason": "length", "logprobs": None}
    ]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 10, "total_tokens": 15}
    default = call("POST", f"{lm}/v1/completions", {"prompt": "hello"})[1]  # OpenAI's default: 16 tokens
    assert default["usage"]["completion_tokens"] == 16


def test_sampling_parameters_are_applied(lm: str, tiny_lm: tuple[torch.nn.Module, Path]) -> None:
    """temperature, top_p and seed give exactly transformers' sample; the same seed the same text."""
    request = {"prompt": "hello", "max_tokens": 12, "temperature": 1.3, "top_p": 0.9, "seed": 42}
    first = call("POST", f"{lm}/v1/completions", request)[1]["choices"][0]["text"]
    assert first == reference(tiny_lm[0], "hello", 12, temperature=1.3, top_p=0.9, seed=42)
    assert call("POST", f"{lm}/v1/completions", request)[1]["choices"][0]["text"] == first
    other = call("POST", f"{lm}/v1/completions", {**request, "seed": 43})[1]["choices"][0]["text"]
    assert other == reference(tiny_lm[0], "hello", 12, temperature=1.3, top_p=0.9, seed=43) != first


def stop_in(completion: str) -> tuple[str, str]:
    """A stop string taken from inside `completion` and the text before its first occurrence."""
    for i in range(2, len(completion) - 2):
        stop = completion[i : i + 2]
        if "\ufffd" not in stop and "\ufffd" not in completion[:i]:
            return stop, completion[: completion.index(stop)]
    raise AssertionError(f"no usable stop string in {completion!r}")


def test_stop_ends_the_text_before_the_stop_string(lm: str, tiny_lm: tuple[torch.nn.Module, Path]) -> None:
    full = reference(tiny_lm[0], "abc", 24)
    stop, before = stop_in(full)
    request = {"prompt": "abc", "max_tokens": 24, "temperature": 0, "stop": ["\x00never", stop]}
    choice = call("POST", f"{lm}/v1/completions", request)[1]["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (before, "stop")
    events = streamed(f"{lm}/v1/completions", request)
    chunks = [e for e in events if isinstance(e, dict)]
    assert "".join(c["choices"][0]["text"] for c in chunks) == before
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completion_streams_chunk_by_chunk(lm: str, tiny_lm: tuple[torch.nn.Module, Path]) -> None:
    request = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 20, "temperature": 0.8, "seed": 7}
    events = streamed(f"{lm}/v1/completions", {**request, "stream_options": {"include_usage": True}})
    *chunks, usage, done = events
    assert isinstance(usage, dict) and done == "[DONE]"
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 20,
        "total_tokens": 25,
    }
    pieces: list[str] = []
    for chunk in chunks:
        assert (
            isinstance(chunk, dict) and chunk["object"] == "text_completion" and chunk["model"] == MODEL_NAME
        )
        assert chunk["id"] == usage["id"]
        (choice,) = chunk["choices"]
        pieces.append(choice["text"])
        assert choice["finish_reason"] == (None if chunk is not chunks[-1] else "length")
    assert len([p for p in pieces if p]) > 3, pieces  # the text came in many pieces, not at the end
    whole = call("POST", f"{lm}/v1/completions", request)[1]["choices"][0]["text"]
    assert "".join(pieces) == whole == reference(tiny_lm[0], "hello", 20, temperature=0.8, seed=7)
    without_usage = streamed(f"{lm}/v1/completions", request)
    assert all(e == "[DONE]" or e["choices"] for e in without_usage)  # type: ignore[index]


# --- /v1/chat/completions -----------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
CHAT_PROMPT = "system: be brief\nuser: hi\nassistant:"


def test_chat_completion(lm: str, tiny_lm: tuple[torch.nn.Module, Path]) -> None:
    status, body = call(
        "POST",
        f"{lm}/v1/chat/completions",
        {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 6, "temperature": 0},
    )
    assert status == 200, body
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": reference(tiny_lm[0], CHAT_PROMPT, 6)}
    assert choice["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len(CHAT_PROMPT.encode())
    # No limit given: up to the model's positions.
    unlimited = call("POST", f"{lm}/v1/chat/completions", {"messages": MESSAGES})[1]
    assert unlimited["usage"]["total_tokens"] == POSITIONS


def test_chat_streams_deltas(lm: str, tiny_lm: tuple[torch.nn.Module, Path]) -> None:
    events = streamed(
        f"{lm}/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 12, "temperature": 0}
    )
    *chunks, done = events
    assert done == "[DONE]"
    deltas = [c["choices"][0]["delta"] for c in chunks if isinstance(c, dict)]
    assert all(isinstance(c, dict) and c["object"] == "chat.completion.chunk" for c in chunks)
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[-1] == {} and chunks[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert "".join(d.get("content", "") for d in deltas) == reference(tiny_lm[0], CHAT_PROMPT, 12)


def test_models(lm: str) -> None:
    status, body = call("GET", f"{lm}/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [MODEL_NAME], body


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "message"),
    [
        ("completions", {"prompt": "hi", "temperature": 3}, 400, "temperature", "less than or equal to 2"),
        ("completions", {"prompt": "hi", "top_p": 0}, 400, "top_p", "greater than 0"),
        ("completions", {"prompt": "hi", "n": 2}, 400, "n", "less than or equal to 1"),
        (
            "completions",
            {"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]},
            400,
            "stop",
            "at most 4 stop sequences",
        ),
        ("completions", {"prompt": "hi", "seed": -1}, 400, "seed", "greater than or equal to 0"),
        (
            "completions",
            {"prompt": "hi", "max_tokens": 63},
            400,
            "max_tokens",
            "exceeds the model's 64 positions",
        ),
        ("completions", {"prompt": "hi", "logit_bias": {}}, 400, "logit_bias", "unknown field 'logit_bias'"),
        ("completions", {"prompt": ["a", "b"]}, 400, "prompt", "valid string"),
        (
            "completions",
            {"prompt": "hi", "model": "gpt-4"},
            404,
            "model",
            "'gpt-4' is not served here; models: tiny-gpt2",
        ),
        ("chat/completions", {"messages": []}, 400, "messages", "at least 1 item"),
        (
            "chat/completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            400,
            "messages.0.role",
            "'system'",
        ),
        (
            "chat/completions",
            {"messages": MESSAGES, "max_tokens": 2, "max_completion_tokens": 2},
            400,
            None,
            "not both",
        ),
    ],
)
def test_bad_openai_requests(
    lm: str, path: str, body: dict[str, Any], status: int, param: str | None, message: str
) -> None:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    got, answer = call("POST", f"{lm}/v1/{path}", body)
    assert got == status, answer
    error = answer["error"]
    assert (
        message in error["message"] and error["param"] == param and error["type"] == "invalid_request_error"
    ), error
    assert "\n" not in error["message"]


def test_stop_text_holds_back_what_the_next_token_may_change() -> None:
    """Pure: a partial UTF-8 character and a possible start of a stop string wait for the next token."""
    stop_text = llm.StopText(text, ["END"])
    assert stop_text.feed(list("é".encode())[:1]) == ""  # half of a two-byte character
    assert stop_text.feed(list("é".encode())[1:] + list(b"x E")) == "éx "  # "E" may start "END"
    assert stop_text.feed(list(b"Nope")) == "ENope"
    assert stop_text.feed(list(b" EN")) == " "
    assert stop_text.feed(list(b"D and more")) == "" and stop_text.stopped
    assert stop_text.flush() == ""
    tail = llm.StopText(text, ["END"])
    assert tail.feed(list(b"ab E")) == "ab " and tail.flush() == "E"


# --- several models, multiplexed ------------------------------------------------------------------


@pytest.fixture(scope="module")
def multi(
    lm: str, tiny_lm: tuple[torch.nn.Module, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, torch.nn.Module]]]:
    """Two MLPs and the LM as one application under /multi, at most 2 models per replica."""
    from ray import serve

    from rayship_workloads import recipes
    from rayship_workloads.serve import app_builder

    mlps: dict[str, torch.nn.Module] = {}
    uris = {"lm": str(tiny_lm[1])}
    for seed, name in enumerate(("mlp-a", "mlp-b")):
        torch.manual_seed(seed)
        mlps[name] = recipes.MLP(3, [4], 1).eval()
        setup = recipes.ModelSetup({"in_features": 3, "hidden": [4], "out_features": 1})
        uris[name] = str(models.export(tmp_path_factory.mktemp(name), "mlp", setup, mlps[name].state_dict()))
    args = {"models": uris, "modelCacheSize": 2, "routePrefix": "/multi", "numCpus": 0.25}
    serve.run(app_builder(args), name="rayship-multi", route_prefix="/multi")
    try:
        yield lm.removesuffix("/lm") + "/multi", mlps
    finally:
        serve.delete("rayship-multi")


def test_multiplexed_models_by_header(
    multi: tuple[str, dict[str, torch.nn.Module]], tiny_lm: tuple[torch.nn.Module, Path]
) -> None:
    url, mlps = multi
    row = [[0.5, -1.0, 2.0]]

    def predict(name: str) -> list[list[float]]:
        status, body = call(
            "POST", f"{url}/predict", {"instances": row}, headers={"serve_multiplexed_model_id": name}
        )
        assert status == 200, body
        return body["predictions"]  # type: ignore[no-any-return]

    for name in ("mlp-a", "mlp-b"):
        torch.testing.assert_close(
            torch.tensor(predict(name)), mlps[name](torch.tensor(row)).detach(), rtol=0, atol=1e-5
        )
    assert predict("mlp-a") != predict("mlp-b")
    # The LM by the header or by the OpenAI body's "model" (the cache holds 2: mlp-a is evicted).
    want = reference(tiny_lm[0], "hi", 4)
    by_body = call(
        "POST", f"{url}/v1/completions", {"model": "lm", "prompt": "hi", "max_tokens": 4, "temperature": 0}
    )
    assert by_body[0] == 200 and by_body[1]["choices"][0]["text"] == want and by_body[1]["model"] == "lm"
    predict("mlp-a")
    stats = call("GET", f"{url}/stats", headers={"serve_multiplexed_model_id": "mlp-a"})[1]
    assert stats["model_loads"] == {"mlp-a": 2, "mlp-b": 1, "lm": 1}, stats
    assert [m["id"] for m in call("GET", f"{url}/v1/models")[1]["data"]] == ["lm", "mlp-a", "mlp-b"]


@pytest.mark.parametrize(
    ("path", "body", "header", "status", "message"),
    [
        (
            "predict",
            {"instances": [[1.0, 2.0, 3.0]]},
            None,
            400,
            "several models (lm, mlp-a, mlp-b): name one in the serve_multiplexed_model_id header",
        ),
        (
            "predict",
            {"instances": [[1.0, 2.0, 3.0]]},
            "mlp-c",
            404,
            "model 'mlp-c' is not served here; models: lm, mlp-a, mlp-b",
        ),
        ("generate", {"prompt": "hi"}, "mlp-a", 400, "/generate needs a text model"),
        (
            "v1/completions",
            {"model": "lm", "prompt": "hi"},
            "mlp-a",
            400,
            "header says 'mlp-a' but the body's model is 'lm'",
        ),
    ],
)
def test_multiplexed_model_errors(
    multi: tuple[str, dict[str, torch.nn.Module]],
    path: str,
    body: dict[str, Any],
    header: str | None,
    status: int,
    message: str,
) -> None:
    headers = {"serve_multiplexed_model_id": header} if header else {}
    got, answer = call("POST", f"{multi[0]}/{path}", body, headers=headers)
    error = answer["error"]["message"] if path.startswith("v1/") else answer["error"]
    assert got == status and message in error, answer


# --- request limits and slow clients on the text routes ------------------------------------------

TEXT_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")


@pytest.mark.parametrize("route", TEXT_ROUTES)
def test_a_text_route_refuses_a_body_over_the_limit_before_reading_it(lm: str, route: str) -> None:
    """The default 8 MiB (maxRequestBytes) holds on every text route, as on /predict: an oversized
    Content-Length is answered 413 from the header alone, and a chunked body is cut while it is read."""
    status, body = declared_but_not_sent(f"{lm}{route}", 50 * 1024 * 1024)
    error = body["error"]["message"] if route.startswith("/v1/") else body["error"]  # OpenAI's shape
    assert status == 413 and "over 8388608 bytes (maxRequestBytes)" in error, body
    over = b'{"prompt": "hi"' + b" " * (8 * 1024 * 1024) + b"}"
    request = urllib.request.Request(
        f"{lm}{route}", data=iter([over[:4096], over[4096:]]), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=60)
    assert request.get_header("Transfer-encoding") == "chunked"
    assert err.value.code == 413 and "maxRequestBytes" in json.dumps(json.loads(err.value.read())["error"])


def test_clients_that_trickle_headers_or_a_body_do_not_hold_up_others(lm: str) -> None:
    """Slow loris: connections that send their headers, or their body, a few bytes at a time hold no
    replica and no event loop: another client is answered meanwhile, every time (that they are cut off
    in time: test_serve's slow-client test)."""
    parts = urllib.parse.urlsplit(lm)
    head = (
        f"POST {parts.path}/generate HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
    )
    trickling = [socket.create_connection((parts.hostname, parts.port), timeout=10) for _ in range(8)]
    try:
        for i, sock in enumerate(trickling):  # half trickle headers, half a declared body
            sock.sendall(head.encode() if i % 2 else f"{head}Content-Length: 1000\r\n\r\n{{".encode())
        for round_ in range(5):
            for i, sock in enumerate(trickling):
                sock.sendall(f"X-Slow-{round_}: 1\r\n".encode() if i % 2 else b" ")
            status, body = call("POST", f"{lm}/generate", {"prompt": "hello", "max_new_tokens": 2})
            assert status == 200 and isinstance(body["text"], str), body
            time.sleep(0.5)
    finally:
        for sock in trickling:
            sock.close()

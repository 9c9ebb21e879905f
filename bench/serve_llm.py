"""Streamed tokens through the built-in server's `/v1/completions` against transformers' own
`generate` on the same tiny model and prompts.

    flock /tmp/rayship-ray.lock .venv/bin/python bench/serve_llm.py [--tokens 64] [--rounds 3]

Question (issue 36 §1): how much of a token's time does serving add (HTTP, HAProxy, Serve's streaming
response, the server's token queue and stop-text handling, one server-sent event per piece)?
Goal: serve_llm_tokens_over_generate >= 0.8.

The model: a GPT-2 made from its config with random weights (seeded; nothing is downloaded), byte-level
tokenizer as `rayship train` exports a causal-lm, by default 4 layers x 256 wide (3.4M parameters,
~1.5 ms a token on one core with its KV cache): small enough for 2 cores, big enough that a token's
forward is a share of the work; `--layers`/`--width` for others. The prompts: 8 fixed English
sentences, each asked for --tokens new tokens, greedy (temperature 0: both sides produce the same
tokens, and the random model's end-of-text id is outside its vocabulary, so every request runs to its
length).

    baseline  `model.generate(input_ids, max_new_tokens=N, do_sample=False)` in this process, one
              thread (a replica has one CPU), the prompts one after another
    served    the same model served by `serve_locally` (HAProxy in front, as rayship serves; 1 CPU),
              one client streaming `/v1/completions` (stream: true, include_usage) for the same
              prompts one after another; tokens counted from each stream's usage

Tokens/s for both (--rounds rounds each, alternating), the served side's time to the first token
(p50) and its gap between events (p50/p99), and the CPU each process group spent per token. The figure
is the median of the rounds' ratios, each served round over the generate round just before it: this
machine's speed drifts within a run (generate's three rounds measured 305-393 tokens/s in one), and a
ratio of two rounds a few seconds apart sees the same machine; the ratio of the two sides' medians is
printed beside it. Ends with `RESULT serve_llm_tokens_over_generate=...`; never fails on the goal. Takes ~2 min.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rayship_workloads.local import private_ray_environment

_TMP = private_ray_environment("rs-llm-")

import ray  # noqa: E402  (after the environment above)
import torch  # noqa: E402
from serving_measures import cpu_by_group, free_port, percentile, remove_when_unused  # noqa: E402

from rayship_workloads import models  # noqa: E402
from rayship_workloads.serve import serve_locally  # noqa: E402
from rayship_workloads.serve_ingress import shutdown_serve  # noqa: E402

PROMPTS = [
    "The cluster scheduled four workers",
    "A checkpoint is written after every epoch",
    "Serving a model means answering requests",
    "The head node runs the controller",
    "Tokens stream back one event at a time",
    "Batching trades latency for throughput",
    "The operator mirrors the job's real state",
    "Every pod requests a fraction of a core",
]
MODEL_NAME = "tiny-gpt2"


def make_model(args: argparse.Namespace) -> tuple[torch.nn.Module, Path]:
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=args.layers,
        n_head=4,
        n_embd=args.width,
        vocab_size=260,
        n_positions=max(len(p) for p in PROMPTS) + args.tokens + 8,
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    directory = Path(_TMP) / "lm"
    model.save_pretrained(directory)
    models.write_manifest(
        directory, "causal-lm", {"n_layer": args.layers, "n_embd": args.width}, tokenizer="bytes"
    )
    return model, directory


def generate_round(model: torch.nn.Module, tokens: int) -> tuple[int, float]:
    """transformers' own generate over the prompts: (new tokens, seconds)."""
    total, start = 0, time.perf_counter()
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([list(prompt.encode())])
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=tokens,
                do_sample=False,
                pad_token_id=model.config.eos_token_id,
            )
            total += out.shape[1] - ids.shape[1]
    return total, time.perf_counter() - start


def stream_one(
    connection: http.client.HTTPConnection, path: str, prompt: str, tokens: int
) -> tuple[int, list[float]]:
    """One streamed completion: (completion tokens from its usage, each event's arrival time)."""
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    connection.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:200]!r}")
    arrivals: list[float] = []
    usage: dict[str, Any] = {}
    for line in response:  # server-sent events: `data: {...}` lines
        if not line.startswith(b"data: "):
            continue
        arrivals.append(time.perf_counter())
        data = line[len(b"data: ") :].strip()
        if data != b"[DONE]":
            usage = json.loads(data).get("usage") or usage
    return int(usage["completion_tokens"]), arrivals


def serve_round(url: str, tokens: int) -> tuple[int, float, list[float], list[float]]:
    """The prompts streamed one after another: (tokens, seconds, first-token times, gaps between events)."""
    host_port = url.removeprefix("http://").split("/", 1)[0]
    path = url.removeprefix(f"http://{host_port}") + "/v1/completions"
    connection = http.client.HTTPConnection(host_port, timeout=120)
    total, firsts, gaps = 0, [], []
    start = time.perf_counter()
    try:
        for prompt in PROMPTS:
            sent = time.perf_counter()
            count, arrivals = stream_one(connection, path, prompt, tokens)
            total += count
            firsts.append(arrivals[0] - sent)
            gaps.extend(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    finally:
        connection.close()
    return total, time.perf_counter() - start, firsts, gaps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--rounds", type=int, default=5, help="rounds each side (the median counts)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    if args.rounds < 1 or args.tokens < 1:
        remove_when_unused(_TMP)  # made at import; no Ray has started in it
        parser.error(f"--rounds {args.rounds} --tokens {args.tokens}: give 1 or more of each")
    torch.set_num_threads(1)  # as a replica with one CPU
    model, directory = make_model(args)
    parameters = sum(p.numel() for p in model.parameters())
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        url = serve_locally(str(directory), port=free_port(), num_cpus=1, model_name=MODEL_NAME)
        generate_round(model, 8)  # warm-up: the first forward passes, the connection
        serve_round(url, 8)
        ours, theirs, firsts, gaps, cpu = [], [], [], [], {}
        for _ in range(args.rounds):
            count, seconds = generate_round(model, args.tokens)
            theirs.append(count / seconds)
            before = cpu_by_group()
            served, seconds, first, gap = serve_round(url, args.tokens)
            after = cpu_by_group()
            if served != count:
                raise RuntimeError(f"served {served} tokens where generate made {count}")
            ours.append(served / seconds)
            firsts += first
            gaps += gap
            for group, used in after.items():
                cpu[group] = (
                    cpu.get(group, 0.0) + 1000 * (used - before.get(group, 0.0)) / served / args.rounds
                )
    finally:
        shutdown_serve()
        ray.shutdown()
        remove_when_unused(_TMP)
    print(
        f"\nGPT-2 {args.layers} layers x {args.width} ({parameters / 1e6:.1f}M parameters), byte tokens; "
        f"{len(PROMPTS)} prompts x {args.tokens} new tokens, greedy; {args.rounds} rounds each side"
    )
    print(f"{'side':44} {'tokens/s (median)':>18}  rounds")
    print(
        f"{'transformers generate, in process, 1 thread':44} {statistics.median(theirs):18.1f}  "
        + ", ".join(f"{r:.1f}" for r in theirs)
    )
    print(
        f"{'/v1/completions streamed, 1 client':44} {statistics.median(ours):18.1f}  "
        + ", ".join(f"{r:.1f}" for r in ours)
    )
    print(
        f"served: first token p50 {1000 * percentile(firsts, 0.5):.1f} ms; between events p50 "
        f"{1000 * percentile(gaps, 0.5):.2f} ms, p99 {1000 * percentile(gaps, 0.99):.2f} ms"
    )
    print(
        "CPU ms per served token, by process (psutil): "
        + ", ".join(f"{g} {v:.2f}" for g, v in sorted(cpu.items()))
    )
    ratio = statistics.median(o / t for o, t in zip(ours, theirs, strict=True))
    print(
        f"served / generate, the median of the rounds' ratios: {ratio:.3f}x  goal >= 0.8x: "
        f"{'met' if ratio >= 0.8 else 'NOT met'} (rounds: "
        + ", ".join(f"{o / t:.3f}" for o, t in zip(ours, theirs, strict=True))
        + f"; the ratio of the medians: {statistics.median(ours) / statistics.median(theirs):.3f}x)"
    )
    print(f"RESULT serve_llm_tokens_over_generate={ratio:.4f}")


if __name__ == "__main__":
    main()

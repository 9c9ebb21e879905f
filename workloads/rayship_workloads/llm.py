"""Text generation for causal-lm models as `serve.ModelServer` serves it: the request bodies of
`/generate` and of the OpenAI-compatible `/v1/completions` and `/v1/chat/completions`, sampling with
transformers' `generate` (its streamer and stopping-criteria hooks), and the OpenAI response and
server-sent-event shapes.

Sampling follows OpenAI's parameters: `temperature` 0 is greedy decoding, otherwise multinomial
sampling at that temperature with nucleus `top_p` (no top-k); `seed` makes a sample repeatable (a
replica generates one sequence at a time, so no other request draws from the random state in
between); `stop` (up to 4 strings) ends the text before the first of them, which is not returned.
Streams are cut at text boundaries: a partial UTF-8 character or a possible start of a stop string is
held back until the next token decides it.

Chat messages become one prompt, each message on its own line as `<role>: <content>`, followed by
`assistant:` (byte-level and from-config models have no chat template of their own).
"""

# No `from __future__ import annotations` here either: pydantic reads these models' annotations.
import asyncio
import json
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rayship_workloads.recipes import TextGenerator

if TYPE_CHECKING:
    from rayship_workloads.generation_hooks import TokenQueue

MAX_NEW_TOKENS = 1024
MAX_STOP_SEQUENCES = 4  # as OpenAI
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
SEED_BOUND = 2**63


class RequestError(Exception):
    """A request that cannot be served as sent: HTTP `status` with `message` (and the offending `param`)."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


# --- request bodies ---------------------------------------------------------------------------------


class _Body(BaseModel):
    # JSON-strict: "4" is not a number, true is not 1; unknown keys are errors, not ignored.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class Sampling(_Body):
    """What every generation request shares (OpenAI's names)."""

    temperature: float = Field(1.0, ge=0, le=2, description="0: greedy; else sampling at this temperature.")
    top_p: float = Field(
        1.0, gt=0, le=1, description="Nucleus sampling: the smallest set of tokens with this mass."
    )
    stop: str | list[str] | None = Field(
        None, description="Up to 4 strings that end the text (not returned)."
    )
    seed: int | None = Field(None, ge=0, lt=SEED_BOUND, description="Makes a sampled completion repeatable.")

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return value

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class GenerateRequest(Sampling):
    """`POST /generate`: `max_new_tokens` (default 16), or Hugging Face's `max_length` (prompt and
    completion together), and greedy decoding unless a `temperature` > 0 is given."""

    prompt: str = Field(min_length=1)
    max_new_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    max_length: int | None = Field(None, ge=2)
    temperature: float = Field(0.0, ge=0, le=2)

    @model_validator(mode="after")
    def _one_length(self) -> "GenerateRequest":
        if self.max_new_tokens is not None and self.max_length is not None:
            raise ValueError("give max_new_tokens or max_length, not both")
        return self

    def new_tokens(self, prompt_tokens: int) -> int:
        if self.max_length is None:
            return self.max_new_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
        room = self.max_length - prompt_tokens
        if room < 1:
            raise RequestError(
                f"max_length ({self.max_length}) leaves no room after the prompt ({prompt_tokens} tokens)",
                param="max_length",
            )
        return min(room, MAX_NEW_TOKENS)


class StreamOptions(_Body):
    include_usage: bool = False


class _OpenAIRequest(Sampling):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="Choices per request: only 1 is served.")
    user: str | None = None


class CompletionRequest(_OpenAIRequest):
    """`POST /v1/completions` (one prompt string per request)."""

    prompt: str = Field(min_length=1)


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant"]
    content: str
    name: str | None = None


class ChatRequest(_OpenAIRequest):
    """`POST /v1/chat/completions` (text content only)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)

    @model_validator(mode="after")
    def _one_limit(self) -> "ChatRequest":
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_completion_tokens or max_tokens, not both")
        return self


Body = TypeVar("Body", bound=_Body)


def parse(kind: type[Body], raw: bytes) -> Body:
    """`raw` JSON as a `kind` request, or a `RequestError` naming the first wrong field."""
    try:
        return kind.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        if first["type"] == "json_invalid":
            raise RequestError(f"request body is not valid JSON: {first['msg']}") from None
        if first["type"] == "model_type":
            raise RequestError("request body must be a JSON object") from None
        if first["type"] == "extra_forbidden":
            allowed = ", ".join(kind.model_fields)
            raise RequestError(f"unknown field {where!r}; allowed: {allowed}", param=where) from None
        message = first["msg"].removeprefix("Value error, ")
        raise RequestError(f"{where}: {message}" if where else message, param=where or None) from None


def chat_prompt(messages: Sequence[ChatMessage]) -> str:
    return "".join(f"{m.role}: {m.content}\n" for m in messages) + "assistant:"


# --- generation -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """A stretch of a completion: new `text`; the last piece has `finish_reason` ("stop" or "length")."""

    text: str
    completion_tokens: int
    finish_reason: str | None = None


class StopText:
    """Incremental detokenization with stop strings: `feed` token ids, get the text safe to send."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str]) -> None:
        self.decode, self.stops = decode, tuple(stops)
        self.ids: list[int] = []
        self.sent = 0  # characters of the decoded text already handed out
        self.stopped = False

    def feed(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.decode(self.ids)
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            end = min(hits)
        else:
            end = len(text) - self._undecided(text)
        return self._take(text, end)

    def flush(self) -> str:
        """The rest, once no token follows (nothing after a stop string)."""
        return "" if self.stopped else self._take(self.decode(self.ids), None)

    def _take(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        delta = text[self.sent : end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return delta

    def _undecided(self, text: str) -> int:
        """Trailing characters the next token may still change: a partial UTF-8 sequence (decoded as
        U+FFFD), or a prefix of a stop string."""
        held = len(text) - len(text.rstrip("\ufffd"))
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:k]):
                    held = max(held, k)
                    break
        return held


class TextEngine:
    """A causal LM and its tokenizer (`recipes.TextGenerator`), generating one sequence at a time."""

    def __init__(self, model: Any, generator: TextGenerator) -> None:
        from rayship_workloads import generation_hooks  # transformers: only where a text model is served

        self._hooks = generation_hooks
        self.model, self.generator = model, generator
        self.max_positions = generator.max_positions
        config = model.config
        self.pad_token_id = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
        self._lock = threading.Lock()  # one generate() at a time: a seed governs its whole sequence

    def encode(self, prompt: str, param: str) -> list[int]:
        ids = self.generator.encode(prompt)
        if not ids:
            raise RequestError(f"{param} encodes to no tokens", param=param)
        return ids

    def room(self, prompt_tokens: int) -> int:
        """Most new tokens after a prompt of `prompt_tokens`."""
        if self.max_positions is None:
            return MAX_NEW_TOKENS
        return max(0, min(MAX_NEW_TOKENS, self.max_positions - prompt_tokens))

    def check_room(self, prompt_tokens: int, max_new_tokens: int, param: str) -> None:
        limit = self.max_positions
        if limit is not None and prompt_tokens + max_new_tokens > limit:
            raise RequestError(
                f"prompt ({prompt_tokens} tokens) + {param} ({max_new_tokens}) exceeds the model's {limit} positions",
                param=param,
            )

    def _generate(
        self,
        ids: list[int],
        max_new_tokens: int,
        sampling: Sampling,
        streamer: "TokenQueue",
        stop: threading.Event,
    ) -> None:
        try:
            input_ids = torch.tensor([ids], device=next(self.model.parameters()).device)
            options: dict[str, Any] = {"do_sample": sampling.temperature > 0}
            if options["do_sample"]:
                options.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
            with self._lock, torch.no_grad():
                torch.manual_seed(
                    sampling.seed if sampling.seed is not None else secrets.randbelow(SEED_BOUND)
                )
                self.model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_new_tokens=max_new_tokens,
                    pad_token_id=self.pad_token_id,
                    streamer=streamer,
                    stopping_criteria=self._hooks.until(stop),
                    **options,
                )
        finally:
            streamer.end()  # also after an error: the reader must not wait for tokens that never come

    async def stream(self, ids: list[int], max_new_tokens: int, sampling: Sampling) -> AsyncIterator[Piece]:
        """The completion of `ids`, piece by piece as tokens are generated (in a worker thread); the last
        piece carries the finish reason. Closing the iterator early stops the generation."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[list[int] | None] = asyncio.Queue()
        stop = threading.Event()
        text = StopText(self.generator.decode, sampling.stops)
        done = loop.run_in_executor(
            None, self._generate, ids, max_new_tokens, sampling, self._hooks.TokenQueue(loop, queue), stop
        )
        count = 0
        try:
            while (new := await queue.get()) is not None:
                if text.stopped:
                    continue  # a token generated before generate() saw the stop
                count += len(new)
                delta = text.feed(new)
                if text.stopped:
                    stop.set()
                if delta:
                    yield Piece(delta, count)
            await done  # generate()'s own error, if it failed
            reason = "length" if count >= max_new_tokens and not text.stopped else "stop"
            yield Piece(text.flush(), count, reason)
        finally:
            stop.set()  # the client went away (or the stream ended): generate() stops at its next token

    async def complete(self, ids: list[int], max_new_tokens: int, sampling: Sampling) -> Piece:
        """The whole completion as one piece."""
        parts: list[str] = []
        last = Piece("", 0)
        async for last in self.stream(ids, max_new_tokens, sampling):
            parts.append(last.text)
        return Piece("".join(parts), last.completion_tokens, last.finish_reason)


# --- OpenAI responses -------------------------------------------------------------------------------


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class Reply:
    """The response (or the stream of chunks) to one OpenAI request."""

    def __init__(self, *, chat: bool, model: str, prompt_tokens: int) -> None:
        self.chat, self.model, self.prompt_tokens = chat, model, prompt_tokens
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, kind: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }

    def whole(self, piece: Piece) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": piece.finish_reason, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": piece.text}
        else:
            choice["text"] = piece.text
        kind = "chat.completion" if self.chat else "text_completion"
        return self._envelope(kind, [choice], usage=self.usage(piece.completion_tokens))

    def chunk(self, text: str, finish_reason: str | None = None, *, first: bool = False) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if self.chat:
            choice["delta"] = ({"role": "assistant"} if first else {}) | (
                {"content": text} if text or first else {}
            )
        else:
            choice["text"] = text
        return sse(self._envelope("chat.completion.chunk" if self.chat else "text_completion", [choice]))

    async def events(self, pieces: AsyncIterator[Piece], include_usage: bool) -> AsyncIterator[bytes]:
        """`pieces` as server-sent events: a chunk per piece, the finish reason, usage if asked, [DONE]."""
        if self.chat:
            yield self.chunk("", first=True)
        completion_tokens = 0
        async for piece in pieces:
            completion_tokens = piece.completion_tokens
            if piece.finish_reason is None:
                yield self.chunk(piece.text)
                continue
            if piece.text:
                yield self.chunk(piece.text)
            yield self.chunk("", piece.finish_reason)
        if include_usage:
            kind = "chat.completion.chunk" if self.chat else "text_completion"
            yield sse(self._envelope(kind, [], usage=self.usage(completion_tokens)))
        yield SSE_DONE


def error_body(message: str, param: str | None, status: int) -> dict[str, Any]:
    """OpenAI's error shape."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}

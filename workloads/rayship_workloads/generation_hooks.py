"""transformers' generation hooks for `llm.TextEngine`: a streamer that hands each new token to the
event loop, and a stopping criterion set from outside. Kept apart from `llm` so that a replica serving
no text model (and the drivers of `rayship run`/`demo`) never imports transformers (~1 s)."""

import asyncio
import threading
from typing import Any, cast

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer


class TokenQueue(BaseStreamer):
    """transformers' streamer hook -> the event loop: each new token's id is put on `queue`, then None."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: "asyncio.Queue[list[int] | None]") -> None:
        self.loop, self.queue, self.prompt_seen = loop, queue, False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate() hands over the prompt first
            self.prompt_seen = True
            return
        self.loop.call_soon_threadsafe(self.queue.put_nowait, value.reshape(-1).tolist())

    def end(self) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, None)


class _Until(StoppingCriteria):
    """Stops generate() once `event` is set (a stop string was seen, or the client went away)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        done = torch.full(
            (input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device
        )
        return cast(torch.BoolTensor, done)


def until(event: threading.Event) -> StoppingCriteriaList:
    """generate()'s `stopping_criteria`: stop once `event` is set."""
    return StoppingCriteriaList([_Until(event)])

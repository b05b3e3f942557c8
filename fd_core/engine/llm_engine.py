"""The in-process engine: tokenizer + output processor + engine core.

``add_request`` takes text or token ids, ``step`` returns ``RequestOutput``s
with text, ``abort_request`` frees a request at once. The offline ``LLM``
drives it; the server splits the same pieces across two processes.
"""

from __future__ import annotations

import time
from typing import Any

from fd_core.config import EngineArgs
from fd_core.engine.core import EngineCore, EngineCoreRequest
from fd_core.engine.output_processor import OutputProcessor
from fd_core.engine.outputs import RequestOutput
from fd_core.engine.request import RequestStatus
from fd_core.sampling.params import SamplingParams
from fd_core.tokenizer import Tokenizer

__all__ = ["LLMEngine", "tokenize_bad_words"]


def tokenize_bad_words(tokenizer: Any, words: list[str]) -> list[list[int]]:
    """Token sequences to ban for each bad word, with and without a leading space."""
    out: list[list[int]] = []
    for word in words:
        for variant in (word, " " + word.lstrip()):
            ids = tokenizer.encode(variant)
            if ids and ids not in out:
                out.append(ids)
    return out


class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.core = EngineCore(args)
        self.tokenizer = Tokenizer.from_pretrained(
            args.tokenizer or self.core.model_dir, chat_template=args.chat_template
        )
        self.processor = OutputProcessor(self.tokenizer)
        eos = list(self.tokenizer.eos_token_ids or [])
        eos += [t for t in self.core.model_config.eos_token_ids if t not in eos]
        self.eos_token_ids = eos

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> LLMEngine:
        return cls(EngineArgs.from_kwargs(model, **kwargs))

    def encode_prompt(self, prompt: str | list[int] | dict[str, Any]) -> tuple[str | None, list[int]]:
        """Text, token ids, or ``{"prompt": ...}`` / ``{"prompt_token_ids": ...}``."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError(f"a prompt dict needs 'prompt' or 'prompt_token_ids', got keys {sorted(prompt)}")
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None, list(prompt)
        raise TypeError(f"a prompt must be a string, a list of token ids or a dict, got {type(prompt).__name__}")

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | dict[str, Any],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; raises ValueError/TypeError naming a bad input."""
        params = params or SamplingParams()
        text, token_ids = self.encode_prompt(prompt)
        bad_words = tokenize_bad_words(self.tokenizer, list(params.bad_words or []))
        arrival_time = arrival_time or time.time()
        child_ids = self.processor.add_request(request_id, text, token_ids, params, arrival_time)
        try:
            for i, child_id in enumerate(child_ids):
                child = params.replace(n=1, seed=None if params.seed is None else params.seed + i)
                self.core.add_request(EngineCoreRequest(
                    child_id, token_ids, child, self.eos_token_ids, bad_words, arrival_time,
                ))
        except Exception:
            self.abort_request(request_id)
            raise

    def step(self) -> list[RequestOutput]:
        outputs, stopped = self.processor.process(self.core.step())
        if stopped:  # a stop string ended these: free them in the core now
            self.core.abort(stopped, RequestStatus.FINISHED_STOPPED)
        return outputs

    def abort_request(self, request_id: str) -> None:
        self.core.abort(self.processor.abort(request_id))

    def has_unfinished_requests(self) -> bool:
        return self.processor.num_unfinished > 0 or self.core.has_unfinished_requests()

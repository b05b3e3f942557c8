"""The in-process engine: frontend (tokenizer, output processor) + engine core.

``add_request`` takes text or token ids, ``step`` returns ``RequestOutput``s
with text, ``abort_request`` frees a request at once. The offline ``LLM``
drives it; the server splits the same pieces across two processes.
"""

from __future__ import annotations

import time
from typing import Any

from fd_core.config import EngineArgs
from fd_core.engine.core import EngineCore
from fd_core.engine.frontend import Frontend, eos_token_ids_of
from fd_core.engine.outputs import RequestOutput
from fd_core.engine.request import RequestStatus
from fd_core.sampling.params import SamplingParams
from fd_core.tokenizer import Tokenizer

__all__ = ["LLMEngine"]


class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.core = EngineCore(args)
        if args.core_wrapper is not None:  # --splitwise-role prefill/decode: fd_core.disagg
            self.core = args.core_wrapper(self.core, args)
        self.tokenizer = Tokenizer.from_pretrained(
            args.tokenizer or self.core.model_dir, chat_template=args.chat_template
        )
        self.eos_token_ids = eos_token_ids_of(self.tokenizer, self.core.model_config.eos_token_ids)
        self.frontend = Frontend(self.tokenizer, self.eos_token_ids, self.core.model_config.vocab_size,
                                 args.max_model_len)
        self.processor = self.frontend.processor

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> LLMEngine:
        return cls(EngineArgs.from_kwargs(model, **kwargs))

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int] | dict[str, Any],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> None:
        """Queue a request; raises ValueError/TypeError naming a bad input."""
        requests = self.frontend.prepare(request_id, prompt, params, arrival_time or time.time())
        try:
            for request in requests:
                self.core.add_request(request)
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

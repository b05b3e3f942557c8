"""The engine core's structured-output glue: building ``StructuredOutputs`` for a
model and turning its verdicts into engine outputs.

Called by ``EngineCore`` only: ``structured_outputs`` once at start (the
vocabulary itself is built on first use, off the engine thread, so engines
that never see a constrained request pay nothing), ``failed_output`` for a
request whose grammar did not compile (only that request ends, as
``abort`` with the error as its ``stop_reason``), ``finish_status`` for a
request whose grammar completed (``stop``) or refused a token (``abort``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fd_core.config import EngineArgs
from fd_core.engine.outputs import EngineCoreOutput
from fd_core.engine.request import RequestStatus
from fd_core.sampling.reasoning_budget import ThinkingTokens
from fd_core.structured import GrammarVocab, StructuredOutputs

__all__ = ["failed_output", "finish_status", "structured_outputs"]


def structured_outputs(args: EngineArgs, tokenizer_dir: str | Path, vocab_size: int,
                       model_eos: tuple[int, ...], thinking: ThinkingTokens | None) -> StructuredOutputs:
    """The engine's ``StructuredOutputs`` (--guided-decoding-backend, --guided-decoding-disable-any-whitespace)."""

    def vocab() -> GrammarVocab:
        from fd_core.engine.frontend import eos_token_ids_of
        from fd_core.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_pretrained(tokenizer_dir)
        return GrammarVocab.from_tokenizer(tokenizer, eos_token_ids_of(tokenizer, model_eos), vocab_size)

    return StructuredOutputs(vocab, args.guided_decoding_backend,
                             any_whitespace=not args.guided_decoding_disable_any_whitespace, thinking=thinking)


def failed_output(request: Any, error: str) -> EngineCoreOutput:
    """The final output of a held request whose grammar failed to compile."""
    return EngineCoreOutput(request_id=request.request_id, new_token_ids=[], finish_reason="abort",
                            stop_reason=error)


def finish_status(error: str | None) -> RequestStatus:
    """How a request ends when ``StructuredOutputs.accept`` says so."""
    return RequestStatus.FINISHED_STOPPED if error is None else RequestStatus.FINISHED_ABORTED

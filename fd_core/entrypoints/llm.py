"""The offline API: ``LLM(model=...).generate(...)`` and ``.chat(...)``."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from fd_core.engine.llm_engine import LLMEngine
from fd_core.engine.outputs import RequestOutput
from fd_core.sampling.params import SamplingParams

__all__ = ["LLM"]

Prompt = str | list[int] | dict[str, Any]


class LLM:
    """Runs a model in this process for batches of prompts.

    ``engine_args`` are FastDeploy's launch flags as keyword arguments
    (``max_model_len``, ``max_num_seqs``, ``block_size``, ``backend``,
    ``enable_prefix_caching``, ``swap_space``, ...).
    """

    def __init__(self, model: str, **engine_args: Any) -> None:
        self.engine = LLMEngine.from_kwargs(model, **engine_args)
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        if isinstance(sampling_params, Sequence):
            if len(sampling_params) != len(prompts):
                raise ValueError(
                    f"got {len(sampling_params)} sampling params for {len(prompts)} prompts; "
                    "give one, or one per prompt"
                )
            params_list = list(sampling_params)
        else:
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        ids = []
        try:
            for prompt, params in zip(prompts, params_list):
                request_id = str(next(self._ids))
                self.engine.add_request(request_id, prompt, params)
                ids.append(request_id)
            return self._run(ids, use_tqdm)
        except BaseException:
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise

    def chat(
        self,
        messages: list[dict[str, Any]] | Sequence[list[dict[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation with the chat template, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts: list[Prompt] = []
        for conversation in conversations:
            text = self.tokenizer.apply_chat_template(
                conversation, add_generation_prompt=add_generation_prompt, tools=tools,
                **(chat_template_kwargs or {}),
            )
            prompts.append({"prompt": text, "prompt_token_ids": self.tokenizer.encode(text)})
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="Processed prompts", dynamic_ncols=True)
        wanted = set(ids)
        while len(results) < len(ids):
            for output in self.engine.step():
                if output.finished and output.request_id in wanted:
                    results[output.request_id] = output
                    if bar is not None:
                        bar.update(1)
            if not self.engine.has_unfinished_requests() and len(results) < len(ids):
                raise RuntimeError("the engine has no work left but requests did not finish")
        if bar is not None:
            bar.close()
        return [results[i] for i in ids]

"""Request fields fd-core knows by name but does not serve (yet).

A request that sets one of them to anything but its no-op value (null,
false, an empty list or dict, or the values listed) answers 400 naming the
field and why; nothing is silently ignored. The table is also the list the
README's "Coming from FastDeploy" section is written from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from fd_core.entrypoints.openai.errors import OpenAIError

__all__ = ["REFUSED", "check_refused"]

_STRUCTURED = ("(vLLM's newer form) is not taken; send response_format or guided_json / guided_regex / "
               "guided_choice / guided_grammar / structural_tag instead")
_MULTIMODAL = ("is not taken per request yet: images and videos go in image_url / video_url content parts "
               "(ERNIE-4.5-VL), the "
               "processor's settings in the server's --mm-processor-kwargs; remove the field")


def _off(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {}


def _one_of(*allowed: Any) -> Callable[[Any], bool]:
    return lambda value: _off(value) or value in allowed


# field -> (is this value a no-op?, why any other value is refused)
REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "structured_outputs": (_off, _STRUCTURED),
    "mm_hashes": (_off, _MULTIMODAL),
    "mm_processor_kwargs": (_off, _MULTIMODAL),
    "include_draft_logprobs": (_off, "draft tokens' logprobs are not returned; accepted tokens carry their own "
                               "logprobs (logprobs / top_logprobs)"),
    "disaggregate_info": (_off, "(FastDeploy's internal prefill/decode routing) is not taken from requests: a "
                                "--splitwise-role decode instance takes its prefill instance from "
                                "--innode-prefill-ports or the x-fd-prefill-addr header fd-router sets"),
    "collect_metrics": (_off, "(per-request metrics in the answer) is not implemented; "
                              "the server's /metrics endpoint has the timings"),
    "suffix": (_off, "is not supported: fd-core does not do fill-in-the-middle, and FastDeploy's "
                     "dict form is not taken either; put its fields at the top level of the request"),
    "functions": (_off, "(the legacy function-calling API) is not supported; send tools instead"),
    "function_call": (_off, "(the legacy function-calling API) is not supported; send tool_choice instead"),
    "audio": (_off, "is not supported: fd-core serves text only"),
    "modalities": (_one_of(["text"]), "is not supported beyond [\"text\"]: fd-core serves text only"),
    "prediction": (_off, "(predicted outputs) is not supported; remove the field"),
    "reasoning_effort": (_off, "is not supported; switch thinking with enable_thinking (or "
                               "chat_template_kwargs) and bound it with reasoning_max_tokens"),
    "web_search_options": (_off, "is not supported: fd-core has no web search"),
    "verbosity": (_off, "is not supported; remove the field"),
    "store": (_off, "is not supported: fd-core does not store completions; send false or leave it out"),
    # parallel_tool_calls is served: false keeps one call (guided_request, chat_parsing)
    "service_tier": (_one_of("auto", "default"), "is not supported beyond 'auto' and 'default': "
                                                 "fd-core has one service tier"),
}


def check_refused(request: BaseModel) -> None:
    """Raise a 400 naming the first refused field ``request`` sets to a value with an effect."""
    for name in sorted(request.model_fields_set & REFUSED.keys()):
        is_noop, why = REFUSED[name]
        if not is_noop(getattr(request, name)):
            raise OpenAIError(f"{name} {why}", 400, name)

"""Request models of the OpenAI API, with vLLM's and FastDeploy's extra fields.

Unknown fields are ignored (as vLLM does), a known field of the wrong type
fails validation and becomes a 400 that names it. Value checks beyond types
(ranges, max_tokens fitting the context) happen when the request is turned
into SamplingParams, whose ValueErrors name the field too. Responses are
built as plain dicts by the serving modules, in OpenAI's exact shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "DetokenizeRequest",
    "FunctionDefinition",
    "ResponseFormat",
    "StreamOptions",
    "TokenizeRequest",
    "Tool",
]


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = True  # a usage chunk (empty choices) before [DONE]
    continuous_usage_stats: bool = False  # usage on every chunk as well


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatMessage(OpenAIBaseModel):
    """One message; extra keys reach the chat template untouched."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any] | str] | None = None
    name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class SamplingFields(OpenAIBaseModel):
    """Fields chat and completions share (OpenAI, then vLLM/FastDeploy extras)."""

    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    max_tokens: int | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # vLLM / FastDeploy extras
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int = 0
    repetition_penalty: float | None = None
    stop_token_ids: list[StrictInt] | None = None
    bad_words: list[str] | None = None
    bad_words_token_ids: list[list[StrictInt]] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    ignore_eos: bool = False
    prompt_logprobs: int | None = None
    return_token_ids: bool = False  # prompt_token_ids / completion_token_ids in the answer
    max_streaming_response_tokens: int | None = Field(default=None, ge=1)  # tokens per chunk
    request_id: str | None = None  # FastDeploy: the caller's id, prefixed by ours

    def sampling_kwargs(self) -> dict[str, Any]:
        """SamplingParams keyword arguments for the fields set; max_tokens is
        decided by the caller (it depends on the prompt length)."""
        kwargs: dict[str, Any] = dict(
            n=self.n, seed=self.seed, stop=self.stop or [], min_tokens=self.min_tokens,
            stop_token_ids=self.stop_token_ids or [], bad_words=self.bad_words or [],
            bad_words_token_ids=self.bad_words_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens, ignore_eos=self.ignore_eos,
            prompt_logprobs=self.prompt_logprobs, logit_bias=self.logit_bias,
        )
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        return kwargs

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # chat template controls (vLLM / FastDeploy)
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}
    add_generation_prompt: bool = True

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None  # not supported: a 400 says so
    max_tokens: int | None = 16  # OpenAI's and vLLM's default for completions


class TokenizeRequest(OpenAIBaseModel):
    """vLLM's /tokenize: either a prompt or chat messages."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[StrictInt]

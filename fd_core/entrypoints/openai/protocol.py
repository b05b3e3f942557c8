"""Request models of the OpenAI API, with vLLM's and FastDeploy's extra fields.

Every field a request may carry is declared here. An undeclared top-level
field is a 400 naming it ("Unknown field 'foo' ..."), never ignored; chat
messages and tool definitions keep extra keys (they reach the chat
template). Fields fd-core knows by name but does not implement yet are
declared too and refused by ``unsupported.check_refused`` unless they hold
their no-op value (``guided_json: null``, ``store: false``). A known field
of the wrong type fails validation and becomes a 400 that names it; value
checks beyond types happen when the request becomes SamplingParams, whose
ValueErrors name the field too. Responses are plain dicts built by the
serving modules, in OpenAI's exact shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

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


def _valid_unicode(value: Any) -> Any:
    """JSON's \\ud800-style escapes can carry lone UTF-16 surrogates, which no
    tokenizer can encode: refuse them here (a 400 naming the field), not in the
    tokenizer (a 500)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"the text is not valid Unicode: a lone surrogate {value[exc.start]!r} at "
                             f"position {exc.start}") from None
    elif isinstance(value, (list, tuple)):
        for item in value:
            _valid_unicode(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _valid_unicode(key)
            _valid_unicode(item)
    return value


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """``"n": null`` means the default (FastDeploy and vLLM type most fields Optional)."""
        if isinstance(data, dict):
            data = {k: v for k, v in data.items()
                    if v is not None or k not in cls.model_fields or cls.model_fields[k].default is None}
        return data


class StreamOptions(OpenAIBaseModel):
    include_usage: StrictBool = True  # a usage chunk (empty choices) before [DONE]
    continuous_usage_stats: StrictBool = False  # usage on every chunk as well
    include_obfuscation: StrictBool | None = None  # OpenAI's padding of deltas; no effect (nothing is padded)


class FunctionDefinition(OpenAIBaseModel):
    model_config = ConfigDict(extra="allow")  # extra keys reach the chat template

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(OpenAIBaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class ResponseFormat(OpenAIBaseModel):
    """``text``, ``json_object``, ``json_schema`` (``{"name", "schema", "strict"}``) or
    FastDeploy's ``structural_tag`` (``structures`` and ``triggers`` as extra keys);
    turned into a constraint by ``guided_request``."""

    model_config = ConfigDict(extra="allow")

    type: str
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


class RequestModel(OpenAIBaseModel):
    """A whole request body: every string in it, nested ones included, is valid Unicode."""

    @field_validator("*", mode="before")
    @classmethod
    def _unicode(cls, value: Any) -> Any:
        return _valid_unicode(value)


class SamplingFields(RequestModel):
    """Fields chat and completions share (OpenAI, then vLLM/FastDeploy extras)."""

    model: str | None = None
    frequency_penalty: StrictFloat | None = None
    presence_penalty: StrictFloat | None = None
    logit_bias: dict[str, float] | None = None
    max_tokens: StrictInt | None = None
    n: StrictInt = 1
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    temperature: StrictFloat | None = None
    top_p: StrictFloat | None = None
    user: str | None = None  # a tag for the caller's records; no effect on generation
    # vLLM / FastDeploy extras
    top_k: StrictInt | None = None
    min_p: StrictFloat | None = None
    min_tokens: StrictInt | None = None
    repetition_penalty: StrictFloat | None = None
    stop_token_ids: list[StrictInt] | None = None
    bad_words: list[str] | None = None
    # FastDeploy's flat list (each id a one-token word) or vLLM's list of token-id lists
    bad_words_token_ids: list[StrictInt | list[StrictInt]] | None = None  # flat, nested or mixed
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    ignore_eos: StrictBool = False
    prompt_logprobs: StrictInt | None = None
    include_logprobs_decode_token: StrictBool = True  # False: prompt_logprobs carry no decoded_token
    temp_scaled_logprobs: StrictBool = False  # logprobs of logits / temperature
    top_p_normalized_logprobs: StrictBool = False  # logprobs renormalised over the top-p set
    logits_processors_args: dict[str, Any] | None = None  # arguments of the server's --logits-processors
    return_token_ids: StrictBool = False  # prompt_token_ids / completion_token_ids in the answer
    max_streaming_response_tokens: StrictInt | None = Field(default=None, ge=1)  # tokens per chunk
    request_id: str | None = None  # FastDeploy: the caller's id, prefixed by ours
    trace_context: str | None = None  # FastDeploy's tracing context; no effect (fd-core has no tracing)
    # structured output (guided_request.py turns these into GuidedDecodingParams)
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_json_object: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    structural_tag: Any = None
    # known, refused unless no-op (unsupported.py says why)
    structured_outputs: Any = None
    mm_hashes: Any = None
    mm_processor_kwargs: Any = None
    include_draft_logprobs: Any = None
    disaggregate_info: Any = None
    collect_metrics: Any = None

    def sampling_kwargs(self) -> dict[str, Any]:
        """SamplingParams keyword arguments for the fields set; max_tokens is
        decided by the caller (it depends on the prompt length)."""
        kwargs: dict[str, Any] = dict(
            n=self.n, seed=self.seed, stop=self.stop or [], min_tokens=self.min_tokens or 0,
            stop_token_ids=self.stop_token_ids or [], bad_words=self.bad_words or [],
            bad_words_token_ids=self.bad_words_token_ids,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens, ignore_eos=self.ignore_eos,
            prompt_logprobs=self.prompt_logprobs, logit_bias=self.logit_bias,
        )
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty", "logits_processors_args"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        for name in ("temp_scaled_logprobs", "top_p_normalized_logprobs"):
            if getattr(self, name):
                kwargs[name] = True
        return kwargs

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]  # may be empty when prompt_token_ids is given
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None  # false: at most one tool call (guided_request)
    response_format: ResponseFormat | None = None
    metadata: dict[str, Any] | None = None  # tags; keys naming a request field set it (FastDeploy)
    store: Any = None  # false is accepted: nothing is stored
    service_tier: Any = None  # "auto" / "default" accepted: there is one tier
    modalities: Any = None  # ["text"] accepted
    prompt_cache_key: str | None = None  # accepted: prefix caching is automatic
    safety_identifier: str | None = None  # a tag, like user
    # chat template controls (vLLM / FastDeploy)
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}
    enable_thinking: StrictBool | None = None  # FastDeploy: the same as chat_template_kwargs.enable_thinking
    chat_template: str | None = None  # this request's jinja template (server may forbid it)
    add_generation_prompt: StrictBool = True
    disable_chat_template: StrictBool = False  # the single message's text is the prompt, untemplated
    prompt_token_ids: list[StrictInt] | None = None  # the prompt as ids: no template, messages unused
    completion_token_ids: list[StrictInt] | None = None  # appended to the prompt (a started answer)
    reasoning_max_tokens: StrictInt | None = None  # thinking budget (SamplingParams.reasoning_max_tokens)
    response_max_tokens: StrictInt | None = Field(default=None, ge=1)  # FastDeploy: caps max_tokens when not thinking
    # known, refused unless no-op
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None
    verbosity: Any = None

    @model_validator(mode="before")
    @classmethod
    def _metadata_fields(cls, data: Any) -> Any:
        """FastDeploy reads request fields from ``metadata`` too (``{"enable_thinking": false}``);
        a field given at the top level wins. Other metadata keys are tags."""
        if isinstance(data, dict) and isinstance(data.get("metadata"), dict):
            fields = {k: v for k, v in data["metadata"].items()
                      if k in cls.model_fields and k not in data and k != "metadata"}
            if fields:
                data = {**data, **fields}
        return data

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def template_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]] | None = None
    # FastDeploy: the prompt(s) as ids; wins over prompt when both are given
    prompt_token_ids: list[StrictInt] | list[list[StrictInt]] | None = None
    best_of: StrictInt | None = None  # sample best_of, answer the n with the highest cumulative logprob
    echo: StrictBool = False
    logprobs: StrictInt | None = None
    suffix: Any = None  # refused (OpenAI: text after the insertion; FastDeploy: a dict of extra fields)
    max_tokens: StrictInt | None = 16  # OpenAI's and vLLM's default for completions


class TokenizeRequest(RequestModel):
    """vLLM's /tokenize: either a prompt or chat messages."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: StrictBool = False


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[StrictInt]

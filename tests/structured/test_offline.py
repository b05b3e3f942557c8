"""Structured output end to end on a random-weight checkpoint, offline (``LLM``):
nothing but the constraint makes the outputs valid, so every completed output
parsing and validating is the behaviour under test."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from fd_core import LLM, SamplingParams
from fd_core.sampling.guided import GuidedDecodingParams
from tests.structured.schemas import FAST, SCHEMAS

MAX_TOKENS = 160


@pytest.fixture(scope="module")
def llm(checkpoint_factory):
    return LLM(model=str(checkpoint_factory("tiny-dense", "pytorch")), backend="cpu", max_model_len=512,
               guided_decoding_disable_any_whitespace=True)


def _run_schemas(llm: LLM, names: list[str]) -> None:
    params = [SamplingParams(max_tokens=MAX_TOKENS, seed=i, guided_decoding={"json": SCHEMAS[name]})
              for i, name in enumerate(names)]
    # unconstrained requests in the same batches
    params += [SamplingParams(max_tokens=12, seed=100 + i) for i in range(2)]
    outs = llm.generate(["Give me JSON:"] * len(params), params, use_tqdm=False)
    finished = 0
    for name, out in zip(names, outs):
        c = out.outputs[0]
        if c.finish_reason == "length":
            continue
        assert c.finish_reason == "stop", (name, c.finish_reason, c.stop_reason)
        value = json.loads(c.text)
        jsonschema.validate(value, SCHEMAS[name])
        finished += 1
    assert finished >= len(names) * 3 // 4, f"only {finished} of {len(names)} completed"
    for out in outs[len(names):]:
        assert len(out.outputs[0].token_ids) == 12  # unconstrained rows ran on, unmasked


def test_fast_schemas_complete_and_validate(llm):
    _run_schemas(llm, FAST)


def test_every_schema_completes_and_validates(llm):  # 32 schemas: ~3 s on 2 cores, so not marked slow
    _run_schemas(llm, list(SCHEMAS))


def test_regex_choice_and_grammar(llm):
    grammar = 'root ::= "(" num ("+" num)* ")"\nnum ::= [0-9]{1,2}'
    params = [
        SamplingParams(max_tokens=40, seed=1, guided_decoding={"regex": "[a-z]{3}-[0-9]{2}"}),
        SamplingParams(max_tokens=40, seed=2, guided_decoding=GuidedDecodingParams(choice=["yes", "no", "maybe"])),
        SamplingParams(max_tokens=60, seed=3, guided_decoding={"grammar": grammar}),
    ]
    regex, choice, gbnf = (o.outputs[0] for o in llm.generate(["x"] * 3, params, use_tqdm=False))
    assert re.fullmatch("[a-z]{3}-[0-9]{2}", regex.text) and regex.finish_reason == "stop"
    assert choice.text in ("yes", "no", "maybe") and choice.finish_reason == "stop"
    if gbnf.finish_reason == "stop":
        assert re.fullmatch(r"\([0-9]{1,2}(\+[0-9]{1,2})*\)", gbnf.text)
    else:  # cut by max_tokens: still a prefix of the language
        assert re.fullmatch(r"\([0-9+]*", gbnf.text)


def test_same_schema_streams_the_same_tokens_alone_and_batched(llm):
    schema = SCHEMAS["flat_object"]
    p = SamplingParams(max_tokens=MAX_TOKENS, seed=7, guided_decoding={"json": schema})
    alone = llm.generate(["a"], [p], use_tqdm=False)[0].outputs[0].text
    batch = llm.generate(["a", "b"], [p, SamplingParams(max_tokens=5, seed=1)], use_tqdm=False)
    assert batch[0].outputs[0].text == alone


@pytest.mark.parametrize("guided, match", [
    ({"json": {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}}, "uniqueItems"),
    ({"json": {"type": "strin"}}, "strin"),
    ({"regex": "a(b"}, "unclosed group"),
    ({"grammar": "start: x y"}, "unknown name"),
    ({"json": {"$ref": "#/$defs/missing"}}, "missing"),
])
def test_a_constraint_that_does_not_compile_is_refused_naming_it(llm, guided, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(["x"], SamplingParams(max_tokens=5, guided_decoding=guided), use_tqdm=False)


def test_conflicting_constraints_are_refused():
    with pytest.raises(ValueError, match="json and regex together"):
        SamplingParams(guided_decoding={"json": {"type": "object"}, "regex": "a"})
    with pytest.raises(ValueError, match="unknown field"):
        SamplingParams(guided_decoding={"jsn": {}})

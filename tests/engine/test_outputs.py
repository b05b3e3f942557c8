"""RequestOutput reads both ways: FastDeploy's ``outputs.text`` and vLLM's ``outputs[0].text``."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from fd_core.engine.outputs import (
    CompletionOutput,
    CompletionOutputs,
    RequestMetrics,
    RequestOutput,
)


def make(n: int = 2) -> RequestOutput:
    samples = [CompletionOutput(index=i, text=f"text {i}", token_ids=[10 + i, 20 + i], finish_reason="stop",
                                delta_token_ids=[20 + i], reasoning_content=f"thought {i}")
               for i in range(n)]
    metrics = RequestMetrics(arrival_time=1.0, first_scheduled_time=1.5, first_token_time=2.0, finished_time=3.0)
    return RequestOutput("r", "prompt", [1, 2], samples, True, metrics)


def test_outputs_is_a_list_that_reads_as_its_first_sample():
    out = make()
    assert isinstance(out.outputs, CompletionOutputs) and isinstance(out.outputs, list)
    assert len(out.outputs) == 2 and [c.index for c in out.outputs] == [0, 1]
    assert out.outputs[1].text == "text 1" and out.outputs[-1].token_ids == [11, 21]
    assert [c.text for c in out.outputs[:1]] == ["text 0"]
    # FastDeploy's single-sample access: sample 0
    assert (out.outputs.text, out.outputs.token_ids, out.outputs.index) == ("text 0", [10, 20], 0)
    assert out.outputs.reasoning_content == "thought 0" and out.outputs.tool_calls is None
    assert out.outputs.finish_reason == "stop" and out.outputs.finished
    assert out.outputs.send_idx == 0 and out.outputs.draft_token_ids == []
    out.outputs.text = "changed"  # FastDeploy scripts assign too
    assert out.outputs[0].text == "changed"


def test_fastdeploy_request_fields():
    out = make(1)
    assert out.error_code == 200 and out.error_msg is None
    m = out.metrics
    assert (m.request_start_time, m.inference_start_time, m.time_in_queue) == (1.0, 1.5, 0.5)
    assert m.model_execute_time == 1.5 and m.model_forward_time is None


def test_plain_lists_are_wrapped_and_survive_pickle_copy_and_replace():
    out = make()
    for again in (pickle.loads(pickle.dumps(out)), copy.deepcopy(out),
                  dataclasses.replace(out, outputs=list(out.outputs))):
        assert isinstance(again.outputs, CompletionOutputs)
        assert again == out and again.outputs.text == "text 0"
    assert dataclasses.asdict(out)["outputs"][1]["text"] == "text 1"


def test_no_samples_is_an_attribute_error_naming_the_field():
    out = RequestOutput("r", None, [1], [], False, RequestMetrics(0.0))
    assert list(out.outputs) == []
    with pytest.raises(AttributeError, match="outputs.text: this request has no samples"):
        _ = out.outputs.text

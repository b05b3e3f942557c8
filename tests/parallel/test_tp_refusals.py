"""Quantization methods whose scales tensor parallelism would split unlike one device are
refused before any worker starts, naming the size and the method."""

from __future__ import annotations

import pytest

from fd_core.backends import get_backend
from fd_core.engine.model_runner import ModelRunner
from fd_core.errors import UnsupportedFeatureError
from fd_core.parallel.driver import make_runner
from fd_core.quantization.config import parse_quantization


@pytest.mark.parametrize("method", ["block_wise_fp8", "w4a8", "w4afp8"])
def test_block_and_group_scaled_methods_are_refused_under_tp(checkpoint_factory, method: str) -> None:
    model_dir = checkpoint_factory("tiny-dense", "pytorch")
    quant = parse_quantization(method, "Ernie4_5ForCausalLM")
    with pytest.raises(UnsupportedFeatureError, match=rf"--tensor-parallel-size 2 with --quantization {method}"):
        make_runner(ModelRunner, model_dir, get_backend("cpu"), 2, quantization=quant)


def test_a_mix_names_only_the_method_that_cannot_split(checkpoint_factory) -> None:
    model_dir = checkpoint_factory("tiny-moe", "paddle")
    quant = parse_quantization({"quantization": "mix_quant", "dense_quant_type": "wint8",
                                "moe_quant_type": "w4a8"}, "Ernie4_5_MoeForCausalLM")
    with pytest.raises(UnsupportedFeatureError, match=r"--quantization w4a8: each rank"):
        make_runner(ModelRunner, model_dir, get_backend("cpu"), 2, quantization=quant)

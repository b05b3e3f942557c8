"""benchmarks/decode_bandwidth.py's helpers: quantization specs per LM head and the bytes a step reads."""

from __future__ import annotations

from tests.benchmarks.test_llama_cpp import _load

script = _load("decode_bandwidth")


def test_quantization_per_lm_head():
    assert script.quantization("fp32", "same", 128) is None
    int4 = script.quantization("int4", "same", 128)
    assert int4["dense_quant_type"] == "wint4" and int4["lm_head_quant_type"] == "wint4"
    assert "lm_head_quant_type" not in script.quantization("int4", "float", 128)
    assert script.quantization("w8a8", "int8", 128)["lm_head_quant_type"] == "w8a8"


def test_step_bytes_count_a_tied_head_once_and_one_embedding_row(checkpoint_factory, cpu_backend):
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.quantization.weights import resident_bytes

    model = ModelRunner(checkpoint_factory("tiny-dense", "pytorch"), cpu_backend, num_blocks=8, block_size=16,
                        dtype="float32").model
    v, d = model.config.vocab_size, model.config.hidden_size
    rest = sum(resident_bytes(p.data) for name, p in model.parameters().items() if name != "embed_tokens")
    assert script.step_bytes(model) == rest + v * d * 4 + d * 4  # head + one row of the table


def test_step_bytes_count_the_routed_experts_a_token_reads(checkpoint_factory, cpu_backend):
    """A MoE layer's stacked routed experts count top_k / num_experts of their bytes (one token's experts)."""
    from fd_core.engine.model_runner import ModelRunner
    from fd_core.layers.mlp import MoE
    from fd_core.quantization.weights import resident_bytes

    model = ModelRunner(checkpoint_factory("tiny-moe", "pytorch"), cpu_backend, num_blocks=8, block_size=16,
                        dtype="float32").model
    moes = [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE)]
    assert moes
    stacked = sum(resident_bytes(p.data) for m in moes for p in (m.up_gate_proj, m.down_proj))
    read = sum(resident_bytes(p.data) * m.top_k // int(m.gate.shape[1])
               for m in moes for p in (m.up_gate_proj, m.down_proj))
    assert 0 < read < stacked
    v, d = model.config.vocab_size, model.config.hidden_size
    rest = sum(resident_bytes(p.data) for name, p in model.parameters().items() if name != "embed_tokens")
    head = v * d * 4 if model.config.tie_word_embeddings else 0  # a tied head is not in parameters()
    assert script.step_bytes(model) == rest - stacked + read + head + d * 4

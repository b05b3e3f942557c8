"""FastDeploy's offline-quantized ERNIE checkpoints (FP8, W4A8C8, 2Bits):
generated in their on-disk layout, detected from config.json, loaded as
stored, and checked against numpy decodings of the raw file tensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import paddle
import pytest

from fd_core import LLM, SamplingParams
from fd_core.errors import UnsupportedFeatureError
from fd_core.model_loader import load_model
from fd_core.ops.linear import QuantizedWeight
from fd_core.quantization import dequantize, parse_quantization
from fd_core.quantization.offline import checkpoint_quantization, read_offline
from fd_core.quantization.reference import quantized_linear
from fd_core.testing.quantized_checkpoints import generate_offline_checkpoint

SHAPES = {"fp8": {}, "w4a8c8": {}, "2bits": {"hidden_size": 128, "moe_intermediate_size": 128}}
METHODS = {"fp8": {"block_wise_fp8"}, "w4a8c8": {"wint8", "w4a8_static"}, "2bits": {"wint8", "wint4", "wint2"}}


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """fmt -> (float checkpoint, offline checkpoint), generated once."""
    root = tmp_path_factory.mktemp("offline")
    return {fmt: generate_offline_checkpoint(root / fmt, fmt, "tiny-moe", seed=1, **SHAPES[fmt]) for fmt in SHAPES}


def read_raw(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file read with json and numpy alone (fp8 as its bits, bf16 widened)."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    kinds = {"F32": np.float32, "I8": np.int8, "U8": np.uint8, "F8_E4M3": np.uint8, "BF16": np.uint16}
    out = {}
    for name, entry in header.items():
        lo, hi = entry["data_offsets"]
        array = np.frombuffer(data[8 + size + lo: 8 + size + hi], dtype=kinds[entry["dtype"]]).reshape(entry["shape"])
        if entry["dtype"] == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        out[name] = array
    return out


def e4m3(bits: np.ndarray) -> np.ndarray:
    """e4m3fn bit patterns -> values, from the format's definition."""
    b = bits.astype(np.int64)
    sign = np.where(b >> 7, -1.0, 1.0)
    exp, man = (b >> 3) & 0xF, b & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7))
    return sign * np.where((exp == 15) & (man == 7), np.nan, value)


def nibbles(packed: np.ndarray) -> np.ndarray:
    """int8 bytes [in/2, out] -> signed codes [in, out] (low nibble = even input)."""
    b = packed.view(np.uint8).astype(np.int64)
    low, high = b & 0xF, b >> 4
    codes = np.empty((2 * b.shape[0], b.shape[1]), dtype=np.int64)
    codes[0::2], codes[1::2] = low, high
    return np.where(codes >= 8, codes - 16, codes)


def wint2_weight(t: dict[str, np.ndarray]) -> np.ndarray:
    """moe_wint2_ffn_kernel's decoding, vectorised: [in, out]."""
    qw, ws = t["quant_weight"].astype(np.float64), t["weight_scale"].astype(np.int64)
    code = np.floor(qw * t["code_scale"].astype(np.float32) + t["code_zp"].astype(np.float32) + 0.5).astype(np.int64)
    in_f = 4 * qw.shape[0]
    w = np.empty((in_f, qw.shape[1]))
    for k in range(in_f):
        r, j = divmod(k, 4)
        q = ((code[r] >> (9 - 3 * j)) & 0x3F) - 32
        group = (ws[k // 128] >> 4) & 0xF if (k // 64) % 2 == 0 else ws[k // 128] & 0xF
        w[k] = q * group * t["super_scales"].astype(np.float64)
    return w


def numpy_weight(method: str, t: dict[str, np.ndarray]) -> np.ndarray:
    """One matrix [in, out] from its stored tensors."""
    if method == "block_wise_fp8":
        scales = np.repeat(np.repeat(t["weight_scale"], 128, axis=0), 128, axis=1)
        qw = t["quant_weight"]
        return e4m3(qw) * scales[: qw.shape[0], : qw.shape[1]]
    if method == "wint8":
        return (t["quant_weight"].astype(np.float64) * t["weight_scale"][:, None]).T
    if method == "wint4":
        return nibbles(t["quant_weight"]) * t["weight_scale"].astype(np.float64)[None, :]
    if method == "w4a8_static":
        return nibbles(t["quant_weight"]) * (t["weight_scale"].astype(np.float64) / 7)[None, :]
    return wint2_weight(t)


def stored(raw: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {name[len(prefix) + 1:]: value for name, value in raw.items() if name.startswith(prefix + ".")}


def checkpoint_prefixes(name: str, param) -> list[tuple[str, int | None]]:
    """fd-core parameter name -> the stored prefix of each matrix (expert index or None)."""
    layer, rest = name.split(".", 2)[1], name.split(".", 2)[2]
    base = f"ernie.layers.{layer}"
    fixed = {"qkv_proj": "self_attn.qkv_proj", "o_proj": "self_attn.o_proj", "up_gate_proj": "mlp.up_gate_proj",
             "down_proj": "mlp.down_proj", "shared_experts.up_gate_proj": "mlp.shared_experts.up_gate_proj",
             "shared_experts.down_proj": "mlp.shared_experts.down_proj"}
    if rest.startswith("experts."):
        proj = rest.split(".", 1)[1]
        return [(f"{base}.mlp.experts.{e}.{proj}", e) for e in range(int(param.data.qweight.shape[0]))]
    return [(f"{base}.{fixed[rest]}", None)]


@pytest.mark.parametrize("fmt", list(SHAPES))
def test_every_weight_equals_numpy_decoding_of_the_file(cpu_backend, offline, fmt):
    _, ck = offline[fmt]
    raw = read_raw(ck / "model.safetensors")
    model = load_model(ck, cpu_backend.ops)
    seen = set()
    for name, param in model.parameters().items():
        if not isinstance(param.data, QuantizedWeight):
            continue
        seen.add(param.data.method)
        for prefix, expert in checkpoint_prefixes(name, param):
            quant = param.data if expert is None else param.data.expert(expert)
            want = numpy_weight(quant.method, stored(raw, prefix))
            np.testing.assert_allclose(dequantize(quant).numpy(), want, rtol=1e-6, atol=1e-7, err_msg=prefix)
    assert seen == METHODS[fmt]
    assert raw["ernie.embed_tokens.weight"].dtype == np.float32  # stored float, loaded as is


def test_w4a8_static_linear_matches_numpy(cpu_backend, offline):
    _, ck = offline["w4a8c8"]
    raw = read_raw(ck / "model.safetensors")
    model = load_model(ck, cpu_backend.ops)
    stacked = model.parameters()["layers.1.experts.down_proj"].data
    t = stored(raw, "ernie.layers.1.mlp.experts.3.down_proj")
    x = np.random.default_rng(0).standard_normal((5, stacked.in_features)).astype(np.float32)
    x[0, 0] = 10 * t["activation_scale"][0]  # beyond the static range: clipped to 127
    a = np.float64(t["activation_scale"][0])
    xq = np.clip(np.rint(x.astype(np.float64) * np.float32(127 / a)), -127, 127)
    want = (xq @ (nibbles(t["quant_weight"]) * (t["weight_scale"].astype(np.float64) / 7))) * a / 127
    got = quantized_linear(paddle.to_tensor(x), stacked.expert(3)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_fp8_checkpoint_equals_online_block_wise_fp8(cpu_backend, offline):
    """The generator quantizes with FastDeploy's per_block_cast_to_fp8 rule, so the
    offline checkpoint must load into exactly the online method's weights."""
    float_dir, ck = offline["fp8"]
    online = load_model(float_dir, cpu_backend.ops, quantization=parse_quantization("block_wise_fp8"))
    stored_model = load_model(ck, cpu_backend.ops)
    for name, param in stored_model.parameters().items():
        other = online.parameters()[name].data
        if isinstance(param.data, QuantizedWeight):
            np.testing.assert_array_equal(param.data.qweight.numpy(), other.qweight.numpy(), err_msg=name)
            np.testing.assert_array_equal(param.data.scales.numpy(), other.scales.numpy(), err_msg=name)
        else:
            np.testing.assert_array_equal(param.data.numpy(), other.numpy(), err_msg=name)


def test_kv_scales_load_per_channel(cpu_backend, offline):
    _, ck = offline["w4a8c8"]
    raw = read_raw(ck / "model.safetensors")
    model = load_model(ck, cpu_backend.ops)
    cfg = json.loads((ck / "config.json").read_text())
    assert sorted(model.kv_cache_static_scales) == list(range(cfg["num_hidden_layers"]))
    k, v = model.kv_cache_static_scales[2]
    np.testing.assert_array_equal(k.data.numpy(), raw["ernie.layers.2.self_attn.cachek_matmul.activation_scale"])
    np.testing.assert_array_equal(v.data.numpy(), raw["ernie.layers.2.self_attn.cachev_matmul.activation_scale"])
    assert k.data.shape == [cfg["num_key_value_heads"] * cfg["head_dim"]]


@pytest.mark.parametrize("fmt,kv", [("fp8", "float32"), ("w4a8c8", "int8_static"), ("2bits", "float32")])
def test_llm_runs_without_a_flag(offline, fmt, kv):
    _, ck = offline[fmt]
    llm = LLM(str(ck), backend="cpu", max_model_len=128, num_gpu_blocks_override=32, block_size=16)
    core = llm.engine.core
    assert core.quantization.offline is not None and core.runner.kv_cache_dtype == kv
    outs = llm.generate(["hello there", "the quick brown fox"],
                        SamplingParams(max_tokens=5, temperature=0, ignore_eos=True), use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 5 for o in outs)


@pytest.mark.parametrize("fmt,same,other", [("fp8", "block_wise_fp8", "wint8"), ("w4a8c8", "w4a8", "wint4"),
                                            ("2bits", "wint2", "wint8")])
def test_a_conflicting_flag_is_refused_by_name(offline, fmt, same, other):
    _, ck = offline[fmt]
    assert checkpoint_quantization(ck, same).offline is not None
    with pytest.raises(ValueError, match=f"--quantization {other} conflicts with the checkpoint.*offline-quantized"):
        checkpoint_quantization(ck, other)


def test_load_model_refuses_a_quantization_config_beside_an_offline_checkpoint(cpu_backend, offline):
    _, ck = offline["fp8"]
    with pytest.raises(ValueError, match="conflicts with the checkpoint"):
        load_model(ck, cpu_backend.ops, quantization=parse_quantization("wint8"))


def test_detection_rules():
    fp8 = {"quantization_config": {"quantization": "block_wise_fp8"}}
    assert read_offline(fp8).methods() == ("block_wise_fp8",)
    assert read_offline({"quantization_config": {"quantization": "wint8", "is_quantized": False}}) is None
    assert read_offline({"quantization_config": {"kv_cache_quant_type": "int8"}}) is None
    assert read_offline({}) is None
    two = read_offline({"is_quantized": True, "quantization_config": {
        "dense_quant_type": "wint8", "moe_quant_type": "w4w2", "quantization": "wint2",
        "moe_quant_config": {"moe_w4_quant_config": {"quant_type": "wint4", "quant_granularity": "per_channel",
                                                     "quant_start_layer": 0, "quant_end_layer": 6},
                             "moe_w2_quant_config": {"quant_type": "wint2", "quant_granularity": "pp_acc",
                                                     "quant_group_size": 64, "quant_start_layer": 7,
                                                     "quant_end_layer": 53}}}})
    assert (two.moe_method_of(6), two.moe_method_of(7), two.dense_method) == ("wint4", "wint2", "wint8")
    c8 = read_offline({"quantization_config": {"quantization": "mix_quant", "dense_quant_type": "wint8",
                                               "moe_quant_type": "w4a8", "kv_cache_quant_type": "int8"}})
    assert (c8.moe_method, c8.kv_cache_dtype, c8.static_kv_scales) == ("w4a8_static", "int8", True)


@pytest.mark.parametrize("qc,match", [
    ({"quantization": "w4afp8"}, "'w4afp8' weights are not readable"),
    ({"quantization": "block_wise_fp8", "weight_block_size": [64, 64]}, r"\[128, 128\] blocks only"),
    ({"quantization": "mix_quant", "dense_quant_type": "wint4", "moe_quant_type": "w4a8"}, "dense_quant_type 'wint4'"),
    ({"quantization": "block_wise_fp8", "kv_cache_quant_type": "int4_zp"}, "'int4_zp' is not supported"),
])
def test_unreadable_formats_are_refused_by_name(qc, match):
    with pytest.raises(UnsupportedFeatureError, match=match):
        read_offline({"quantization_config": qc})


def test_online_spec_in_config_is_the_default_quantization(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"quantization_config": {"quantization": "wint8", "is_quantized": False}}))
    assert checkpoint_quantization(tmp_path, None).method == "wint8"
    assert checkpoint_quantization(tmp_path, "wint4").method == "wint4"  # the flag wins over an online spec


def test_backend_without_the_stored_methods_refuses_naming_it(offline, monkeypatch):
    from fd_core.backends.base import Backend
    from fd_core.plugins.types import Capabilities

    _, ck = offline["2bits"]
    monkeypatch.setattr(Backend, "capabilities", lambda self: Capabilities(quantization_methods=("wint8", "wint4")))
    with pytest.raises(UnsupportedFeatureError, match="offline-quantized checkpoint .*backend 'cpu' cannot run its "
                                                      "stored wint2"):
        LLM(str(ck), backend="cpu", max_model_len=128, num_gpu_blocks_override=32, block_size=16)


def test_codes_stored_as_floats_are_refused_naming_the_tensor(cpu_backend, tmp_path):
    """A corrupt (or foreign) checkpoint whose code tensor is float: never cast into codes."""
    from safetensors.numpy import load_file, save_file

    out = generate_offline_checkpoint(tmp_path / "w", "w4a8c8", "tiny-moe", seed=1)
    path = Path(out[1] if isinstance(out, tuple) else out)
    shard = sorted(path.glob("*.safetensors"))[0]
    tensors = load_file(str(shard))
    name = next(n for n in tensors if n.endswith("qkv_proj.quant_weight"))
    tensors[name] = tensors[name].astype(np.float32) * 3.3
    save_file(tensors, str(shard), metadata={"format": "np"})
    with pytest.raises(ValueError, match=r"qkv_proj\.quant_weight: stored as float32, expected int8 / uint8"):
        load_model(path, cpu_backend.ops)

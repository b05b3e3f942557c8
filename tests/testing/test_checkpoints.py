"""Generated checkpoints: HF loads them cleanly, bytes are deterministic, namings hold one model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fd_core.testing.checkpoints import SHAPES, generate_checkpoint, main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


def load_tensors(path: Path) -> dict:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(f))
    return out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """(shape, naming, seed, dtype, shards) -> generated directory, cached per module."""
    cache: dict[tuple, Path] = {}

    def get(
        shape: str, naming: str = "pytorch", seed: int = 0, dtype: str = "bfloat16", shards: int = 1
    ) -> Path:
        key = (shape, naming, seed, dtype, shards)
        if key not in cache:
            cache[key] = generate_checkpoint(
                tmp_path_factory.mktemp(shape), shape, naming, seed, dtype, shards
            )
        return cache[key]

    return get


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
def test_hf_loads_without_key_problems_and_generates(ckpt, shape: str) -> None:  # noqa: ANN001
    path = ckpt(shape)
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert (
        type(model).__name__ == json.loads((path / "config.json").read_text())["architectures"][0]
    )
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(kind), (kind, info[kind])
    tok = transformers.AutoTokenizer.from_pretrained(path)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "你好"}],
        add_generation_prompt=True,
        return_dict=False,
        return_tensors="pt",
    )
    out = model.generate(
        prompt, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    new = out[0, prompt.shape[1] :].tolist()
    assert len(new) == 24 and len(set(new)) >= 4  # a random model, but not a degenerate one


def test_e_score_correction_bias_changes_routing(ckpt) -> None:  # noqa: ANN001
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt("tiny-moe"), dtype=torch.float32)
    ids = torch.arange(40, 104).reshape(1, -1)
    with torch.no_grad():
        before = model(ids).logits
        for layer in model.model.layers[1:]:
            assert layer.mlp.gate.moe_statics.e_score_correction_bias.abs().max() > 0
            layer.mlp.gate.moe_statics.e_score_correction_bias.zero_()
        after = model(ids).logits
    assert not torch.allclose(before, after, atol=1e-3)


@pytest.mark.parametrize("naming", ["pytorch", "paddle"])
def test_same_seed_gives_identical_bytes(ckpt, tmp_path: Path, naming: str) -> None:  # noqa: ANN001
    first = ckpt("tiny-moe", naming)
    again = generate_checkpoint(tmp_path / "again", "tiny-moe", naming, seed=0)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    other = generate_checkpoint(tmp_path / "other", "tiny-moe", naming, seed=1)
    assert (other / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()


def test_sharded_index_is_consistent(ckpt) -> None:  # noqa: ANN001
    path = ckpt("tiny-moe", "paddle", shards=3)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in path.glob("*.safetensors"))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    total = 0
    for name in files:
        tensors = safetensors_torch.load_file(path / name)
        assert tensors and all(index["weight_map"][t] == name for t in tensors)
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    assert index["metadata"]["total_size"] == total
    assert load_tensors(path).keys() == index["weight_map"].keys()
    single = load_tensors(ckpt("tiny-moe", "paddle"))
    assert all(torch.equal(single[k], v) for k, v in load_tensors(path).items())


@pytest.mark.parametrize("shape", ["tiny-dense", "tiny-moe"])
def test_paddle_naming_is_the_transformed_pytorch_model(ckpt, shape: str) -> None:  # noqa: ANN001
    pt, pd = load_tensors(ckpt(shape, "pytorch")), load_tensors(ckpt(shape, "paddle"))
    cfg = SHAPES[shape]
    expected: dict[str, torch.Tensor] = {}
    for name, t in pt.items():
        pname = name.replace("model.", "ernie.", 1)
        if name.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            continue
        if name.endswith("q_proj.weight"):
            qkv = [pt[name.replace("q_proj", x)] for x in ("q_proj", "k_proj", "v_proj")]
            expected[pname.replace("q_proj", "qkv_proj")] = torch.cat(qkv, 0).T
        elif name.endswith("gate_proj.weight"):
            expected[pname.replace("gate_proj", "up_gate_proj")] = torch.cat(
                [t, pt[name.replace("gate", "up")]], 0
            ).T
        elif t.dim() == 2 and not name.endswith(("embed_tokens.weight", "e_score_correction_bias")):
            expected[pname] = t.T
        else:
            expected[pname] = t
    assert expected.keys() == pd.keys()
    for name, t in expected.items():
        assert pd[name].dtype == t.dtype and torch.equal(pd[name], t), name
    h, d = cfg["hidden_size"], cfg["head_dim"]
    qkv = pd["ernie.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.shape == (h, (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * d)
    assert pd["ernie.layers.0.mlp.up_gate_proj.weight"].shape == (h, 2 * cfg["intermediate_size"])
    if shape == "tiny-moe":
        assert (
            pd["ernie.layers.1.mlp.gate.weight"].shape == (h, 8)
            and pd["ernie.layers.1.mlp.gate.weight"].dtype == torch.float32
        )
        bias = pd["ernie.layers.1.mlp.moe_statics.e_score_correction_bias"]
        assert bias.shape == (1, 8) and bias.dtype == torch.float32
        assert "ernie.layers.0.mlp.gate.weight" not in pd  # layer 0 is dense
    assert not any(k.startswith("lm_head") for k in pd)  # tied embeddings


def test_bf16_is_round_to_nearest_even_of_fp32(ckpt) -> None:  # noqa: ANN001
    fp32, bf16 = load_tensors(ckpt("tiny-dense", dtype="float32")), load_tensors(ckpt("tiny-dense"))
    for name, t in fp32.items():
        assert bf16[name].dtype == torch.bfloat16 and torch.equal(
            t.to(torch.bfloat16), bf16[name]
        ), name


def test_config_marks_generated_and_names_architecture(ckpt) -> None:  # noqa: ANN001
    for naming, arch in (("pytorch", "Ernie4_5ForCausalLM"), ("paddle", "Ernie4_5_ForCausalLM")):
        cfg = json.loads((ckpt("tiny-dense", naming) / "config.json").read_text())
        assert cfg["architectures"] == [arch] and cfg["model_type"] == "ernie4_5"
        assert (
            cfg["fd_generated"]["seed"] == 0
            and "not a trained model" in cfg["fd_generated"]["note"]
        )
    gen = json.loads((ckpt("tiny-dense") / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [2, 4]


def test_command_line(tmp_path: Path) -> None:
    assert (
        main(["--shape", "tiny-dense", "--naming", "paddle", "--out", str(tmp_path), "--seed", "3"])
        == 0
    )
    assert json.loads((tmp_path / "config.json").read_text())["fd_generated"]["seed"] == 3
    with pytest.raises(ValueError, match="unknown checkpoint shape"):
        generate_checkpoint(tmp_path, "tiny-huge")


def test_overrides_and_vocab_check(tmp_path: Path) -> None:
    path = generate_checkpoint(tmp_path / "a", "tiny-dense", num_hidden_layers=1, vocab_size=4096)
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 1
    assert load_tensors(path)["model.embed_tokens.weight"].shape == (4096, 64)
    with pytest.raises(ValueError, match="vocab_size 100"):
        generate_checkpoint(tmp_path / "b", "tiny-dense", vocab_size=100)


@pytest.mark.slow
def test_0_3b_shape(tmp_path: Path) -> None:
    path = generate_checkpoint(tmp_path, "0.3b", "paddle", shards=2)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    params = index["metadata"]["total_size"] // 2
    assert 300e6 < params < 400e6
    from fd_core.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(path)
    assert tok.vocab_size == 103424 and tok.decode([103423]) == "<unused_103423>"
    with open(path / "model-00001-of-00002.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["ernie.embed_tokens.weight"]["shape"] == [103424, 1024]
    assert np.isfinite(params)


@pytest.mark.slow
def test_0_3b_pytorch_naming_loads_in_hf(tmp_path: Path) -> None:
    path = generate_checkpoint(tmp_path, "0.3b", "pytorch")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        path, output_loading_info=True, dtype=torch.bfloat16
    )
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(360e6, rel=0.05)


def test_untied_head_is_stored_per_naming(tmp_path: Path) -> None:
    pt = load_tensors(generate_checkpoint(tmp_path / "pt", "tiny-dense", tie_word_embeddings=False))
    pd = load_tensors(
        generate_checkpoint(tmp_path / "pd", "tiny-dense", "paddle", tie_word_embeddings=False)
    )
    assert pt["lm_head.weight"].shape == (2048, 64)
    assert torch.equal(pd["lm_head.weight"], pt["lm_head.weight"].T)  # Paddle: [in, out]

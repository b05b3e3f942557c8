"""benchmarks/llama_cpp.py without llama.cpp: flags, tables, tool-output parsing, the MoE shape.

Nothing here downloads, builds or runs llama.cpp or an engine.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))  # the script's helper modules import each other by name


def _load(name: str) -> ModuleType:
    # by path: "llama_cpp" is also llama-cpp-python's package name
    spec = importlib.util.spec_from_file_location(f"fd_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


script = _load("llama_cpp")
runs = _load("llama_cpp_runs")
build = _load("llama_cpp_build")
shapes = _load("llama_cpp_shapes")


def test_defaults_and_quick_mode():
    args = script.parse_args([])
    assert args.shapes == ["0.3b", "mid-moe"] and args.batch == [1, 8, 32] and args.rounds == 2
    assert args.threads == 2 and args.prompt_len == 128 and args.prefill_len == 512 and args.lm_head == "float"
    assert args.reload and not script.parse_args(["--no-reload"]).reload
    quick = script.parse_args(["--quick"])
    assert quick.shapes == ["tiny-dense", "tiny-moe"] and quick.batch == [1, 8] and quick.rounds == 1
    assert script.parse_args(["--batch", "8", "1", "8"]).batch == [1, 8]


@pytest.mark.parametrize("argv, flag", [(["--threads", "0"], "--threads"), (["--rounds", "0"], "--rounds"),
                                        (["--batch", "0"], "--batch"), (["--shapes", "7b"], "--shapes"),
                                        (["--lm-head", "int4"], "--lm-head")])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        script.parse_args(argv)
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_table_pairs_fd_rows_with_llama_rows_of_equal_bits():
    llama = {"q8_0": {"decode": {1: 50.0, 8: 100.0}, "prefill": 300.0},
             "q4_0": {"decode": {1: 80.0, 8: 120.0}, "prefill": 400.0}}
    fd = [{"label": "fd-core x86 wint8", "pair": "q8_0", "decode": {1: 65.0, 8: 200.0}, "prefill": 1500.0},
          {"label": "fd-core x86 fp32", "pair": "f32", "decode": {1: 10.0, 8: 50.0}, "prefill": 280.0}]
    lines = script.format_table("0.3B", [1, 8], 512, llama, fd).splitlines()
    assert lines[0] == "| 0.3B | B=1 | B=8 | prefill, one 512-token prompt | ratio to |"
    assert lines[2] == "| llama.cpp q8_0 | 50.0 | 100.0 | 300.0 |  |"
    assert lines[4] == "| fd-core x86 wint8 | 65.0 (1.30x) | 200.0 (2.00x) | 1500 (5.00x) | llama.cpp q8_0 |"
    assert lines[5] == "| fd-core x86 fp32 | 10.0 | 50.0 | 280.0 |  |"  # no f32 row measured: no ratio


def test_agreement_names_the_first_differing_token():
    assert script.agreement([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]]) == "equal"
    assert script.agreement([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5]]) == "not equal (prompt 0 from token 1)"


def test_parse_batched_bench_jsonl_and_llama_bench_json():
    text = "\n".join([
        "main: n_kv_max = 5120, ...",
        json.dumps({"pp": 128, "tg": 32, "pl": 1, "speed_pp": 300.0, "speed_tg": 55.5}),
        json.dumps({"pp": 128, "tg": 32, "pl": 8, "speed_pp": 310.0, "speed_tg": 120.25}),
    ])
    assert runs.parse_batched_jsonl(text) == {1: 55.5, 8: 120.25}
    # the script's trailing B=1 case (lost lines at exit) must not replace the measured one; a log line may
    # share a line with a row
    extra = "0.01 W log " + json.dumps({"pp": 128, "tg": 32, "pl": 1, "speed_tg": 99.0})
    assert runs.parse_batched_jsonl(text + "\n" + extra) == {1: 55.5, 8: 120.25}
    with pytest.raises(ValueError, match="speed_tg"):
        runs.parse_batched_jsonl("llama_model_load: error loading model")
    bench = 'build: 0c1e570\n[\n  {"n_prompt": 512, "n_gen": 0, "avg_ts": 298.5, "stddev_ts": 1.0}\n]\n'
    assert runs.parse_bench_json(bench) == 298.5


def test_mid_moe_shape_and_the_shared_expert_width_fix():
    from fd_core.testing.checkpoints import SHAPES, pytorch_tensor_specs

    shape = shapes.SHAPES["mid-moe"]
    cfg = {**SHAPES[shape.generator], **shape.overrides}
    specs = {s.name: s.shape for s in pytorch_tensor_specs(cfg)}
    assert specs["model.layers.0.mlp.gate_proj.weight"] == (3072, 1024)  # the dense layer
    for layer in (1, 2, 3):  # 3 MoE layers of 16 experts, width 768, one shared expert of 768
        assert specs[f"model.layers.{layer}.mlp.gate.weight"] == (16, 1024)
        assert specs[f"model.layers.{layer}.mlp.experts.15.up_proj.weight"] == (768, 1024)
        assert specs[f"model.layers.{layer}.mlp.shared_experts.down_proj.weight"] == (1024, 768)
    assert "model.layers.1.mlp.experts.16.up_proj.weight" not in specs and cfg["moe_k"] == 4
    # the converter would write intermediate_size // num_key_value_heads = 1536: llama.cpp refuses that file
    assert build.shared_expert_width(cfg) == 768 != cfg["intermediate_size"] // cfg["num_key_value_heads"]
    assert build.shared_expert_width(SHAPES["tiny-dense"]) is None


def test_every_fd_row_pairs_with_a_converted_type():
    for shape in shapes.SHAPES.values():
        assert {c.pair for c in shape.fd_configs} <= {"f32", *shape.llama_types}


def test_lm_head_int8_quantizes_the_head_with_the_rows_method():
    assert shapes.with_lm_head({"quantization": "wint8"}, "float") == {"quantization": "wint8"}
    assert shapes.with_lm_head({"quantization": "w8a8"}, "int8")["quantization"] == {
        "quantization": "w8a8", "lm_head_quant_type": "w8a8"}
    mixed = shapes.with_lm_head(shapes.SHAPES["0.3b"].fd_configs[2].engine_kwargs, "int8")["quantization"]
    assert mixed["quantization"] == "mix_quant" and mixed["lm_head_quant_type"] == "wint8"
    assert shapes.with_lm_head({"dtype": "float32"}, "int8") == {"dtype": "float32"}  # fp32 stays fp32


def test_greedy_report_says_how_far_each_side_keeps_to_its_own_fp32():
    fd = [("fd fp32", "f32", [[1, 2, 3]]), ("fd wint8", "q8_0", [[1, 2, 4]])]
    llama = {"f32": [[1, 2, 3]], "q8_0": [[1, 5, 6]]}
    report = script.greedy_report(fd, llama)
    assert report["fd fp32 vs llama.cpp f32"] == "equal"
    assert report["fd wint8 vs llama.cpp q8_0"] == (
        "not equal (prompt 0 from token 1); fd-core vs its fp32: not equal (prompt 0 from token 2); "
        "llama.cpp q8_0 vs f32: not equal (prompt 0 from token 1)")


def test_fp32_against_f32_must_agree():
    fd = [("fd fp32", "f32", [[1, 2, 3]]), ("fd wint8", "q8_0", [[1, 2, 4]])]
    assert script.fp32_mismatches(script.greedy_report(fd, {"f32": [[1, 2, 3]], "q8_0": [[9]]})) == []
    report = script.greedy_report(fd, {"f32": [[1, 2, 7]], "q8_0": [[1, 2, 4]]})
    assert script.fp32_mismatches(report) == ["fd fp32 vs llama.cpp f32"]  # quantized pairs may drift


def test_a_rows_env_is_set_around_its_measurements_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    fdcore = _load("llama_cpp_fdcore")
    monkeypatch.delenv("FD_X86_PREFILL_INT8_ACT", raising=False)
    monkeypatch.setenv("FD_BENCH_KEPT", "before")
    with fdcore.environ({"FD_X86_PREFILL_INT8_ACT": "1", "FD_BENCH_KEPT": "inside"}):
        assert os.environ["FD_X86_PREFILL_INT8_ACT"] == "1" and os.environ["FD_BENCH_KEPT"] == "inside"
    assert "FD_X86_PREFILL_INT8_ACT" not in os.environ and os.environ["FD_BENCH_KEPT"] == "before"
    opt_in = [c for s in ("0.3b", "mid-moe") for c in shapes.SHAPES[s].fd_configs if c.env]
    assert opt_in and all(c.env == {"FD_X86_PREFILL_INT8_ACT": "1"} and c.pair == "q4_0" for c in opt_in)


def test_a_reload_gives_the_row_a_fresh_engine_and_keeps_its_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    """reload frees the row's engine, builds one from the same arguments and warms it up with the row's env."""
    from types import SimpleNamespace

    fdcore = _load("llama_cpp_fdcore")
    made: list[tuple] = []
    warmed: list[object] = []
    monkeypatch.setattr(fdcore, "_engine", lambda *source: made.append(source) or SimpleNamespace(llm=object()))
    monkeypatch.setattr(fdcore, "_warm_up", lambda row: warmed.append(row.config))
    row = fdcore.load("fd-core x86 w4a8", Path("ckpt"), "x86", {"quantization": "w4a8"}, 8, 256, {"A": "1"})
    first = row.config
    row.decode[1] = [100.0]
    row.prefill.append(50.0)
    fdcore.reload(row)
    assert made == [(Path("ckpt"), "x86", {"quantization": "w4a8"}, 8, 256)] * 2
    assert warmed == [first, row.config] and row.config is not first and not hasattr(first, "llm")
    assert row.decode == {1: [100.0]} and row.prefill == [50.0] and row.env == {"A": "1"}


def test_the_sampled_comparison_checks_its_flags_and_pairs_rows_with_equal_bits(capsys):
    sampled = _load("llama_cpp_sampled")
    args = sampled.parse_args([])
    assert args.shapes == ["mid-moe", "0.3b"] and args.steps == [1, 8] and (args.temperature, args.top_p) == (0.8, 0.8)
    for argv in (["--top-p", "0"], ["--steps", "0"], ["--tokens", "0"]):
        with pytest.raises(SystemExit):
            sampled.parse_args(argv)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        sampled.parse_args(["--rows", "w4a8 + w4a8 hed"])
    assert "--rows 'w4a8 + w4a8 hed' is no row of mid-moe or 0.3b" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sampled.parse_args(["--shapes", "0.3b", "--rows", "all-int4, int8-act prefill"])
    assert "is a prefill switch's row" in capsys.readouterr().err
    assert sampled.parse_args(["--shapes", "0.3b", "--rows", "fp32"]).rows == ["fp32"]
    result = {"llama": {"q8_0": 100.0, "q4_0": 200.0},
              "fd": [{"label": "wint8", "pair": "q8_0", "steps": {1: 150.0, 8: 250.0}}]}
    table = sampled.format_table("mid-moe", result, [1, 8], args)
    assert "| llama.cpp q4_0 | 200.0 | |" in table
    assert "| fd-core x86 wint8 | 150.0 (1.50x q8_0) | 250.0 (2.50x q8_0) |" in table


def test_sampled_decode_asks_llama_server_for_a_sampled_request_and_reads_its_timing(monkeypatch, tmp_path):
    runs = _load("llama_cpp_runs")
    bodies = []

    @contextlib.contextmanager
    def server(*args, **kwargs):
        yield "http://fake"

    def post(url, body, timeout):
        bodies.append(body)
        return {"timings": {"predicted_n": body["n_predict"], "predicted_per_second": 10.0 + len(bodies)}}

    monkeypatch.setattr(runs, "server", server)
    monkeypatch.setattr(runs, "_post", post)
    rates = runs.sampled_decode(None, tmp_path / "x.gguf", [[1, 2], [3]], 16, 2, 0.8, 0.9, tmp_path / "log")
    assert rates == [11.0, 12.0]
    assert bodies[0]["temperature"] == 0.8 and bodies[0]["top_p"] == 0.9 and bodies[0]["top_k"] == 0
    assert bodies[0]["samplers"] == ["temperature", "top_p"] and bodies[1]["seed"] == 1 and bodies[1]["ignore_eos"]

"""benchmarks/real_size.py without llama.cpp or a model: flags, /proc parsing, the memory probe, the tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.benchmarks.test_llama_cpp import BENCH, _load

script = _load("real_size")
proc = _load("real_size_proc")

_STATUS = """Name:\tpython
VmPeak:\t 9000 kB
VmHWM:\t    2048 kB
VmRSS:\t    1024 kB
RssAnon:\t     512 kB
RssFile:\t     500 kB
RssShmem:\t      12 kB
Threads:\t3
"""


def test_status_lines_become_bytes() -> None:
    assert proc.parse_status(_STATUS) == {"VmHWM": 2048 * 1024, "VmRSS": 1024 * 1024, "RssAnon": 512 * 1024,
                                          "RssFile": 500 * 1024, "RssShmem": 12 * 1024}
    assert proc.parse_status("RssAnon: lots\n") == {}


def test_flags(tmp_path: Path) -> None:
    args = script.parse_args(["--dir", str(tmp_path)])
    assert (args.shape, args.dir, args.batch) == ("21b-a3b", tmp_path.resolve(), [1, 8])
    quick = script.parse_args(["--dir", str(tmp_path), "--quick"])
    assert (quick.shape, quick.dir, quick.prefill_len) == ("tiny-moe", tmp_path.resolve() / "quick", 64)
    with pytest.raises(SystemExit):
        script.parse_args(["--dir", str(BENCH / "big")])  # never inside the repository
    with pytest.raises(SystemExit):
        script.parse_args(["--batch", "0"])
    proxy = script.parse_args(["--dir", str(tmp_path), "--layers", "4"])
    assert (proxy.shape, proxy.dir) == ("21b-a3b", tmp_path.resolve() / "layers4")
    assert proxy.overrides == {"num_hidden_layers": 4, "moe_layer_end_index": 3}
    full = script.parse_args(["--dir", str(tmp_path), "--layers", "28"])  # the whole model: no overrides
    assert (full.dir, full.overrides) == (tmp_path.resolve(), {})
    for bad in (["--layers", "1"], ["--layers", "29"], ["--layers", "4", "--quick"]):
        with pytest.raises(SystemExit):
            script.parse_args(["--dir", str(tmp_path), *bad])


def test_the_probe_sees_a_child_allocate(tmp_path: Path) -> None:
    code = "import time, numpy as np; a = np.ones(64 << 20, dtype=np.uint8); time.sleep(0.5); del a; time.sleep(0.3)"
    watched = proc.Watched([sys.executable, "-c", code], tmp_path / "log", interval=0.02)
    assert watched.wait(60) == 0
    assert watched.mem.peak_anon >= 64 << 20 and watched.mem.samples > 5
    assert watched.mem.hwm >= watched.mem.peak_anon


def test_the_report_pairs_fd_core_with_llama_cpp(tmp_path: Path) -> None:
    args = script.parse_args(["--dir", str(tmp_path)])
    gib = 1 << 30
    fd_mem = proc.MemSample(rss_anon=10 * gib, rss_file=gib, peak_anon=12 * gib, peak_file=2 * gib)
    lc_mem = proc.MemSample(rss_anon=gib // 2, rss_file=12 * gib, hwm=13 * gib, peak_anon=gib, peak_file=12 * gib)
    fd = {"load_s": 300.0, "mem": fd_mem, "status": {"VmHWM": 13 * gib}, "decode": {"1": 6.0, "8": 20.0},
          "prefill": 40.0, "greedy": [[1, 2], [3, 4]]}
    lc = {"load_s": 5.0, "mem": lc_mem, "decode": {1: 12.0, 8: 16.0}, "prefill": 80.0, "greedy": [[1, 2], [3, 5]]}
    text = script.report(args, fd, lc, {})
    assert "| fd-core x86 wint4 | 300.0 s | 12.00 / 2.00 | 13.00 | 10.00 + 1.00 | 1.18x |" in text
    assert "| fd-core x86 wint4 | 6.0 (0.50x) | 20.0 (1.25x) | 40.0 (0.50x) |" in text
    assert "not equal (prompt 1 from token 1)" in text


def test_the_report_counts_padding_row_ids(tmp_path: Path) -> None:
    assert script.padding_ids([[1, 2047, 2048], [103423]]) == 2
    args = script.parse_args(["--dir", str(tmp_path)])
    mem = proc.MemSample(rss_anon=1, rss_file=1, peak_anon=1, peak_file=1, hwm=1)
    fd = {"load_s": 1.0, "mem": mem, "status": {"VmHWM": 1}, "decode": {"1": 1.0, "8": 1.0}, "prefill": 1.0,
          "greedy": [[5000, 1]]}
    lc = {"load_s": 1.0, "mem": mem, "decode": {1: 1.0, 8: 1.0}, "prefill": 1.0, "greedy": [[3, 1]]}
    assert "fd-core 1, llama.cpp 0" in script.report(args, fd, lc, {})

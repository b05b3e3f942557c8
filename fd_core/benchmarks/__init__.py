"""Benchmarks: ``fd-bench serve`` (an OpenAI-compatible server over HTTP),
``fd-bench compare`` (one token-id request stream through several
OpenAI-compatible servers, one after the other, and their ratios;
``compare_servers``), ``fd-bench throughput`` and ``fd-bench latency`` (the
engine in process), and ``compare`` (the same workload through HF
transformers ``generate`` and through a real ``fd-serve``;
``benchmarks/compare.py``).

Owns the benchmark datasets (random, shared-prefix, ShareGPT), the streaming
HTTP client that times each request, the serving metrics (vLLM's
benchmark_serving definitions) and the result tables and JSON files. The serve
client imports no paddle: it only needs httpx, numpy and, for text prompts,
``fd_core.tokenizer``. The offline commands import ``fd_core.LLM``.
Timings are measured by running these commands, never by tests.
May import: fd_core.engine, fd_core.sampling, fd_core.tokenizer,
fd_core.config, fd_core.testing (generated checkpoints), and the ``fd_core``
facade (``fd_core.LLM``).
"""

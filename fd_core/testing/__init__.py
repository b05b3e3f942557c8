"""Testing support: generated checkpoints, the conformance suite a backend runs
against the CPU oracle, and the soak. Test tooling: May import: anything of fd_core
(fd_core.engine, fd_core.backends, fd_core.ops, fd_core.plugins, fd_core.tokenizer,
fd_core._paddle), but nothing of fd_core imports it except the demo and benchmarks."""

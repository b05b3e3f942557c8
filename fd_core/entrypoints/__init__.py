"""Entry points: the offline ``LLM`` API, the OpenAI server and the CLI.

Owns user-facing argument parsing and the processes' main functions.
May import: every other component: fd_core.engine, fd_core.backends,
fd_core.models, fd_core.model_loader, fd_core.sampling, fd_core.tokenizer,
fd_core.parsers, fd_core.metrics, fd_core.plugins, fd_core.config,
fd_core.flags, fd_core.envs, fd_core.disagg (--splitwise-role), fd_core.masking, fd_core.logging_setup,
fd_core.testing (the demo checkpoint), fd_core.cluster (the global scheduler),
fd_core.multimodal (prompts with images), fd_core.parallel (the TP size check
and the other hosts' ranks of --ips, before the engine starts), fd_core.router
(fd-serve --router registers with the router).
"""

"""The engine: request state, scheduler, KV cache manager, model runner.

The scheduler and KV cache manager are pure Python (no paddle or numpy);
all tensor work sits behind ``ModelRunner.execute``. May import: the
components below it: fd_core.backends, fd_core.models, fd_core.model_loader,
fd_core.layers, fd_core.ops, fd_core.quantization, fd_core.sampling,
fd_core.tokenizer, fd_core.config, fd_core.envs, fd_core.logging_setup,
fd_core._paddle, fd_core.structured, fd_core.multimodal (image features),
fd_core.parallel (tensor-parallel ranks), fd_core.spec_decode (speculative
decoding's proposers and verification).
"""

"""The engine: request state, scheduler, KV cache manager, model runner.

The scheduler and KV cache manager are pure Python (no paddle or numpy);
all tensor work sits behind ``ModelRunner.execute``. May import: every
lower component (backends, models, model_loader, sampling).
"""

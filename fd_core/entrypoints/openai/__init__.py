"""The OpenAI-compatible HTTP layer: FastAPI app, request/response models, SSE.

Owns ``build_app(client, server_args)`` and everything between an HTTP
request and an ``EngineClient``: pydantic protocol models (OpenAI fields plus
FastDeploy's extras), chat-template rendering, SamplingParams mapping and
length checks, streaming chunks, reasoning/tool parser glue, OpenAI-style
error objects, API-key and concurrency limits, and the /metrics endpoint.

Runs in the API process: it may import fd_core.engine.client/outputs,
fd_core.sampling.params, fd_core.tokenizer, fd_core.parsers and
fd_core.metrics, and never paddle or numpy (a test proves importing
``fd_core.entrypoints.openai.api_server`` leaves paddle unimported).
Process startup and shutdown (``run_server``) belong to the CLI.
"""

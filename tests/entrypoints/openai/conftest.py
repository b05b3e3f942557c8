"""Fixtures: one in-process engine on the tiny-dense checkpoint, apps over it, HTTP clients; a
tiny-vl checkpoint and an engine on it per module (the VL image and video server tests)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fd_core.config import EngineArgs
from fd_core.engine.client import InprocEngineClient
from fd_core.entrypoints.openai.api_server import ServerArgs, build_app
from tests.entrypoints.openai.streaming_transport import StreamingASGITransport

MODEL = "tiny"
MAX_MODEL_LEN = 256


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="session")
def engine_client(checkpoint_factory):
    path = checkpoint_factory("tiny-dense", "pytorch")
    client = InprocEngineClient(EngineArgs.from_kwargs(
        str(path), backend="cpu", max_model_len=MAX_MODEL_LEN, num_gpu_blocks_override=64, block_size=16))
    yield client
    asyncio.run(client.shutdown())


@pytest.fixture(scope="session")
def app(engine_client):
    return build_app(engine_client, ServerArgs(served_model_names=(MODEL, "alias")))


@pytest.fixture
async def http(app):
    """httpx over the app in process (buffers whole responses, streams included)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://fd") as client:
        yield client


@pytest.fixture
async def live_http(app):
    """httpx over the app with real streaming and client disconnects."""
    async with httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://fd",
                                 timeout=60) as client:
        yield client


@pytest.fixture
async def openai_client(app):
    import openai

    http_client = httpx.AsyncClient(transport=StreamingASGITransport(app), base_url="http://fd")
    client = openai.AsyncOpenAI(base_url="http://fd/v1", api_key="unused", http_client=http_client,
                                max_retries=0)
    yield client
    await http_client.aclose()


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    from fd_core.testing.vl_checkpoint import generate_vl_checkpoint

    return generate_vl_checkpoint(tmp_path_factory.mktemp("vl_srv"), "tiny-vl", naming="pytorch")


@pytest.fixture(scope="module")
def vl_client(vl_dir):
    client = InprocEngineClient(EngineArgs.from_kwargs(
        str(vl_dir), backend="cpu", max_model_len=512, num_gpu_blocks_override=64, block_size=16,
        dtype="float32"))
    yield client
    asyncio.run(client.shutdown())

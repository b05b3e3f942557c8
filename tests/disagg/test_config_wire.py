"""Flags, the transport choice and the wire checks, without a model."""

from __future__ import annotations

import types

import pluggy
import pytest

from fd_core.disagg.config import disagg_config_from
from fd_core.disagg.kv_io import frame_sizes
from fd_core.disagg.transport import TcpTransport, transport_for
from fd_core.disagg.wire import (
    ModelFingerprint,
    PrefillReply,
    PrefillTask,
    TransferError,
    check_fingerprint,
    check_frames,
    dumps,
    loads,
)
from fd_core.errors import UnsupportedFeatureError
from fd_core.plugins import hookspecs

FP = ModelFingerprint("Ernie4_5ForCausalLM", 2, 2, 16, 16, "float32", 2048)


def _args(**kw):
    base = dict(splitwise_role="mixed", tensor_parallel_size=1, innode_prefill_ports=None,
                engine_worker_queue_port=None, pd_comm_port=None, cache_transfer_protocol=None)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_fastdeploys_flags_make_the_config():
    assert disagg_config_from(_args()) is None
    prefill = disagg_config_from(_args(splitwise_role="prefill", engine_worker_queue_port="8182", pd_comm_port=2334))
    assert prefill.listen == ("127.0.0.1:8182", "0.0.0.0:2334") and prefill.protocols == ("tcp",)
    decode = disagg_config_from(_args(splitwise_role="decode", innode_prefill_ports="8182,otherhost:9000"))
    assert decode.prefill_addrs == ("127.0.0.1:8182", "otherhost:9000")


@pytest.mark.parametrize("kw, message", [
    (dict(splitwise_role="both"), "--splitwise-role must be one of mixed, prefill, decode, got 'both'"),
    (dict(splitwise_role="decode"), "--splitwise-role decode needs --innode-prefill-ports"),
    (dict(splitwise_role="prefill"), "--splitwise-role prefill needs --engine-worker-queue-port"),
    (dict(splitwise_role="decode", innode_prefill_ports="81x2"), "--innode-prefill-ports: '81x2' is not a port"),
])
def test_bad_flags_are_named(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        disagg_config_from(_args(**kw))


def test_tensor_parallel_instances_are_refused_as_not_yet():
    with pytest.raises(UnsupportedFeatureError, match="--tensor-parallel-size 4 is not implemented yet"):
        disagg_config_from(_args(splitwise_role="prefill", engine_worker_queue_port=1, tensor_parallel_size=4))


class _RdmaBackend:
    @hookspecs.hookimpl
    def fd_kv_transport(self, protocol):
        return "an rdma transport" if protocol == "rdma" else None


def _pm(*plugins):
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for p in plugins:
        pm.register(p)
    return pm


def test_protocols_go_to_the_backend_hook_then_the_builtin_tcp():
    assert transport_for(("rdma", "ipc"), _pm(_RdmaBackend())) == "an rdma transport"
    tcp = transport_for(("ipc", "tcp"), _pm())
    assert isinstance(tcp, TcpTransport)
    with pytest.raises(ValueError, match="--cache-transfer-protocol rdma,ipc: no installed backend brings rdma or ipc"):
        transport_for(("rdma", "ipc"), _pm())


def test_a_mismatched_fingerprint_names_the_field_and_both_values():
    theirs = ModelFingerprint("Ernie4_5ForCausalLM", 3, 2, 16, 16, "float32", 2048)
    with pytest.raises(TransferError, match="num_layers differs, 2 here but 3 on peer"):
        check_fingerprint(FP, theirs, "peer")
    with pytest.raises(TransferError, match="kv_dtype differs, 'float32' here but 'int8' on peer"):
        check_fingerprint(FP, ModelFingerprint("Ernie4_5ForCausalLM", 2, 2, 16, 16, "int8", 2048), "peer")


def test_frame_sizes_are_the_kv_formula_and_short_frames_are_refused():
    sizes = frame_sizes(FP, 3)
    assert len(sizes) == 2 * 2 and sum(sizes) == 2 * 2 * 3 * 16 * 2 * 16 * 4
    int8 = ModelFingerprint("Ernie4_5ForCausalLM", 2, 2, 16, 16, "int8", 2048)
    assert sum(frame_sizes(int8, 3)) == 2 * 2 * 3 * 16 * 2 * (16 * 1 + 4)  # codes + fp32 scale per row
    reply = PrefillReply("r", num_blocks=3)
    with pytest.raises(TransferError, match="frame 1 has 5 bytes, expected 6144"):
        check_frames(reply, [b"x" * sizes[0], b"x" * 5, b"", b""], sizes, "peer")


def test_a_peer_cannot_make_the_reader_run_code():
    assert loads(dumps(PrefillReply("r", error="boom")), PrefillReply).error == "boom"
    with pytest.raises(TransferError, match="refusing to load os.system"):
        loads(b"cos\nsystem\n(S'true'\ntR.", PrefillReply)  # os.system("true"), pickled


def _global_call(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 frame calling ``module``'s attribute path ``name`` with ``arg``
    (STACK_GLOBAL resolves a dotted name attribute by attribute)."""
    out = b"\x80\x04"
    for text in (module, name):
        raw = text.encode()
        out += b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE
    raw = arg.encode()
    return out + b"\x93" + b"\x8c" + bytes([len(raw)]) + raw + b"\x85R."  # STACK_GLOBAL, TUPLE1, REDUCE


def test_a_dotted_name_through_an_allowed_module_cannot_reach_os(tmp_path):
    """``fd_core.sampling.sampler`` imports ``envs``, which imports ``os``: the name
    ``envs.os.system`` would reach it were dotted names followed."""
    marker = tmp_path / "ran"
    for module, name in [("fd_core.sampling.sampler", "envs.os.system"), ("fd_core.sampling.no_such_module", "X"),
                         ("fd_core.engine.outputs", "field")]:  # a function, not a data class
        with pytest.raises(TransferError, match="unreadable KV-transfer message"):
            loads(_global_call(module, name, f"touch {marker}"), PrefillTask)
    assert not marker.exists()


def test_a_list_of_ports_for_one_prefill_instance_is_refused_naming_it():
    from types import SimpleNamespace

    from fd_core.disagg.config import disagg_config_from

    args = SimpleNamespace(splitwise_role="prefill", engine_worker_queue_port="8182,8183", pd_comm_port=None,
                           tensor_parallel_size=1, cache_transfer_protocol=None)
    with pytest.raises(ValueError, match="--engine-worker-queue-port: one port per prefill instance, got 8182, 8183"):
        disagg_config_from(args)

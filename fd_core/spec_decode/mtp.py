"""The MTP drafter: ERNIE's MTP block proposing draft tokens (``method: mtp``).

Who calls what (``fd_core.engine.speculative.SpeculativeDecoder`` only):

- ``MtpProposer(config, runner, model_dir)`` once, after the runner allocated the
  KV pool: loads the MTP tensors from ``config.model`` (or the target's own
  checkpoint), adds the block's KV layer to the runner's pool as layer index L
  (same block tables, swapped with the others), and asks the target to keep its
  final-normed hidden states (``Ernie4_5ForCausalLM.keep_hidden``);
- ``run(scheduled, scheduler, wants)`` after each step's ``update_from_output``:
  (1) sync: for every speculating request the step computed, the block over
  the positions the step verified, pairing each position's target hidden state
  (from the same forward, no second target pass) with the token after it; this
  writes the block's KV for exactly the verified positions, so it rolls back with
  the target's; (2) the first draft from each wanting request's last position,
  then ``wants[id] - 1`` more by running the block on its own output
  (positions past the verified ones get KV slots now: their blocks would be
  allocated by the next step anyway; the next sync overwrites them);
- ``propose(id, k)``: the drafts ``run`` made (greedy: the block's argmax);
  ``add_request`` / ``append`` / ``finish`` keep the set of tracked requests.

Known limit: on a prefix-cache hit the block's KV at the last cached position
pairs it with the token that followed it in the request that filled the block;
drafts may then differ from a run without the hit (acceptance only: verification
keeps the output exact).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fd_core.errors import UnsupportedFeatureError
from fd_core.layers.attention import KVCache
from fd_core.model_loader.loader import CheckpointError, _place, checkpoint_files
from fd_core.model_loader.safetensors_io import SafetensorsFile
from fd_core.ops._host import as_array, on_host
from fd_core.ops.attention import AttentionMetadata
from fd_core.spec_decode.config import SpeculativeConfig
from fd_core.spec_decode.proposer import Proposer

__all__ = ["MtpProposer", "load_mtp"]

logger = logging.getLogger(__name__)
_MTP = re.compile(r"^(ernie\.|model\.)mtp_")


def load_mtp(target: Any, path: str | Path, dtype: str = "float32") -> Any:
    """The ``Ernie4_5_MTP`` block over ``target``, its weights read from the
    safetensors in ``path`` (the target's checkpoint with its MTP tensors, or a
    directory of MTP tensors only), stored in ``dtype``. Raises CheckpointError
    naming ``path`` when it holds no MTP weights or lacks some."""
    from fd_core.models.ernie4_5_mtp import Ernie4_5_MTP

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"speculative model {str(path)!r}: not a directory (expected a checkpoint "
                              "directory holding ERNIE's MTP tensors, e.g. ernie.mtp_block.0.*)")
    readers = [SafetensorsFile(f) for f in checkpoint_files(path)]
    try:
        names = [n for r in readers for n in r.keys() if _MTP.match(n)]
        if not names:
            raise CheckpointError(
                f"speculative model {str(path)!r} holds no MTP weights (no tensor named ernie.mtp_* or "
                "model.mtp_*): method 'mtp' needs a checkpoint with ERNIE's MTP block "
                "(fd-gen-checkpoint --mtp writes one)")
        naming = "paddle" if names[0].startswith("ernie.") else "pytorch"
        moe = any(".mtp_block.0.mlp.experts." in n for n in names)
        mtp = Ernie4_5_MTP(target, moe)
        for param in mtp.parameters().values():
            if not param.pinned:
                param.dtype = dtype
        targets = mtp.checkpoint_targets(naming)
        seen = set()
        for reader in readers:
            for name in reader.keys():
                if name not in targets:
                    continue
                seen.add(name)
                array, src = reader.get_raw(name), reader.float_dtype(name) or reader.dtype(name)
                for t in targets[name]:
                    _place(t, name, array, src)
                    if t.param.complete and t.param.data is None:
                        t.param.finish()
        missing = sorted(set(targets) - seen)
        if missing:
            raise CheckpointError(f"speculative model {str(path)!r} ({naming} naming) lacks MTP tensor(s) "
                                  f"{', '.join(repr(m) for m in missing[:5])}")
    finally:
        for r in readers:
            r.close()
    if any(".mtp_block.1." in n for n in names):
        logger.warning("%s holds more than one MTP block: only block 0 drafts", path)
    logger.info("MTP block loaded from %s (%s naming, %s FFN)", path, naming, "MoE" if moe else "dense")
    return mtp


class MtpProposer(Proposer):
    """Drafts with the MTP block on the runner's model; see the module docstring."""

    def __init__(self, config: SpeculativeConfig, runner: Any, model_dir: str | Path) -> None:
        from fd_core.models.ernie4_5 import Ernie4_5ForCausalLM

        model = getattr(runner, "model", None)
        if type(model) is not Ernie4_5ForCausalLM:
            raise UnsupportedFeatureError(
                "--speculative-config method 'mtp' drafts with ERNIE 4.5's MTP block: it needs an ERNIE 4.5 "
                f"text model on one device, not {type(model).__name__ if model is not None else 'a sharded runner'}"
                " (use method 'ngram' or 'suffix')")
        if config.quantization is not None:
            raise UnsupportedFeatureError(
                f"--speculative-config quantization {config.quantization!r}: quantizing the MTP block is not "
                "implemented (it runs in the target's weight dtype); leave the key out")
        self.runner = runner
        self.model = model
        self.mtp = load_mtp(model, config.model or model_dir, runner.dtype)
        self.cache = self._attach_kv_layer(runner, self.mtp.layer.self_attn.kv_scales is not None)
        model.keep_hidden = True
        self.vocab_size = model.config.vocab_size
        self._tracked: set[str] = set()
        self._drafts: dict[str, list[int]] = {}
        self.record_logits = False  # tests: keep each draft's (position, step, logits row) in ``recorded``
        self.recorded: dict[str, list[tuple[int, int, np.ndarray]]] = {}

    @staticmethod
    def _attach_kv_layer(runner: Any, static_scales: bool) -> KVCache:
        """The block's KV layer: index L of the runner's pool (device and host tiers). Under an
        offline W4A8C8 checkpoint's ``int8_static`` cache, a block without static KV scales of its
        own gets the dynamic ``int8`` cache (same bytes per slot; the pools are per layer)."""
        c, ops = runner.config, runner.ops
        dtype = runner.kv_cache_dtype
        if dtype == "int8_static" and not static_scales:
            dtype = "int8"
        k, v = ops.allocate_kv_cache(runner.num_blocks, runner.block_size, runner.num_kv_heads, c.head_dim, dtype)
        cache = KVCache(k, v, dtype)
        runner.kv_caches.append(cache)
        if runner.host_caches:
            num_host = int(runner.host_caches[0].k.shape[0]) // runner.block_size  # pools are [slots, Hkv, Dh]
            k, v = ops.allocate_kv_cache(num_host, runner.block_size, runner.num_kv_heads, c.head_dim, dtype,
                                         location="host")
            runner.host_caches.append(KVCache(k, v, dtype))
        return cache

    # ------------------------------------------------------------ Proposer

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int]) -> None:
        if request_id in self._tracked:
            raise ValueError(f"request {request_id!r} is already tracked")
        self._tracked.add(request_id)

    def append(self, request_id: str, token_ids: Sequence[int]) -> None:
        """Nothing to do: ``run`` reads the verified tokens from the scheduler."""

    def propose(self, request_id: str, max_tokens: int) -> list[int]:
        return self._drafts.pop(request_id, [])[:max_tokens]

    def finish(self, request_id: str, keep_output: bool = True) -> None:
        self._tracked.discard(request_id)
        self._drafts.pop(request_id, None)

    # ------------------------------------------------------------ the forward

    def run(self, scheduled: Sequence[Any], scheduler: Any, wants: Mapping[str, int]) -> None:
        """Sync the block's KV over the step's verified positions and draft
        ``wants[id]`` tokens for each request that wants some (see the module doc)."""
        self._drafts = {}
        hidden = self.model.last_hidden
        if hidden is None or not scheduled:
            return
        kv = scheduler.kv_cache_manager
        rows: list[tuple[str, Any, int, int, int]] = []  # (id, request, first hidden row, start, count)
        offset = 0
        for s in scheduled:
            req = scheduler.requests.get(s.request_id)
            if s.request_id in self._tracked and req is not None and not req.is_finished:
                count = req.num_computed_tokens - s.num_computed_tokens
                if 0 < count <= s.num_tokens:
                    rows.append((s.request_id, req, offset, s.num_computed_tokens, count))
            offset += s.num_tokens
        if not rows:
            return
        rows.sort(key=lambda r: r[4] != 1)  # one-position rows first: they run as decodes
        index = np.concatenate([np.arange(off, off + n) for _, _, off, _, n in rows])
        next_ids = [t for _, req, _, start, n in rows for t in req.all_token_ids[start + 1: start + n + 1]]
        tables = [kv.get_block_ids(req) for _, req, _, _, _ in rows]
        last = np.cumsum([n for *_, n in rows]) - 1
        want = [wants.get(rid, 0) for rid, *_ in rows]
        pick = [i for i, w in enumerate(want) if w > 0]
        paddle = _paddle()
        meta = AttentionMetadata.build([n for *_, n in rows], [start + n for _, _, _, start, n in rows], tables,
                                       self.runner.block_size, sum(1 for *_, n in rows if n == 1))
        with paddle.no_grad():
            logits, g = self.mtp.forward(
                paddle.gather(hidden, paddle.to_tensor(index.astype(np.int64))),
                paddle.to_tensor(np.asarray(next_ids, np.int64)), meta, self.cache,
                paddle.to_tensor(last[pick].astype(np.int64)))
        if not pick:
            return
        tokens = self._argmax(logits, [rows[i][0] for i in pick], [rows[i][3] + rows[i][4] - 1 for i in pick], 0)
        drafts = {rows[i][0]: [tok] for i, tok in zip(pick, tokens)}
        # more drafts: the block on its own output, one position per step
        chain = []  # (id, request, next position, output row of g, wanted)
        for i in pick:
            rid, req, _, start, n = rows[i]
            w = self._room(kv, req, want[i], start + n)
            if w > 1:
                chain.append((rid, req, start + n, int(last[i]), w))
        # a slot just allocated may have evicted a cached block whose copy to the host tier
        # (--swap-space) is still due: copy it now, before the chain writes into the block
        swap_out, swap_in = kv.take_swap_ops()
        if swap_out or swap_in:
            self.runner.apply_swaps(swap_out, swap_in)
        for j in range(1, max((c[4] for c in chain), default=1)):
            chain = [c for c in chain if c[4] > j]
            meta = AttentionMetadata.build([1] * len(chain), [pos + j for _, _, pos, _, _ in chain],
                                           [kv.get_block_ids(req) for _, req, _, _, _ in chain],
                                           self.runner.block_size, len(chain))
            with paddle.no_grad():
                logits, g = self.mtp.forward(
                    paddle.gather(g, paddle.to_tensor(np.asarray([c[3] for c in chain], np.int64))),
                    paddle.to_tensor(np.asarray([drafts[c[0]][-1] for c in chain], np.int64)),
                    meta, self.cache, None)
            for c, tok in zip(chain, self._argmax(logits, [c[0] for c in chain], [c[2] + j - 1 for c in chain], j)):
                drafts[c[0]].append(tok)
            chain = [(rid, req, pos, r, w) for r, (rid, req, pos, _, w) in enumerate(chain)]
        self._drafts = drafts

    def _room(self, kv: Any, req: Any, want: int, num_verified: int) -> int:
        """Drafts the block can make for ``req``: the chain's positions past the
        verified ones need KV slots; allocate them now (None: the pool is short,
        keep to the blocks the request holds)."""
        if want > 1 and kv.allocate_slots(req, want - 1) is None:
            covered = len(kv.get_block_ids(req)) * self.runner.block_size
            want = max(1, min(want, covered - num_verified + 1))
        return want

    def _argmax(self, logits: Any, ids: Sequence[str], positions: Sequence[int], step: int) -> list[int]:
        """Greedy drafts of ``logits`` rows (request ``ids``, the block's ``positions``,
        ``step``: 0 for the first draft, j for the j-th run on the block's own output)."""
        host = as_array(logits) if on_host(logits) else logits.numpy()
        rows = np.asarray(host, np.float32)[:, : self.vocab_size]
        if self.record_logits:
            for rid, pos, row in zip(ids, positions, rows):
                self.recorded.setdefault(rid, []).append((pos, step, row.copy()))
        return [int(t) for t in rows.argmax(axis=-1)]


def _paddle() -> Any:
    from fd_core._paddle import import_paddle

    return import_paddle()

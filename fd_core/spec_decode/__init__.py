"""Speculative decoding: the config, the CPU-side proposers, and verification.

Owns: ``SpeculativeConfig`` / ``parse_speculative_config`` (``--speculative-config``
with FastDeploy's keys), the ``Proposer`` interface with the n-gram (prompt
lookup) and suffix-decoding proposers (pure Python: no paddle, no numpy), and
``verify`` (greedy prefix acceptance and exact rejection sampling, numpy on the
host, reusing the sampler's filters in ``fd_core.ops.sampling``).

The engine side (scheduling drafts, scoring them, rollback, metrics) is
``fd_core.engine.speculative`` (DESIGN_NOTES.md, sections 3 and 4); the MTP
drafter (``fd_core.spec_decode.mtp``, over ``fd_core.models.ernie4_5_mtp``) runs
the model's MTP block after each step and keeps the ``Proposer`` interface.
How the engine core calls this package::

    config = parse_speculative_config(engine_config.speculative_config)
    proposer = make_proposer(config)            # ngram / suffix
    proposer.add_request(req_id, prompt_ids)    # on admission
    drafts = proposer.propose(req_id, k)        # before each decode step
    ... forward over [last token] + drafts, all_logits for those rows ...
    result = verify(logits, drafts_per_req, temperature, top_k, top_p, min_p, uniforms)
    proposer.append(req_id, result.token_ids[i])  # verified tokens only
    proposer.finish(req_id)                     # on finish / abort

``verify`` is imported from ``fd_core.spec_decode.verify`` (it loads paddle
through ``fd_core.ops``) and the MTP drafter from ``fd_core.spec_decode.mtp``;
importing this package loads neither paddle nor numpy.

May import: fd_core.ops (verify: the sampler's host filters), fd_core.errors,
fd_core.layers, fd_core.models, fd_core.model_loader, fd_core._paddle (the MTP
drafter: the block, its loading, its KV layer), numpy.
"""

from fd_core.spec_decode.config import METHODS, SpeculativeConfig, parse_speculative_config
from fd_core.spec_decode.ngram import NgramProposer
from fd_core.spec_decode.proposer import Proposer, make_proposer
from fd_core.spec_decode.suffix import SuffixProposer

__all__ = [
    "METHODS",
    "NgramProposer",
    "Proposer",
    "SpeculativeConfig",
    "SuffixProposer",
    "make_proposer",
    "parse_speculative_config",
]

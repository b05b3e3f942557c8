"""Speculative decoding: the config, the CPU-side proposers, and verification.

Owns: ``SpeculativeConfig`` / ``parse_speculative_config`` (``--speculative-config``
with FastDeploy's keys), the ``Proposer`` interface with the n-gram (prompt
lookup) and suffix-decoding proposers (pure Python: no paddle, no numpy), and
``verify`` (greedy prefix acceptance and exact rejection sampling, numpy on the
host, reusing the sampler's filters in ``fd_core.ops.sampling``).

The engine side (scheduling drafts, scoring them, rollback, metrics) is
``fd_core.engine.speculative`` (DESIGN_NOTES.md, section 3); the MTP drafter
does not exist yet. How the engine core calls this package::

    config = parse_speculative_config(engine_config.speculative_config)
    proposer = make_proposer(config)            # ngram / suffix
    proposer.add_request(req_id, prompt_ids)    # on admission
    drafts = proposer.propose(req_id, k)        # before each decode step
    ... forward over [last token] + drafts, all_logits for those rows ...
    result = verify(logits, drafts_per_req, temperature, top_k, top_p, min_p, uniforms)
    proposer.append(req_id, result.token_ids[i])  # verified tokens only
    proposer.finish(req_id)                     # on finish / abort

``verify`` is imported from ``fd_core.spec_decode.verify`` (it loads paddle
through ``fd_core.ops``); importing this package loads neither paddle nor numpy.

May import: fd_core.ops (verify: the sampler's host filters), numpy.
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

"""``Metrics``: FastDeploy-named Prometheus metrics over one private registry.

Names follow FastDeploy's docs/online_serving/metrics.md and
fastdeploy/metrics/{metrics,work_metrics}.py (``fastdeploy:`` prefix, no
model label, as FastDeploy exports by default), so existing dashboards work.
One deliberate addition: ``request_success_total`` carries vLLM's
``finished_reason`` label ("stop", "length"); summing over it gives
FastDeploy's unlabelled counter.

Who calls what: the API layer calls ``request_received`` when a generation
request is handed to the engine and ``request_finished`` exactly once when it
ends (its last output, or None when it ended before any); ``render`` is the
/metrics handler, and refreshes the engine gauges first (``engine_view``:
the latest ``EngineStats``, corrected by what this process knows, so the
gauges are right before the first request and right after aborts).

With several API processes (``--workers N``) the worker that answers a
scrape shows server-wide numbers (``multiprocess``): per-request counters and
histograms summed over the workers, engine gauges (``multiprocess_mode=
"mostrecent"``, refreshed by the answering worker) and engine totals once.

Two FastDeploy counters stay 0 by construction: ``prefix_storage_cache_token_num``
(no external KV storage tier) and ``send_cache_failed_num`` (a failed KV
transfer ends its request, abort with the error; a decode instance counts the
bytes that arrive in ``kv_transfer_bytes`` and their time in ``kv_transfer_seconds``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from fd_core.engine.client import EngineInfo, EngineStats
from fd_core.engine.outputs import RequestOutput
from fd_core.metrics import multiprocess
from fd_core.metrics.engine_view import engine_view

__all__ = ["METRIC_PREFIX", "Metrics"]

METRIC_PREFIX = "fastdeploy:"


def _buckets_1_2_5(maximum: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``maximum`` (token-count histograms)."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > maximum:
                return out
            out.append(float(m * scale))
        scale *= 10


_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0]
_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
_TOKEN_BUCKETS = _buckets_1_2_5(33792)
_RATIO_BUCKETS = [0.1, 0.2, 0.5, *_buckets_1_2_5(10000)]  # output tokens per second of one request
# counters that follow engine totals (or stay 0): the same in every API process
_ENGINE_COUNTERS = ("request_preempted", "prefix_cache_token_num", "prefix_gpu_cache_token_num",
                    "prefix_cpu_cache_token_num", "prefix_storage_cache_token_num", "send_cache_failed_num",
                    "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
                    "spec_decode_num_emitted_tokens")
# hit_req_rate's parts, summed over API processes; never exported themselves
_FINISHED, _FINISHED_WITH_HITS = "fd_core:finished_requests", "fd_core:finished_requests_with_prefix_hits"


class Metrics:
    """Every serving metric, registered in its own ``CollectorRegistry``."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        stats: Callable[[], EngineStats] | None = None,
        info: EngineInfo | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self._stats = stats
        self._info = info
        self._totals: dict[str, int] = {}  # engine total -> value already counted
        self._finished = 0
        self._finished_with_hits = 0
        self._in_flight = 0  # generation requests of this process handed to the engine, not ended
        self._last_end = 0.0  # time.time() the latest of them ended
        r, p = self.registry, METRIC_PREFIX
        # engine gauges: with several API processes the latest refresh (the answering one's) is shown
        gauge = lambda name, doc: Gauge(p + name, doc, registry=r, multiprocess_mode="mostrecent")  # noqa: E731
        counter = lambda name, doc: Counter(p + name, doc, registry=r)  # noqa: E731

        # requests
        self.requests_number = Counter(p + "requests_number", "Total number of requests received", registry=r)
        self.request_success = Counter(p + "request_success_total", "Total number of successfully processed requests",
                                       ["finished_reason"], registry=r)
        self.request_preempted = Counter(p + "request_preempted_total", "Number of preempted requests", registry=r)
        self.num_requests_running = gauge("num_requests_running", "Number of requests currently running")
        self.num_requests_waiting = gauge("num_requests_waiting", "Number of requests currently waiting")
        self.num_requests_enqueued = gauge("num_requests_enqueued", "Number of requests to be scheduled")
        self.num_requests_preempted = gauge("num_requests_preempted", "Number of requests currently preempted")
        # batch
        self.batch_size = gauge("batch_size", "Real batch size during inference")
        self.max_batch_size = gauge("max_batch_size", "Maximum batch size determined when service started")
        self.available_batch_size = gauge("available_batch_size",
                                          "Number of requests that can still be inserted during the Decode phase")
        # latency
        hist = lambda name, doc, buckets: Histogram(p + name, doc, buckets=buckets, registry=r)  # noqa: E731
        self.ttft = hist("time_to_first_token_seconds", "Time to first token in seconds", _TTFT_BUCKETS)
        self.tpot = hist("time_per_output_token_seconds", "Time per output token in seconds", _TPOT_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds",
                        "End-to-end request latency (from request arrival to final response)", _LATENCY_BUCKETS)
        self.queue_time = hist("request_queue_time_seconds", "Time spent in the WAITING phase", _LATENCY_BUCKETS)
        self.inference_time = hist("request_inference_time_seconds",
                                   "Time spent in the RUNNING phase (first scheduled to last token)", _LATENCY_BUCKETS)
        self.prefill_time = hist("request_prefill_time_seconds",
                                 "Time spent in the prefill phase (first scheduled to first token)", _LATENCY_BUCKETS)
        self.decode_time = hist("request_decode_time_seconds",
                                "Time spent in the decode phase (first token to last token)", _LATENCY_BUCKETS)
        # tokens
        self.prompt_tokens = Counter(p + "prompt_tokens_total", "Total number of prompt tokens processed", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens_total", "Total number of generation tokens processed",
                                         registry=r)
        self.request_prompt_tokens = hist("request_prompt_tokens", "Number of prefill tokens processed",
                                          _TOKEN_BUCKETS)
        self.request_generation_tokens = hist("request_generation_tokens", "Number of generation tokens processed",
                                              _TOKEN_BUCKETS)
        self.request_params_max_tokens = hist("request_params_max_tokens",
                                              "Histogram of max_tokens parameter in request parameters",
                                              _TOKEN_BUCKETS)
        self.request_token_ratio = hist("request_token_ratio",
                                        "Token generation rate per request (output tokens per second)",
                                        _RATIO_BUCKETS)
        # KV cache
        self.gpu_cache_usage_perc = gauge("gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage")
        self.free_gpu_block_num = gauge("free_gpu_block_num", "Number of free blocks in cache")
        self.available_gpu_block_num = gauge("available_gpu_block_num",
                                             "Number of available gpu blocks in cache, including blocks in LRU list")
        self.max_gpu_block_num = gauge("max_gpu_block_num", "Number of total blocks determined at startup")
        self.available_gpu_resource = gauge("available_gpu_resource",
                                            "Available blocks percentage: available_gpu_block_num / usable blocks")
        self.hit_token_rate = gauge("hit_token_rate", "Token-level prefix cache hit rate")
        self.gpu_hit_token_rate = gauge("gpu_hit_token_rate", "Token-level GPU prefix cache hit rate")
        self.cpu_hit_token_rate = gauge("cpu_hit_token_rate", "Token-level CPU prefix cache hit rate")
        self.hit_req_rate = gauge("hit_req_rate", "Request-level prefix cache hit rate")
        self.prefix_cache_token_num = Counter(p + "prefix_cache_token_num", "Total number of cached tokens",
                                              registry=r)
        self.prefix_gpu_cache_token_num = counter("prefix_gpu_cache_token_num", "Total number of cached tokens on GPU")
        self.prefix_cpu_cache_token_num = counter("prefix_cpu_cache_token_num", "Total number of cached tokens on CPU")
        self.prefix_storage_cache_token_num = counter("prefix_storage_cache_token_num",
                                                      "Total number of cached tokens on external cache storage")
        self.send_cache_failed_num = counter("send_cache_failed_num", "Total number of failures of sending cache")
        # prefill/decode disaggregation, on a --splitwise-role decode instance (fd_core.disagg)
        self.kv_transfer_bytes = counter("kv_transfer_bytes", "Total KV cache bytes received from prefill instances")
        self.kv_transfer_time = hist("kv_transfer_seconds", "Per request: KV transfer time (task sent to KV "
                                     "written, less the prefill instance's queue and compute)", _TTFT_BUCKETS)
        # speculative decoding (FastDeploy's names; 0 with --speculative-config off)
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Total number of speculative draft tokens")
        self.spec_accepted_tokens = counter("spec_decode_num_accepted_tokens",
                                            "Total number of accepted speculative tokens")
        self.spec_emitted_tokens = counter("spec_decode_num_emitted_tokens",
                                           "Total number of tokens emitted by steps that verified drafts")
        self.spec_acceptance_rate = gauge("spec_decode_draft_acceptance_rate",
                                          "Acceptance rate of speculative decoding (accepted / drafted)")
        self.spec_efficiency = gauge("spec_decode_efficiency",
                                     "Efficiency of speculative decoding (emitted / (drafted + verify steps))")
        self.cache_config_info = Gauge(p + "cache_config_info", "Information of the engine's cache config",
                                       ["block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching",
                                        "backend"], registry=r, multiprocess_mode="mostrecent")
        side = CollectorRegistry()  # not rendered: read from the files of every API process
        self._finished_total = Counter(_FINISHED, "Requests ended with an output", registry=side)
        self._finished_with_hits_total = Counter(_FINISHED_WITH_HITS, "Of them, with cached prefix tokens",
                                                 registry=side)
        self._exposition = self.registry
        path = multiprocess.shared_dir()
        if path is not None:
            self._exposition = CollectorRegistry()
            self._exposition.register(multiprocess.ServerWide(
                self.registry, path, own=[p + name for name in _ENGINE_COUNTERS],
                ratio=(p + "hit_req_rate", _FINISHED_WITH_HITS, _FINISHED)))
        if info is not None:
            self.max_gpu_block_num.set(info.num_kv_blocks)
            if info.max_num_seqs:
                self.max_batch_size.set(info.max_num_seqs)
            self.cache_config_info.labels(str(info.block_size), str(info.num_kv_blocks), str(info.num_host_blocks),
                                          str(info.enable_prefix_caching), info.backend).set(1)
        self.refresh()  # right before the first request too

    def request_received(self) -> None:
        """A generation request is handed to the engine (pair with ``request_finished``)."""
        self.requests_number.inc()
        self._in_flight += 1

    def request_finished(self, output: RequestOutput | None, max_tokens: int | None, aborted: bool = False) -> None:
        """A request ended: record its tokens and timings from its last RequestOutput
        (None: it ended before any output, refused or cut off; only its end counts)."""
        self._in_flight = max(0, self._in_flight - 1)
        self._last_end = time.time()
        if output is None:
            return
        m = output.metrics
        num_prompt = len(output.prompt_token_ids)
        num_generated = sum(len(o.token_ids) for o in output.outputs)
        self.prompt_tokens.inc(num_prompt)
        self.generation_tokens.inc(num_generated)
        self.request_prompt_tokens.observe(num_prompt)
        self.request_generation_tokens.observe(num_generated)
        if max_tokens is not None:
            self.request_params_max_tokens.observe(max_tokens)
        self._finished += 1
        self._finished_with_hits += output.num_cached_tokens > 0
        self._finished_total.inc()
        if output.num_cached_tokens > 0:
            self._finished_with_hits_total.inc()
        reasons = [o.finish_reason for o in output.outputs if o.finish_reason]
        if not aborted and reasons and "abort" not in reasons:
            # once per request, so the sum over the label is FastDeploy's counter; with n > 1
            # samples ending differently, "length" wins (the request hit a limit)
            self.request_success.labels("length" if "length" in reasons else reasons[0]).inc()
        end = m.finished_time or m.last_token_time
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
        if m.kv_transfer_bytes:
            self.kv_transfer_bytes.inc(m.kv_transfer_bytes)
            self.kv_transfer_time.observe(m.kv_transfer_seconds)
        if m.time_in_queue is not None:
            self.queue_time.observe(m.time_in_queue)
        if end is not None:
            self.e2e.observe(max(0.0, end - m.arrival_time))
        if m.first_scheduled_time is not None and m.last_token_time is not None:
            self.inference_time.observe(max(0.0, m.last_token_time - m.first_scheduled_time))
        if m.first_scheduled_time is not None and m.first_token_time is not None:
            self.prefill_time.observe(max(0.0, m.first_token_time - m.first_scheduled_time))
        start = m.first_scheduled_time or m.arrival_time
        if not aborted and end is not None and end > start and num_generated:
            self.request_token_ratio.observe(num_generated / (end - start))
        if m.first_token_time is not None and m.last_token_time is not None:
            decode = m.last_token_time - m.first_token_time
            self.decode_time.observe(max(0.0, decode))
            per_sample = num_generated / max(1, len(output.outputs))
            if per_sample > 1:
                self.tpot.observe(max(0.0, decode) / (per_sample - 1))

    def refresh(self) -> None:
        """Engine gauges and counters from the latest ``EngineStats`` (at scrape time)."""
        if self._finished:
            self.hit_req_rate.set(self._finished_with_hits / self._finished)
        st = self._stats() if self._stats is not None else EngineStats()
        view = engine_view(st, self._info, self._in_flight, self._last_end)
        self.num_requests_running.set(view.num_running)
        self.num_requests_waiting.set(view.num_waiting)
        self.num_requests_preempted.set(view.num_preempted)
        self.num_requests_enqueued.set(view.num_enqueued)
        self.batch_size.set(view.num_running)
        self.available_batch_size.set(view.available_batch_size)
        self.gpu_cache_usage_perc.set(view.kv_cache_usage)
        self.available_gpu_block_num.set(view.available_blocks)
        self.free_gpu_block_num.set(view.free_blocks)
        self.available_gpu_resource.set(view.available_resource)
        if st.prefix_cache_queries:
            host = st.prefix_cache_host_hits
            self.hit_token_rate.set(st.prefix_cache_hits / st.prefix_cache_queries)
            self.gpu_hit_token_rate.set((st.prefix_cache_hits - host) / st.prefix_cache_queries)
            self.cpu_hit_token_rate.set(host / st.prefix_cache_queries)
        self._follow(self.request_preempted, "preemptions", st.num_preemptions)
        self._follow(self.prefix_cache_token_num, "hits", st.prefix_cache_hits)
        self._follow(self.prefix_gpu_cache_token_num, "gpu_hits", st.prefix_cache_hits - st.prefix_cache_host_hits)
        self._follow(self.prefix_cpu_cache_token_num, "cpu_hits", st.prefix_cache_host_hits)
        self._follow(self.spec_draft_tokens, "spec_drafts", st.spec_num_draft_tokens)
        self._follow(self.spec_accepted_tokens, "spec_accepted", st.spec_num_accepted_tokens)
        self._follow(self.spec_emitted_tokens, "spec_emitted", st.spec_num_emitted_tokens)
        if st.spec_num_draft_tokens:
            self.spec_acceptance_rate.set(st.spec_num_accepted_tokens / st.spec_num_draft_tokens)
            most = st.spec_num_draft_tokens + st.spec_num_verify_steps
            self.spec_efficiency.set(st.spec_num_emitted_tokens / most)

    def _follow(self, counter: Counter, key: str, total: int) -> None:
        """Advance ``counter`` to an engine total (totals only grow)."""
        seen = self._totals.get(key, 0)
        if total > seen:
            counter.inc(total - seen)
            self._totals[key] = total

    def render(self) -> bytes:
        """The Prometheus text exposition, gauges refreshed."""
        self.refresh()
        return generate_latest(self._exposition)

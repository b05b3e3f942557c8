"""``Metrics``: FastDeploy-named Prometheus metrics over one private registry.

Names follow FastDeploy's docs/online_serving/metrics.md and
fastdeploy/metrics/{metrics,work_metrics}.py (``fastdeploy:`` prefix, no
model label, as FastDeploy exports by default), so existing dashboards work.
One deliberate addition: ``request_success_total`` carries vLLM's
``finished_reason`` label ("stop", "length"); summing over it gives
FastDeploy's unlabelled counter.

Who calls what: the API layer calls ``request_received`` when a generation
request arrives and ``request_finished`` when its last output is seen (or it
was aborted); ``render`` is the /metrics handler, and refreshes the engine
gauges from ``EngineStats`` first.
"""

from __future__ import annotations

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
        self._last_preemptions = 0
        self._finished = 0
        self._finished_with_hits = 0
        self._num_blocks = info.num_kv_blocks if info is not None else 0
        r, p = self.registry, METRIC_PREFIX

        # requests
        self.requests_number = Counter(p + "requests_number", "Total number of requests received", registry=r)
        self.request_success = Counter(p + "request_success_total", "Total number of successfully processed requests",
                                       ["finished_reason"], registry=r)
        self.request_preempted = Counter(p + "request_preempted_total", "Number of preempted requests", registry=r)
        self.num_requests_running = Gauge(p + "num_requests_running", "Number of requests currently running",
                                          registry=r)
        self.num_requests_waiting = Gauge(p + "num_requests_waiting", "Number of requests currently waiting",
                                          registry=r)
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
        # KV cache
        self.gpu_cache_usage_perc = Gauge(p + "gpu_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage",
                                          registry=r)
        self.free_gpu_block_num = Gauge(p + "free_gpu_block_num", "Number of free blocks in cache", registry=r)
        self.max_gpu_block_num = Gauge(p + "max_gpu_block_num", "Number of total blocks determined at startup",
                                       registry=r)
        self.available_gpu_resource = Gauge(p + "available_gpu_resource",
                                            "Available blocks percentage: free_gpu_block_num / max_gpu_block_num",
                                            registry=r)
        self.hit_token_rate = Gauge(p + "hit_token_rate", "Token-level prefix cache hit rate", registry=r)
        self.gpu_hit_token_rate = Gauge(p + "gpu_hit_token_rate", "Token-level GPU prefix cache hit rate",
                                        registry=r)
        self.hit_req_rate = Gauge(p + "hit_req_rate", "Request-level prefix cache hit rate", registry=r)
        self.prefix_cache_token_num = Counter(p + "prefix_cache_token_num", "Total number of cached tokens",
                                              registry=r)
        self.cache_config_info = Gauge(p + "cache_config_info", "Information of the engine's cache config",
                                       ["block_size", "num_gpu_blocks", "backend"], registry=r)
        if info is not None:
            self.max_gpu_block_num.set(info.num_kv_blocks)
            self.cache_config_info.labels(str(info.block_size), str(info.num_kv_blocks), info.backend).set(1)

    def request_received(self) -> None:
        self.requests_number.inc()

    def request_finished(self, output: RequestOutput, max_tokens: int | None, aborted: bool = False) -> None:
        """Record one request's tokens and timings (from its last RequestOutput)."""
        m = output.metrics
        num_prompt = len(output.prompt_token_ids)
        num_generated = sum(len(o.token_ids) for o in output.outputs)
        self.prompt_tokens.inc(num_prompt)
        self.generation_tokens.inc(num_generated)
        self.request_prompt_tokens.observe(num_prompt)
        self.request_generation_tokens.observe(num_generated)
        if max_tokens is not None:
            self.request_params_max_tokens.observe(max_tokens)
        self.prefix_cache_token_num.inc(output.num_cached_tokens)
        self._finished += 1
        self._finished_with_hits += output.num_cached_tokens > 0
        if not aborted:
            for reason in {o.finish_reason for o in output.outputs if o.finish_reason}:
                if reason != "abort":
                    self.request_success.labels(reason).inc()
        end = m.finished_time or m.last_token_time
        if m.ttft is not None:
            self.ttft.observe(m.ttft)
        if m.time_in_queue is not None:
            self.queue_time.observe(m.time_in_queue)
        if end is not None:
            self.e2e.observe(max(0.0, end - m.arrival_time))
        if m.first_scheduled_time is not None and m.last_token_time is not None:
            self.inference_time.observe(max(0.0, m.last_token_time - m.first_scheduled_time))
        if m.first_scheduled_time is not None and m.first_token_time is not None:
            self.prefill_time.observe(max(0.0, m.first_token_time - m.first_scheduled_time))
        if m.first_token_time is not None and m.last_token_time is not None:
            decode = m.last_token_time - m.first_token_time
            self.decode_time.observe(max(0.0, decode))
            per_sample = num_generated / max(1, len(output.outputs))
            if per_sample > 1:
                self.tpot.observe(max(0.0, decode) / (per_sample - 1))

    def refresh(self) -> None:
        """Engine gauges from the latest ``EngineStats`` (called at scrape time)."""
        if self._finished:
            self.hit_req_rate.set(self._finished_with_hits / self._finished)
        if self._stats is None:
            return
        st = self._stats()
        self.num_requests_running.set(st.num_running)
        self.num_requests_waiting.set(st.num_waiting)
        self.gpu_cache_usage_perc.set(st.kv_cache_usage)
        self.free_gpu_block_num.set(st.num_free_blocks)
        if self._num_blocks:
            self.available_gpu_resource.set(st.num_free_blocks / self._num_blocks)
        if st.prefix_cache_queries:
            rate = st.prefix_cache_hits / st.prefix_cache_queries
            self.hit_token_rate.set(rate)
            self.gpu_hit_token_rate.set(rate)
        if st.num_preemptions > self._last_preemptions:
            self.request_preempted.inc(st.num_preemptions - self._last_preemptions)
            self._last_preemptions = st.num_preemptions

    def render(self) -> bytes:
        """The Prometheus text exposition, gauges refreshed."""
        self.refresh()
        return generate_latest(self.registry)

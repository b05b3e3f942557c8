"""Three fd-serve instances under a skewed load: the global scheduler against
round-robin without it, in the same run.

Starts a redis-server on a free loopback port and, per mode, three fd-serve
instances of one generated checkpoint (tiny shape by default; CPU backend):

- ``global-skewed``: ``--scheduler-name global``, every request sent to
  instance 0 (the skew the global scheduler exists for);
- ``local-round-robin``: ``--scheduler-name local``, requests spread evenly
  by the client, the best an outside balancer that knows nothing of load does;
- ``local-skewed`` (``--with-local-skewed``): no scheduler, all to instance 0.

Per mode it prints the requests each instance completed (from the instances'
heartbeats in Redis under global, else what was sent), busiest / idlest, and
the wall time and request throughput; then the ratios between modes.

    python benchmarks/global_scheduler.py                       # 48 requests, 12 at once
    python benchmarks/global_scheduler.py --requests 96 --concurrency 24 --with-local-skewed
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(workdir: Path) -> tuple[subprocess.Popen, int]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (Debian: apt-get install -y redis-server)")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    import redis

    for _ in range(100):
        try:
            if redis.Redis(port=port).ping():
                return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    sys.exit("redis-server did not start")


def start_instances(model: str, extra: list[str], logdir: Path, tag: str) -> list[tuple[subprocess.Popen, int]]:
    out = []
    for i in range(3):
        port = free_port()
        log = open(logdir / f"{tag}-{i}.log", "w")
        cmd = [sys.executable, "-m", "fd_core.entrypoints.openai.api_server", "--host", "127.0.0.1",
               "--port", str(port), "--model", model, "--backend", "cpu", "--served-model-name", "m",
               "--disable-log-requests", *extra]
        env = {**os.environ, "FD_LOG_DIR": str(logdir / "fd-log")}
        out.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT), port))
    for proc, port in out:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                sys.exit(f"an instance exited with {proc.returncode}; see {logdir}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
    return out


def stop(instances: list[tuple[subprocess.Popen, int]]) -> None:
    for proc, _ in instances:
        proc.terminate()
    for proc, _ in instances:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def taken(redis_port: int, topic: str) -> dict[str, int]:
    import redis

    r = redis.Redis(port=redis_port)
    counts = {}
    for key in r.scan_iter(f"fd:{topic}:ins:*"):
        raw = r.get(key)
        if raw:
            counts[key.decode().rsplit(":ins:", 1)[1]] = json.loads(raw).get("taken", 0)
    return counts


def run_load(ports: list[int], targets: list[int], lengths: list[int], concurrency: int) -> float:
    def one(i: int) -> None:
        body = {"model": "m", "prompt": f"request {i}: tell a story", "max_tokens": lengths[i],
                "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"http://127.0.0.1:{ports[targets[i]]}/v1/completions", json=body, timeout=600)
        r.raise_for_status()

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(len(targets))))
    return time.perf_counter() - start


def mode(name: str, model: str, args: argparse.Namespace, redis_port: int, logdir: Path,
         lengths: list[int]) -> dict:
    n = args.requests
    common = ["--max-num-seqs", str(args.max_num_seqs), "--max-model-len", "1024"]
    if name == "global-skewed":
        topic = f"bench{os.getpid()}"
        extra = [*common, "--scheduler-name", "global", "--scheduler-port", str(redis_port),
                 "--scheduler-topic", topic, "--scheduler-min-load-score", str(args.min_load_score)]
    else:
        extra = common
    instances = start_instances(model, extra, logdir, name)
    ports = [p for _, p in instances]
    try:
        targets = [i % 3 for i in range(n)] if name == "local-round-robin" else [0] * n
        if name == "global-skewed":
            time.sleep(2)  # every instance has sent its first heartbeat
            before = taken(redis_port, topic)
        seconds = run_load(ports, targets, lengths, args.concurrency)
        if name == "global-skewed":
            time.sleep(2)  # the heartbeats carry the last counts
            after = taken(redis_port, topic)
            per = sorted((after[k] - before.get(k, 0) for k in after), reverse=True)
        else:
            per = sorted((targets.count(i) for i in range(3)), reverse=True)
    finally:
        stop(instances)
    ratio = per[0] / per[-1] if per[-1] else float("inf")
    return {"mode": name, "completed_per_instance": per, "busiest_over_idlest": ratio, "seconds": seconds,
            "requests_per_s": n / seconds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint directory (default: generate one of --shape)")
    p.add_argument("--shape", default="tiny-dense")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--min-load-score", type=float, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--with-local-skewed", action="store_true")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fd-bench-gs-"))
    model = args.model
    if model is None:
        from fd_core.testing.checkpoints import generate_checkpoint

        model = str(generate_checkpoint(work / "ckpt", args.shape))
    rng = random.Random(args.seed)
    lengths = [rng.choice([8, 16, 32, 64, 128]) for _ in range(args.requests)]  # uneven work per request
    redis_proc, redis_port = start_redis(work)
    cpu = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout.strip()
    print(f"# {cpu}; {args.requests} requests, {args.concurrency} at once, --max-num-seqs {args.max_num_seqs}, "
          f"model {args.shape if args.model is None else model}")
    modes = ["global-skewed", "local-round-robin"] + (["local-skewed"] if args.with_local_skewed else [])
    try:
        rows = [mode(m, model, args, redis_port, work, lengths) for m in modes]
    finally:
        redis_proc.terminate()
    for row in rows:
        print(f"{row['mode']:>18}: completed per instance {row['completed_per_instance']}, busiest/idlest "
              f"{row['busiest_over_idlest']:.2f}, {row['seconds']:.1f} s, {row['requests_per_s']:.2f} req/s")
    g, rr = rows[0], rows[1]
    print(f"throughput global-skewed / local-round-robin: {g['requests_per_s'] / rr['requests_per_s']:.2f}")
    if args.with_local_skewed:
        print(f"throughput global-skewed / local-skewed: {g['requests_per_s'] / rows[2]['requests_per_s']:.2f}")
    print(json.dumps(rows))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""`s2s serve` under bounded load: 8 clients x 50 requests against a server on the demo model.

    python bench/serving/serve_load.py --run runs/demo     # trains the demo preset there first if it is not a run yet

A `s2s serve` process on the run (127.0.0.1, a free port, --threads 2) answers `--clients`
threads that each send `--requests` POST /generate requests of `--sentences` held-out demo
sentences, one after the other (a client sends its next request once the last is answered).
Per round: sentences/s over the round's wall time, latency p50 / p95 of a request, errors (any
answer but 200 with one output a sentence, and any output that differs from what the server gave
the same sentence alone before the load: must be 0), the mean number of requests a batch served,
and the medians of the time a request waited for the worker and of its batch's decoding (the
server's own `timing`; the rest of a latency is HTTP, JSON and the client). Interleaved with each round, the same sentences through `s2s generate`'s own path in this
process (`inference.load_run(...).generate`, all at once, 2 threads, no HTTP): `served_vs_offline`
is the ratio of the two rates, what the HTTP round trips, one-sentence requests and the queue cost
against decoding the whole set in one go. Medians of `--rounds` rounds; the JSON holds every round
and the machine's facts, the load average among them (the machine is shared: figures taken on a
busy one are noisy; rerun on a quiet one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402
from s2s.core.files import atomic_write_text  # noqa: E402

from bench.common import free_port, machine, results_of  # noqa: E402  s2s first: its CPU runtime defaults precede torch


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {}


def start(run: Path, threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "serve",
            str(run),
            "--port",
            str(port),
            "--threads",
            str(threads),
            "-q",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"s2s serve exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("s2s serve did not answer /health in 120 s")


def load_round(url: str, requests: list[list[list[str]]], expected: dict) -> dict:
    """Every client's requests, the clients at once; the round's figures."""
    latencies, errors, batched, parts = [], [0], [], {"queued_ms": [], "decode_ms": []}
    lock = threading.Lock()

    def client(mine: list[list[str]]) -> None:
        for text in mine:
            t0 = time.perf_counter()
            status, answer = post(url + "/generate", {"text": text})
            took = time.perf_counter() - t0
            ok = status == 200 and answer.get("hypotheses") == [expected[s] for s in text]
            with lock:
                latencies.append(took)
                errors[0] += not ok
                if ok:
                    batched.append(answer["timing"]["batch_requests"])
                    for key, values in parts.items():
                        values.append(answer["timing"][key])

    threads = [threading.Thread(target=client, args=(mine,)) for mine in requests]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    sentences = sum(len(text) for mine in requests for text in mine)
    ms = sorted(1000 * x for x in latencies)
    return {
        "sentences": sentences,
        "requests": len(ms),
        "seconds": round(wall, 3),
        "sentences_per_s": round(sentences / wall, 1),
        "latency_ms_p50": round(statistics.median(ms), 1),
        "latency_ms_p95": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 1),
        "errors": errors[0],
        "mean_requests_a_batch": round(statistics.mean(batched), 2) if batched else 0.0,
        **{f"{key}_p50": round(statistics.median(v), 1) if v else 0.0 for key, v in parts.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--run",
        default="runs/demo",
        help="a trained demo run (trained with `s2s train demo` if absent)",
    )
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=50, help="requests a client sends")
    p.add_argument("--sentences", type=int, default=1, help="sentences a request")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default="serve_load")
    args = p.parse_args()

    from s2s.core.data.nodes import prepare_data
    from s2s.core.inference import load_run

    run = Path(args.run)
    if not (run / "result.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "s2s.core.apps.cli", "train", "demo", f"run.dir={run}", "-q"],
            check=True,
        )
    offline = load_run(run, ["run.device=cpu"])
    pool = prepare_data(offline.task, offline.cfg.data, quiet=True).texts("test")[0]
    n = args.clients * args.requests * args.sentences
    lines = [pool[i % len(pool)] for i in range(n)]
    it = iter(lines)
    requests = [
        [[next(it) for _ in range(args.sentences)] for _ in range(args.requests)]
        for _ in range(args.clients)
    ]

    torch.set_num_threads(args.threads)
    proc, url = start(run, args.threads)
    try:
        unique = list(dict.fromkeys(lines))
        expected = {}
        for s in unique:  # each sentence alone, before the load: what every answer must equal
            status, answer = post(url + "/generate", {"text": [s]})
            expected[s] = answer["hypotheses"][0] if status == 200 else None
        rounds = []
        for r in range(args.rounds):
            served = load_round(url, requests, expected)
            t0 = time.perf_counter()
            outputs = offline.generate(lines)
            seconds = time.perf_counter() - t0
            served["offline_sentences_per_s"] = round(len(lines) / seconds, 1)
            served["offline_equal"] = outputs == [expected[s] for s in lines]
            served["served_vs_offline"] = round(
                served["sentences_per_s"] / served["offline_sentences_per_s"], 3
            )
            rounds.append(served)
            print(json.dumps(served), flush=True)
    finally:
        proc.terminate()
        proc.wait(15)

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in rounds), 3)

    result = {
        "command": "python bench/serving/serve_load.py " + " ".join(sys.argv[1:]),
        "what": f"s2s serve on {run} ({args.threads} threads): {args.clients} clients x {args.requests} requests "
        f"of {args.sentences} held-out demo sentence(s), POST /generate over HTTP on 127.0.0.1; offline: "
        "the same sentences through inference.load_run(...).generate in one process, no HTTP",
        "median": {
            k: median(k)
            for k in (
                "sentences_per_s",
                "latency_ms_p50",
                "latency_ms_p95",
                "mean_requests_a_batch",
                "queued_ms_p50",
                "decode_ms_p50",
                "offline_sentences_per_s",
                "served_vs_offline",
            )
        },
        "errors": sum(r["errors"] for r in rounds),
        "offline_equal": all(r["offline_equal"] for r in rounds),
        "rounds": rounds,
        "machine": machine(),
    }
    results_of(__file__).mkdir(exist_ok=True)
    atomic_write_text(
        results_of(__file__) / f"{args.name}.json", json.dumps(result, indent=1) + "\n"
    )
    print(
        json.dumps(result["median"]),
        f"errors {result['errors']}",
        f"-> bench/serving/results/{args.name}.json",
    )


if __name__ == "__main__":
    main()

"""`s2s serve` under clients that misbehave (issue 43): does a normal request still get through,
and does the server give its memory back?

    python bench/serving/serve_abuse.py --run runs/serve_demo   # trains the demo preset there if absent

A `s2s serve` process on the demo model (127.0.0.1, a free port, 2 threads, the default limits)
meets, at once and bounded: 100 connections that are idle or stop half-way through a request
(half send no byte, half a head without its end or a body shorter than its Content-Length),
16 send-and-close clients each sending a heavy /generate (64 long sentences, 4-best) and
closing, and 8 clients pipelining 80 /attention requests of 240 words each (57 KB of answer
each on the demo model: more than the kernel's socket buffers hold) and never reading,
all from 127.0.0.2. Meanwhile a normal client on 127.0.0.1 sends one-sentence /generate
requests, one a second: each must be answered 200 within 1 s. The server's resident memory (VmRSS of its process) is read idle, at its peak
under the load, and 5 s after every misbehaving client has gone: it must come back within 50 MB
of the idle figure. The JSON records every latency, the memory, /health's dropped count, the
log's refusals, and whether a traceback appeared.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.common import machine, write  # noqa: E402
from bench.serving.serve_load import post, start  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def request(path: str, body: bytes, length: int | None = None) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    """A connection to the server from 127.0.0.2, another client than the normal one's
    127.0.0.1 (the server serves clients in turn by address)."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind(("127.0.0.2", 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def misbehave(port: int, hold: float) -> dict:
    """Open every misbehaving client; hold them `hold` seconds (the non-readers and idlers);
    close them all. Returns what was sent."""
    socks = []
    for i in range(100):  # idle and half-sent
        s = connect(port)
        if i % 4 == 1:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        elif i % 4 == 2:
            s.sendall(request("/generate", b'{"text": ["the', length=500))
        socks.append(s)
    heavy = json.dumps({"text": ["the dog sees a big cat and the bird " * 2] * 64, "nbest": 4})
    for _ in range(16):  # send and close
        s = connect(port)
        s.sendall(request("/generate", heavy.encode()))
        s.close()
    attention = json.dumps({"text": " ".join(["the dog sees a big cat"] * 40)}).encode()
    for _ in range(8):  # pipelined /attention, about 4.5 MB of answers each, never read
        s = connect(port, rcvbuf=4096)
        for _ in range(80):
            s.sendall(request("/attention", attention))
        socks.append(s)
    time.sleep(hold)
    for s in socks:
        s.close()
    return {"idle_or_half_sent": 100, "send_and_close_heavy": 16, "not_reading_attention": 8}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default="runs/serve_demo")
    p.add_argument("--seconds", type=float, default=20.0, help="how long the load is held")
    p.add_argument("--name", default="serve_abuse")
    args = p.parse_args()
    run = Path(args.run)
    if not (run / "result.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "s2s.core.apps.cli", "train", "demo", "-q", f"run.dir={run}"],
            check=True,
        )
    proc, url = start(run, 2)
    port = int(url.rsplit(":", 1)[1])
    try:
        for _ in range(5):  # warm: the first requests load what decoding needs
            post(url + "/generate", {"text": ["the dog sees a cat"]})
            post(url + "/attention", {"text": "the dog sees a cat"})
        idle = rss_mib(proc.pid)
        latencies, peak = [], [idle]
        stop = threading.Event()

        def normal() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                status, answer = post(url + "/generate", {"text": ["the dog sees a cat"]}, 30)
                latencies.append((status, round(time.perf_counter() - t0, 3)))
                peak.append(rss_mib(proc.pid))
                time.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))

        watcher = threading.Thread(target=normal)
        watcher.start()
        time.sleep(1.0)
        sent = misbehave(port, args.seconds)
        time.sleep(5.0)
        stop.set()
        watcher.join(60)
        after = rss_mib(proc.pid)
        with urllib.request.urlopen(url + "/health", timeout=30) as r:
            health = json.loads(r.read())
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    log = err.decode(errors="replace")
    seconds = [s for _, s in latencies]
    result = {
        "command": f"python bench/serving/serve_abuse.py --run {args.run}",
        "machine": machine(),
        "clients": sent,
        "held_s": args.seconds,
        "normal_requests": len(latencies),
        "normal_not_200": sum(status != 200 for status, _ in latencies),
        "normal_latency_s_max": max(seconds) if seconds else None,
        "normal_latencies_s": seconds,
        "target_latency_s": 1.0,
        "latency_met": bool(seconds) and max(seconds) < 1.0,
        "rss_mib": {"idle": round(idle, 1), "peak": round(max(peak), 1), "after": round(after, 1)},
        "target_rss_back_within_mib": 50,
        "rss_met": after - idle < 50,
        "dropped": health.get("dropped"),
        "log_refusals": {
            "408": log.count("no whole request within"),
            "503": log.count("refused a connection"),
            "not_read": log.count("was not read within"),
        },
        "traceback_in_log": "Traceback" in log,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "normal_latencies_s"}, indent=1))
    print(f"wrote {write(args.name, result)}")


if __name__ == "__main__":
    main()

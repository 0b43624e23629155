"""`s2s serve` against clients that misbehave, through real sockets on 127.0.0.1 (bounded loops
and timeouts): idle and half-sent requests are closed with a 408 after --client-seconds, one
connection over --max-connections gets a JSON 503 with Retry-After, deeply nested JSON a 400,
work for clients that left is dropped, a second server on a taken port stops in one line, and
SIGTERM answers waiting requests with a JSON 503 and stops; never a traceback in the log."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import free_port
from test_serve import get, post, server, serving

pytestmark = pytest.mark.slow


def _connect(url: str) -> socket.socket:
    port = int(url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_all(sock: socket.socket, seconds: float = 10) -> bytes:
    """What the server sends until it closes the connection (at most `seconds`)."""
    sock.settimeout(seconds)
    got = b""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        got += chunk
    return got


def _status_and_json(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body else {}


def _request(path: str, body: bytes, length: int | None = None) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


def test_idle_half_sent_and_too_many_connections(demo_runs, tmp_path):
    log = tmp_path / "serve.log"
    args = ("--client-seconds", "1.5", "--max-connections", "4")
    with server(demo_runs["a"], *args, log=log) as url:
        _, info = get(f"{url}/info")
        assert info["limits"]["connections"] == 4 and info["limits"]["client_seconds"] == 1.5
        idle = _connect(url)
        head_only = _connect(url)
        head_only.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
        half_body = _connect(url)
        half_body.sendall(_request("/generate", b'{"text": ["the', length=200))
        fourth = _connect(url)
        time.sleep(0.3)
        fifth = _connect(url)  # one over --max-connections
        status, answer = _status_and_json(_read_all(fifth, 5))
        assert status == 503 and "4 connections" in answer["error"]
        start = time.time()
        for sock in (idle, head_only, half_body, fourth):
            status, answer = _status_and_json(_read_all(sock, 10))
            assert status == 408 and "1.5 s" in answer["error"], answer
            sock.close()
        assert time.time() - start < 5
        fifth.close()
        status, got = post(f"{url}/generate", {"text": ["the dog sees a cat"]})
        assert status == 200 and got["hypotheses"]
    text = log.read_text()
    assert "Traceback" not in text and "no whole request within 1.5 s" in text
    assert "refused a connection" in text


def test_deep_json_clients_that_leave_and_answers_not_read(demo_runs, tmp_path):
    log = tmp_path / "serve.log"
    with server(demo_runs["a"], "--client-seconds", "2", log=log) as url:
        deep = b"[" * 50_000 + b"]" * 50_000
        status, answer = post(f"{url}/generate", deep)
        assert status == 400 and "nested too deeply" in answer["error"]
        # send-and-close clients: heavy requests whose clients are gone are passed over
        heavy = json.dumps({"text": ["the dog sees a cat " * 6] * 64, "nbest": 4}).encode()
        for _ in range(16):
            sock = _connect(url)
            sock.sendall(_request("/generate", heavy))
            sock.close()
        start = time.time()
        status, got = post(f"{url}/generate", {"text": ["the dog sees a cat"]}, timeout=30)
        waited = time.time() - start
        assert status == 200 and waited < 10, waited
        deadline = time.time() + 20
        while time.time() < deadline and get(f"{url}/health")[1]["dropped"] < 8:
            time.sleep(0.2)
        assert get(f"{url}/health")[1]["dropped"] >= 8
        # an answer that is not read: the connection is aborted after --client-seconds
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        body = json.dumps({"text": " ".join(["the dog sees a cat"] * 60)}).encode()
        for _ in range(12):  # pipelined, about 1 MB of answer each, piling up unread
            reader.sendall(_request("/attention", body))
        deadline = time.time() + 30
        while time.time() < deadline and "was not read" not in log.read_text():
            time.sleep(0.2)
        reader.close()
        assert get(f"{url}/health")[0] == 200
    text = log.read_text()
    assert "was not read within 2 s" in text and "Traceback" not in text
    assert "left before its answer" in text


def test_an_answer_too_large_is_refused_before_decoding(demo_runs, tmp_path):
    with server(demo_runs["a"], log=tmp_path / "serve.log") as url:
        long = " ".join(["the dog sees a cat"] * 100)  # 501 tokens, 1,899 characters
        status, answer = post(f"{url}/attention", {"text": long})
        assert (
            status == 413 and "weights" in answer["error"] and "at most 400,000" in answer["error"]
        ), answer
        assert post(f"{url}/attention", {"text": "the dog sees a cat"})[0] == 200


def test_a_second_server_on_a_taken_port_stops_in_one_line(demo_runs, tmp_path):
    with server(demo_runs["a"], log=tmp_path / "first.log") as url:
        port = url.rsplit(":", 1)[1]
        done = subprocess.run(
            [sys.executable, "-m", "s2s.core.apps.cli", "serve", str(demo_runs["a"]), "--port"]
            + [port],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and "cannot listen there" in done.stderr
        assert "serve:" not in done.stderr.replace("s2s serve: error", "")
        assert get(f"{url}/health")[0] == 200


def test_sigterm_answers_waiting_requests_and_stops(demo_runs, tmp_path):
    log = tmp_path / "serve.log"
    port = free_port()
    proc = serving(demo_runs["a"], "--port", str(port), log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if get(url + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.3)
        heavy = {"text": ["the dog sees a cat " * 12] * 64, "nbest": 4}  # a batch each
        answers = []

        def ask():
            try:
                answers.append(post(f"{url}/generate", heavy, timeout=60))
            except OSError as e:
                answers.append((None, str(e)))

        threads = [threading.Thread(target=ask) for _ in range(24)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        stopped = time.time() - start
        for t in threads:
            t.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert stopped < 10, stopped
    statuses = [status for status, _ in answers]
    assert 503 in statuses and set(statuses) <= {200, 503}, answers
    assert all("stopping" in a["error"] for s, a in answers if s == 503)
    assert "Traceback" not in log.read_text()


def test_clients_are_served_in_turn(demo_runs, tmp_path):
    """A client (127.0.0.2) with many heavy requests queued holds the worker from another
    (127.0.0.3) for about one batch, not for all of its requests."""
    import http.client

    def ask(source: str, body: dict, took: list) -> None:
        port = int(url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=120, source_address=(source, 0)
        )
        start = time.time()
        conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        took.append((response.status, time.time() - start))
        conn.close()

    with server(demo_runs["a"], log=tmp_path / "serve.log") as url:
        heavy = {"text": ["the dog sees a cat " * 12] * 64, "nbest": 4}  # a batch each
        heavy_took, light_took = [], []
        threads = [
            threading.Thread(target=ask, args=("127.0.0.2", heavy, heavy_took)) for _ in range(12)
        ]
        for t in threads:
            t.start()
        time.sleep(0.5)
        ask("127.0.0.3", {"text": ["the dog sees a cat"]}, light_took)
        for t in threads:
            t.join(120)
    (status, light), slowest = light_took[0], max(s for _, s in heavy_took)
    assert status == 200 and all(s == 200 for s, _ in heavy_took)
    assert light < slowest / 3, (light, sorted(s for _, s in heavy_took))

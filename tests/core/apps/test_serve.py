"""`s2s serve` through a real HTTP client: a server process on 127.0.0.1, urllib requests.

Tiny runs trained once for the module: the demo (translation), the treebank sample's parser
(constrained search: every output is a tree), and the multi-task demo (members). Concurrent
requests get `s2s generate`'s output lines for their sentences; every bad request gets a 4xx
with a JSON error naming the fault, and the server goes on answering.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cli_checks import s2s
from s2s.core.contract.task import DecodeDefaults
from conftest import NLTK_DATA, free_port, needs, task_keys, tiny_run
from s2s.core.apps.serve.bodies import (
    MAX_BODY,
    MAX_CHARS,
    MAX_SAMPLES,
    MAX_SENTENCES,
    MAX_TERMS,
    MAX_TERM_PAIRS,
    MAX_WEIGHTS,
)
from s2s.core.data.members import build_members, pick
from s2s.core.data.nodes import prepare_data
from s2s.core.setup.config import load_config
from s2s.core.setup.registry import Registry

RAW = ["The dog sees a cat.", "Prices rose 10% in the quarter.", "I don't know (really)."]


def parser(tmp: Path) -> Path:
    return tiny_run(
        tmp,
        "ptb_sample_parsing",
        "run.log_interval=50",
        f"task.nltk_data={NLTK_DATA}",
        "model.layers=1",
        "model.d_model=64",
        "model.d_ff=128",
        "data.max_tokens=2500",
        "optim.max_updates=60",
        "optim.warmup=20",
        "optim.lr_scale=1.0",
        "run.valid_interval=60",
        "run.save_interval=60",
        "run.valid_max_sentences=4",
        "run.average_last=0",
        "run.precision=fp32",
        "decode.beam=2",
    )


def held_out(run_dir: Path, n: int, task: str | None = None) -> list[str]:
    registry = Registry.installed()
    cfg = load_config(run_dir / "config.yaml", [], registry=registry)
    member = pick(
        build_members(cfg, registry), task or (None if cfg.tasks is None else next(iter(cfg.tasks)))
    )
    from s2s.core.data.members import data_config

    return prepare_data(member.task, data_config(cfg), quiet=True).texts("test")[0][:n]


# -- the server and the client -------------------------------------------------------------------
def serving(run_dir: Path, *args: str, log: Path) -> subprocess.Popen:
    """`s2s serve RUN_DIR ARGS` started as a process, its output going to `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "s2s.core.apps.cli", "serve", str(run_dir), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@contextlib.contextmanager
def server(run_dir: Path, *args: str, log: Path | None = None):
    """A `s2s serve` process on a free port of 127.0.0.1; yields its base URL once /health answers
    (60 s at most), and ends it afterwards."""
    port = free_port()
    log = log or run_dir.parent / f"serve_{port}.log"
    proc = serving(run_dir, "--port", str(port), *args, log=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"s2s serve exited with {proc.returncode}: {log.read_text()[-2000:]}"
                )
            with contextlib.suppress(OSError):
                if get(url + "/health", timeout=2)[0] == 200:
                    break
            if time.time() > deadline:
                raise AssertionError(
                    f"s2s serve did not answer /health in 60 s: {log.read_text()[-2000:]}"
                )
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _answer(request, timeout: float) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url: str, timeout: float = 30) -> tuple[int, dict]:
    return _answer(urllib.request.Request(url), timeout)


def post(url: str, body, timeout: float = 60, method: str = "POST") -> tuple[int, dict]:
    """(status, JSON answer) of a request whose body is `body` as JSON, or as it is (bytes)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
    return _answer(
        urllib.request.Request(
            url, data=data, method=method, headers={"Content-Type": "application/json"}
        ),
        timeout,
    )


def generate_cli(run_dir: Path, lines: list[str], tmp: Path, *args: str) -> list[str]:
    """`s2s generate RUN_DIR ARGS` on `lines`, as a separate process: its output lines."""
    src, out = tmp / "src.txt", tmp / "out.txt"
    src.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "generate",
            str(run_dir),
            "--input",
            str(src),
            "--output",
            str(out),
            "-q",
            *args,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out.read_text(encoding="utf-8").split("\n")[:-1]


# -- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_server(demo_run):
    with server(demo_run, "-q") as url:
        yield url


# -- translation -------------------------------------------------------------------------------
@pytest.mark.slow
def test_concurrent_requests_get_the_output_of_s2s_generate(demo_run, demo_server, tmp_path):
    lines = held_out(demo_run, 40) + RAW
    expected = dict(zip(lines, generate_cli(demo_run, lines, tmp_path)))
    # 8 clients, each sending 6 requests of 1 to 6 sentences, all at once
    requests = [
        [lines[(7 * c + 3 * r + k) % len(lines)] for k in range(1 + (c + r) % 6)]
        for c in range(8)
        for r in range(6)
    ]
    answers: dict[int, tuple[int, dict]] = {}

    def client(c: int) -> None:
        for r in range(6):
            i = 6 * c + r
            answers[i] = post(demo_server + "/generate", {"text": requests[i]})

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(answers) == len(requests)
    for i, sent in enumerate(requests):
        status, answer = answers[i]
        assert status == 200, answer
        assert answer["hypotheses"] == [expected[s] for s in sent]
        assert len(answer["scores"]) == len(sent) and all(s <= 0 for s in answer["scores"])
        timing = answer["timing"]
        assert (
            timing["batch_sentences"] >= len(sent) and timing["total_ms"] >= timing["decode_ms"] > 0
        )
    status, health = get(demo_server + "/health")
    assert (
        status == 200
        and health["status"] == "ok"
        and health["sentences"] >= sum(map(len, requests))
    )
    # one worker: requests that queued behind a batch were decoded together
    assert max(answers[i][1]["timing"]["batch_requests"] for i in answers) > 1


@pytest.mark.slow
def test_unknown_words_are_named_and_scores_are_the_searchs(demo_run, demo_server):
    from s2s.core.decode.batched import source_batch
    from s2s.core.decode.search import search
    from s2s.core.inference import load_for_inference

    status, answer = post(
        demo_server + "/generate", {"text": ["the dog sees a cat", "the zebra sees a cat"]}
    )
    assert status == 200 and answer["unknown_words"] == [[], ["zebra"]]
    cfg, member, model = load_for_inference(demo_run, Registry.installed())
    hyp = search(
        model,
        source_batch(member.encode_source(["the dog sees a cat"])),
        DecodeDefaults(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=10),
    )[0]
    assert abs(answer["scores"][0] - hyp.score) < 1e-3


@pytest.mark.slow
def test_health_and_info(demo_run, demo_server):
    status, info = get(demo_server + "/info")
    assert status == 200
    assert (
        info["tasks"] == ["demo"]
        and info["default_task"] == "demo"
        and Path(info["run_dir"]) == demo_run
    )
    assert Path(info["checkpoint"]).is_file() and info["decode"]["demo"]["beam"] == 4
    assert info["limits"] == {
        "sentences": MAX_SENTENCES,
        "characters": MAX_CHARS,
        "tokens": 64,
        "batch_tokens": info["limits"]["batch_tokens"],
        "nbest": {"demo": 4},  # at most the beam
        "samples": MAX_SAMPLES,
        "terms": MAX_TERMS,
        "term_pairs": MAX_TERM_PAIRS,
        "body_bytes": MAX_BODY,
        "attention_weights": MAX_WEIGHTS,
        "queued_requests": 1024,
        "connections": 256,
        "client_seconds": 10.0,
        "shutdown_seconds": 5,
    }
    health = get(demo_server + "/health")[1]
    assert health["status"] == "ok" and health["dropped"] == 0


BAD = [  # (body, status, words the error names)
    (b"", 400, "empty request body"),
    (b"   ", 400, "empty request body"),
    (b"\xff\xfe{}", 400, "not valid UTF-8"),
    (b'{"text": ["caf\xe9"]}', 400, "not valid UTF-8"),
    (b'{"text": [', 400, "not JSON"),
    (b'["a sentence"]', 400, "not an object"),
    ({}, 400, 'no "text"'),
    ({"text": []}, 400, '"text" holds 0 items; at least 1'),
    (
        {"text": "the dog sees a cat"},
        400,
        '"text" is the JSON string "the dog sees a cat", not a list',
    ),
    ({"text": {"a": 1}}, 400, '"text" is a JSON object, not a list'),
    ({"text": ["the dog", 7]}, 400, '"text"[1] is the JSON number 7, not a string'),
    ({"text": [None]}, 400, '"text"[0] is null, not a string'),
    ({"text": [["nested"]]}, 400, '"text"[0] is a JSON list, not a string'),
    (
        {"text": ["the dog"], "nbest": 2.5},
        400,
        '"nbest" is the JSON number 2.5, not a whole number',
    ),
    ({"text": ["the dog"], "nbest": True}, 400, '"nbest" is true, not a whole number'),
    ({"text": ["the dog"], "nbest": 0}, 400, '"nbest" is the JSON number 0; at least 1'),
    ({"text": ["the dog"], "nbest": 5}, 400, '"nbest" 5: at most the beam (4)'),
    ({"text": ["the dog"], "mbr": "ter"}, 400, '"mbr" is the JSON string "ter", not one of'),
    ({"text": ["the dog"], "terms": [["dog"]]}, 400, '"terms"[0] holds 1 items; at least 2'),
    ({"text": ["the dog\nsees a cat"]}, 400, "line break"),
    (b'{"text": ["\\ud800 lone"]}', 400, "lone surrogate"),
    ({"text": ["x" * (MAX_CHARS + 1)]}, 413, f"at most {MAX_CHARS}"),
    ({"text": ["the dog"] * (MAX_SENTENCES + 1)}, 413, f"at most {MAX_SENTENCES}"),
    ({"text": [" ".join(["dog"] * 80)]}, 413, "model.max_positions"),
    ({"text": ["the dog"], "task": "parse"}, 400, "this run's tasks are demo"),
    ({"text": ["the dog"], "task": 3}, 400, '"task" is the JSON number 3, not a string'),
]


@pytest.mark.slow
def test_every_bad_request_gets_its_4xx_and_the_server_goes_on(demo_server):
    good = {"text": ["the dog sees a cat"]}
    expected = post(demo_server + "/generate", good)[1]["hypotheses"]
    for body, status, needle in BAD:
        got, answer = post(demo_server + "/generate", body)
        assert (got, needle in answer.get("error", "")) == (status, True), (body[:80], got, answer)
        assert post(demo_server + "/generate", good)[1]["hypotheses"] == expected
    for path, body, status, needle in (
        ("/attention", {"text": "the dog", "layer": 9}, 400, "2 layers"),
        ("/attention", {"text": "the dog", "layer": True}, 400, '"layer" is true, not a whole'),
        ("/attention", {"text": ["a", "b"]}, 400, "one sentence"),
        ("/nothing", {"text": ["a"]}, 404, "Not Found"),
    ):
        got, answer = post(demo_server + path, body)
        assert got == status and needle in answer["error"], (path, got, answer)
    assert get(demo_server + "/generate")[0] == 405
    assert post(demo_server + "/generate", b"x" * ((1 << 20) + 1))[0] == 413
    status, health = get(demo_server + "/health")
    assert status == 200 and health["status"] == "ok"


def raw_post(url: str, data: bytes, headers: dict) -> tuple[int, dict]:
    """(status, JSON answer) of a POST with exactly these headers (none added)."""
    return _answer(urllib.request.Request(url, data=data, method="POST", headers=headers), 60)


@pytest.mark.slow
@pytest.mark.parametrize(
    "media",
    [
        None,
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonp",
    ],
)
def test_only_json_bodies_are_read(demo_server, media):
    """A browser's cross-site "simple" POST (text/plain, a form type, from any Origin) gets a
    415 and is not decoded: no web page a user visits can drive the server (issue 77)."""
    headers = {"Origin": "https://evil.example"}
    if media is not None:
        headers["Content-Type"] = media
    body = json.dumps({"text": ["the dog sees a cat"]}).encode()
    for path in ("/generate", "/score", "/attention"):
        status, answer = raw_post(demo_server + path, body, headers)
        assert status == 415 and "application/json" in answer["error"], (path, answer)
    ok = {"Content-Type": "application/json; charset=utf-8"}
    assert raw_post(demo_server + "/generate", body, ok)[0] == 200


@pytest.mark.slow
def test_whole_numbers_repeated_keys_and_bools_in_bodies(demo_server):
    """Whole numbers written as floats (7.0, 1e3: json.dumps's and Java's way) are taken where
    a whole number is wanted, other floats refused; a key given twice is refused (not the last
    value taken silently); a bool where a float is wanted is named as a bool (issue 77)."""
    text = ["the dog sees a cat"]
    drawn = {"nbest": 2.0, "sampling": {"seed": 7.0, "top_k": 5.0}}
    got = post(demo_server + "/generate", {"text": text, **drawn})
    assert got[0] == 200 and len(got[1]["nbest"][0]) == 2, got
    assert post(demo_server + "/generate", b'{"text": ["a"], "sampling": {"seed": 1e3}}')[0] == 200
    assert post(demo_server + "/attention", {"text": text[0], "layer": 1.0})[0] == 200
    for body, needle in (
        ({"text": text, "sampling": {"top_k": 5.5}}, '"sampling"."top_k" is the JSON number 5.5'),
        ({"text": text, "sampling": {"temperature": True}}, '"temperature" is true, not a number'),
        (b'{"text": ["a"], "text": ["b"]}', 'repeats the key "text"'),
        (b'{"text": ["a"], "sampling": {"seed": 1, "seed": 2}}', 'repeats the key "seed"'),
    ):
        status, answer = post(demo_server + "/generate", body)
        assert status == 400 and needle in answer["error"], (body, answer)
        assert "\n" not in answer["error"]


@pytest.mark.slow
def test_a_megabyte_of_terms_is_refused_before_it_is_tokenised(demo_server):
    """About 1 MB of term pairs (their count over the bound, or too many different ones) gets
    its 400 at once, while /health answers; it once held the event loop for 13 s."""
    import concurrent.futures

    many = {"text": ["the dog"], "terms": [["dog", "hond"]] * 60_000}
    different = {"text": ["the dog"], "terms": [[f"dog{i}", "hond"] for i in range(MAX_TERM_PAIRS)]}
    assert len(json.dumps(many)) > 900_000
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        bodies = [many, different, many, different]
        answers = list(pool.map(lambda b: post(demo_server + "/generate", b), bodies))
        health = pool.submit(get, demo_server + "/health").result()
    assert time.perf_counter() - start < 20 and health[0] == 200
    for (status, answer), needle in zip(answers, ["at most", "different pairs"] * 2):
        assert status == 400 and needle in answer["error"] and '"terms"' in answer["error"], answer


@pytest.mark.slow
def test_attention_is_the_searchs_output_over_the_source(demo_server):
    sentence = "the dog sees a big cat"
    output = post(demo_server + "/generate", {"text": [sentence]})[1]["hypotheses"][0]
    status, answer = post(demo_server + "/attention", {"text": sentence, "layer": 1})
    assert (
        status == 200
        and answer["output"] == output
        and answer["layer"] == 1
        and answer["layers"] == 2
    )
    assert answer["source_tokens"] == sentence.split() + ["</s>"]
    assert answer["output_tokens"][-1] == "</s>" and len(answer["weights"]) == answer["heads"] == 2
    for head in answer["weights"]:
        assert len(head) == len(answer["output_tokens"])
        for row in head:  # a softmax over the source tokens
            assert len(row) == len(answer["source_tokens"]) and abs(sum(row) - 1) < 1e-2


@pytest.mark.slow
def test_threads_and_precision_are_options(demo_run, tmp_path):
    lines = held_out(demo_run, 12)
    with server(demo_run, "--threads", "2", "--precision", "int8", "-q") as url:
        info = get(url + "/info")[1]
        assert info["threads"] == 2 and info["decode"]["demo"]["precision"] == "int8"
        got = post(url + "/generate", {"text": lines})[1]["hypotheses"]
    assert got == generate_cli(demo_run, lines, tmp_path, "decode.precision=int8")


def test_a_taken_port_is_one_line_before_the_model_loads(capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = s2s(capsys, "serve", tmp_path / "no_run", "--port", port)
    assert code == 2 and f"--port {port}: cannot listen there" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--port", "70000"], "--port 70000: a port is a number from 0"),
        (["--port", "-1"], "--port -1: a port"),
        (["--threads", "0"], "--threads 0: at least 1"),
        (["--max-connections", "0"], "--max-connections 0: at least 1"),
        (["--client-seconds", "0"], "--client-seconds 0.0: a number of seconds > 0"),
        (["--client-seconds", "inf"], "--client-seconds inf"),
        (["--host", "no-such-host.invalid"], "--host no-such-host.invalid"),
        ([], "no_run: no such run directory"),
    ],
)
def test_a_bad_command_line_is_one_line(capsys, tmp_path, args, needle):
    code, _, err = s2s(capsys, "serve", tmp_path / "no_run", "--port", "0", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


# -- parsing and members -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def parser_run(tmp_path_factory):
    if not NLTK_DATA.exists():
        pytest.skip(f"real corpus not found: {NLTK_DATA}")
    return parser(tmp_path_factory.mktemp("ptb"))


@pytest.mark.slow
@needs(NLTK_DATA)
def test_parsing_outputs_are_s2s_generates_and_every_tree_is_drawn(parser_run, tmp_path):
    run = parser_run
    lines = RAW + ["The company said its profit fell in the third quarter."]
    expected = generate_cli(run, lines, tmp_path)
    with server(run, "-q") as url:
        status, answer = post(url + "/generate", {"text": lines})
    assert status == 200 and answer["hypotheses"] == expected
    assert answer["sources"][1] == "Prices rose 10 % in the quarter ."  # Penn Treebank tokens
    assert answer["sources"][2] == "I do n't know -LRB- really -RRB- ."
    for source, tree in zip(answer["sources"], answer["trees"]):
        assert tree.startswith("<svg") and 'class="tree"' in tree
        assert tree.count('class="word"') == len(source.split())


@pytest.mark.slow
@needs(NLTK_DATA)
def test_no_tree_within_the_length_limit_is_an_empty_line_never_a_made_up_one(
    parser_run, capsys, caplog, tmp_path
):
    """The constrained parser with a length limit too short for a sentence's tree: an empty
    output line, a warning naming the line and a count at the end, JSON score null, the
    server's `no_output`; never a flat tree made up by post-processing."""
    src = tmp_path / "in.txt"
    src.write_text("The company said its profit fell in the third quarter .\nProfits rose .\n")
    limit = ["decode.max_len_a=0", "decode.max_len_b=12"]
    code, out, err = s2s(capsys, "generate", parser_run, "--input", src, *limit)
    lines = out.split("\n")
    assert code == 0 and lines[0] == "" and lines[1].startswith("(TOP"), (out, err)
    assert "in.txt, line 1: the search found no output within the length limit" in caplog.text
    assert "for 1 of 2 line(s) the search found no output" in caplog.text
    code, out, _ = s2s(capsys, "generate", parser_run, "--input", src, "--json", *limit)
    first = json.loads(out.splitlines()[0])["outputs"][0]
    assert first == {"output": "", "score": None, "logprob": None, "tokens": 0}
    with server(parser_run, *limit, log=tmp_path / "serve.log") as url:
        status, got = post(f"{url}/generate", {"text": src.read_text().splitlines()})
    assert status == 200 and got["no_output"] == [0] and got["hypotheses"][0] == ""
    assert got["scores"][0] is None and got["scores"][1] is not None


@pytest.mark.slow
def test_a_multitask_run_serves_every_member(tmp_path_factory, tmp_path):
    run = tiny_run(
        tmp_path_factory.mktemp("multi"),
        "multitask_demo",
        "run.log_interval=50",
        *task_keys("multitask_demo", "train_size=300", "valid_size=6", "test_size=6"),
        "data.max_tokens=300",
        "optim.warmup=10",
        "optim.max_updates=30",
        "run.valid_interval=30",
        "run.save_interval=30",
    )
    lines = ["the dog sees a cat", "a cat runs"]
    with server(run, "-q") as url:
        info = get(url + "/info")[1]
        assert info["tasks"] == ["translate", "parse"] and info["default_task"] is None
        status, answer = post(url + "/generate", {"text": lines})
        assert status == 400 and "several tasks (translate, parse)" in answer["error"]
        got = {
            name: post(url + "/generate", {"text": lines, "task": name})[1]["hypotheses"]
            for name in info["tasks"]
        }
        assert post(url + "/generate", {"text": lines, "task": "summarise"})[0] == 400
    for name in ("translate", "parse"):
        assert got[name] == generate_cli(run, lines, tmp_path, "--task", name)
    with server(run, "--task", "parse", "-q") as url:
        assert post(url + "/generate", {"text": lines})[1]["hypotheses"] == got["parse"]


def test_only_this_machines_names_and_the_allowed_hosts_are_answered(demo_runs, tmp_path):
    """A Host header other than localhost, the bound address and --allowed-hosts gets 400 (a page
    of another site that rebinds its name to 127.0.0.1 cannot read /info or drive the model)."""
    import http.client

    def status(url: str, host: str, path: str = "/info") -> int:
        port = int(url.rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", path, headers={"Host": host})
            return conn.getresponse().status
        finally:
            conn.close()

    log = tmp_path / "serve.log"
    with server(demo_runs["a"], "--allowed-hosts", "mt.example.org", log=log) as url:
        port = url.rsplit(":", 1)[1]
        for host in ("localhost", f"127.0.0.1:{port}", "mt.example.org", "[::1]"):
            assert status(url, host) == 200, host
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.2", "mt.example.org.evil"):
            assert status(url, host) == 400, host
            assert status(url, host, "/page") == 400, host  # no redirect built from it
        _, info = get(f"{url}/info")
        assert "mt.example.org" in info["allowed_hosts"]
    assert "Traceback" not in log.read_text()


def test_the_printed_url_opens_as_printed_on_ipv6(demo_runs, tmp_path):
    """`--host ::1`: the URL the server prints has the address in brackets, and opens."""
    import re

    log = tmp_path / "serve6.log"
    proc = serving(demo_runs["a"], "--host", "::1", "--port", "0", log=log)
    try:
        deadline, status = time.time() + 60, None
        while status is None and time.time() < deadline and proc.poll() is None:
            printed = re.search(r"on (http://\S+/)", log.read_text())
            if printed:
                with contextlib.suppress(OSError):
                    status = get(printed.group(1) + "health", timeout=2)[0]
            time.sleep(0.3)
        assert printed and printed.group(1).startswith("http://[::1]:"), log.read_text()
        assert status == 200
    finally:
        proc.terminate()
        proc.wait(15)

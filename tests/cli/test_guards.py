"""The guards every command shares, through the real command line: one output guard (outputs
through links and special files written, never replaced; no writing command replaces a run's
file), decoding settings outside what float32 and the generators take refused in one line by the
command line, the server and the Python API alike, what a user gives the search (tokens, terms,
side files) checked whole before the first output, rerank's options and scorers, data files
named by their fault.

Each failure is asserted as the other fault tests assert it (`cli_checks.fails`): exit 2, one
line naming the option, file or value, no traceback, nothing on disk changed. One tiny demo run is
trained per module.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cli_checks import fails, s2s, snapshot
from conftest import TINY_MODEL
from s2s.core.apps.cli import main

SOURCES = "the cat sees a dog\na big man holds the ball\nevery bird likes the tree\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained tiny demo run (two rolling checkpoints) and a source file."""
    root = tmp_path_factory.mktemp("hostile")
    run = root / "run"
    argv = ["train", "demo", "-q", *TINY_MODEL, "run.quiet=true", "task.train_size=200"]
    argv += ["task.valid_size=10", "task.test_size=10", "optim.max_updates=2"]
    argv += ["run.valid_interval=2", "run.save_interval=1", "decode.precision=fp32"]
    assert main([*argv, f"run.dir={run}", f"data.cache_dir={root / 'cache'}"]) == 0
    src = root / "src.txt"
    src.write_text(SOURCES, encoding="utf-8")
    return {"root": root, "run": run, "src": src}


def cli(*args, stdout=subprocess.PIPE, timeout=300) -> subprocess.CompletedProcess:
    """`python -m s2s.core.apps.cli ARGS` in a subprocess (where stdout itself is under test)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *map(str, args)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=timeout,
        env=env,
    )


# -- 1. one writer: links followed, special files written in place ----------------------------
def test_generate_output_through_a_link_writes_the_links_target(world, capsys, tmp_path):
    real, link = tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_text("old\n")
    os.chmod(real, 0o640)
    link.symlink_to("real.txt")
    code, _, err = s2s(
        capsys, "generate", world["run"], "--input", world["src"], "-q", "--output", link
    )
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == "real.txt"
    assert len(real.read_text().splitlines()) == 3
    assert stat.S_IMODE(real.stat().st_mode) == 0o640  # the user's file, its permissions kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_average_output_through_a_link_writes_the_links_target(world, capsys, tmp_path):
    real, link = tmp_path / "avg.pt", tmp_path / "link.pt"
    real.write_bytes(b"old")
    link.symlink_to(real)
    checkpoints = sorted((world["run"] / "checkpoints").glob("checkpoint_*.pt"))
    code, _, err = s2s(capsys, "average", *checkpoints, "--output", link)
    assert code == 0, err
    assert link.is_symlink() and real.stat().st_size > 1000


def test_average_through_a_link_to_a_rolling_checkpoint_is_refused(world, capsys, tmp_path):
    """The checks on what an average may replace apply to the file a link leads to."""
    checkpoints = sorted((world["run"] / "checkpoints").glob("checkpoint_*.pt"))
    link = tmp_path / "average.pt"
    link.symlink_to(checkpoints[-1])
    before = snapshot(world["run"], tmp_path)
    result = s2s(capsys, "average", checkpoints[0], "--output", link)
    fails(result, before, "rolling checkpoint")


def test_generate_output_to_a_fifo_is_written_in_place(world, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    result = cli("generate", world["run"], "--input", world["src"], "-q", "--output", fifo)
    reader.join(60)
    assert result.returncode == 0, result.stderr.decode()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert len(got[0].splitlines()) == 3


@pytest.mark.parametrize("name", ["/dev/fd/1", "{link}"])
def test_generate_output_to_a_name_of_stdout_writes_through_it(world, tmp_path, name):
    """`--output /dev/stdout > out.txt` (here /dev/fd/1, and a link to /dev/stdout: the same
    path through the code, which never writes /dev/stdout itself in a test) appends to what the
    shell opened, and no link is replaced: not /dev/stdout, not the user's."""
    link = tmp_path / "stdout"
    link.symlink_to("/dev/stdout")
    out = tmp_path / "out.txt"
    out.write_text("before\n")
    with open(out, "a") as f:  # `>> out.txt`
        result = cli(
            "generate",
            world["run"],
            "--input",
            world["src"],
            "-q",
            "--output",
            name.format(link=link),
            stdout=f,
        )
    assert result.returncode == 0, result.stderr.decode()
    lines = out.read_text().splitlines()
    assert lines[0] == "before" and len(lines) == 4
    assert link.is_symlink() and os.readlink(link) == "/dev/stdout"
    assert Path("/dev/stdout").is_symlink()
    from s2s.core.files import descriptor_of, replaced_file

    assert descriptor_of("/dev/stdout") == 1 and replaced_file("/dev/stderr") is None


# -- 2. decoding settings in range: the command line, the API --------------------------------
@pytest.mark.parametrize(
    "options, needles",
    [
        (["--sampling", "--temperature", "inf"], ["--temperature inf", "finite number"]),
        (["--sampling", "--temperature", "1e300"], ["--temperature 1e+300", "[0.001, 1000]"]),
        (["--sampling", "--temperature", "1e-45"], ["--temperature 1e-45", "[0.001, 1000]"]),
        (["--sampling", "--temperature", "nan"], ["--temperature nan", "finite number"]),
        (["--sampling", "--top-p", "1e-300"], ["--top-p 1e-300", "(0.001, 1]"]),
        (["--sampling", "--seed", str(10**30)], ["--seed 1000000", "[0, 4294967295]"]),
        (["--sampling", "--seed", "-1"], ["--seed -1", "[0, 4294967295]"]),
        (["--alpha", "1e300"], ["decode.alpha=1e+300", "[0, 10]"]),
        (["--max-len-a", "1e300"], ["decode.max_len_a=1e+300", "[0, 10000]"]),
        (["--max-len-b", str(10**23)], ["decode.max_len_b=1000000", "[0, 1000000000]"]),
    ],
)
def test_generate_refuses_settings_out_of_range(world, capsys, tmp_path, options, needles):
    out = tmp_path / "out.txt"
    out.write_text("kept\n")
    before = snapshot(out, world["run"])
    result = s2s(
        capsys, "generate", world["run"], "--input", world["src"], "--output", out, *options
    )
    fails(result, before, *needles)


def test_label_refuses_a_temperature_out_of_range(world, capsys, tmp_path):
    before = snapshot(tmp_path)
    result = s2s(
        capsys,
        "label",
        world["run"],
        "--input",
        world["src"],
        "--output",
        tmp_path / "labels",
        "--sampling",
        "--temperature",
        "inf",
    )
    fails(result, before, "--temperature inf")


def test_score_refuses_a_resampling_seed_out_of_range(world, capsys):
    before = snapshot(world["src"])
    for seed in ("-1", str(10**23)):
        result = s2s(
            capsys,
            "score",
            "demo",
            "--ref",
            world["src"],
            "--hyp",
            world["src"],
            "--ci",
            "--seed",
            seed,
        )
        fails(result, before, f"--seed {seed[:6]}", "[0, 4294967295]")


def test_the_python_api_checks_what_the_command_line_checks(world):
    from s2s.core.decode.sampling import Sampling
    from s2s.core.errors import UsageError
    from s2s.core.inference import load_run

    run = load_run(world["run"])
    lines = SOURCES.splitlines()
    for sampling, needle in [
        (Sampling(temperature=float("inf")), "temperature inf"),
        (Sampling(top_p=1e-300), "top-p 1e-300"),
        (Sampling(seed=10**30), "seed 1000000"),
    ]:
        with pytest.raises(UsageError, match=needle.replace("+", r"\+")):
            run.outputs(lines, n=2, sampling=sampling)
    with pytest.raises(UsageError, match="nbest 9: above the beam"):
        run.outputs(lines, n=9)
    assert len(run.outputs(lines, n=2, sampling=Sampling(temperature=1000.0, seed=3))[0]) == 2


# -- the server: the same checks, a 400 naming the field --------------------------------------
BAD_REQUESTS = [
    ({"nbset": 2}, 400, ['"nbset" is not a field of /generate', 'did you mean "nbest"']),
    ({"sampling": {"temprature": 2}}, 400, ['"temprature"', 'did you mean "temperature"']),
    ({"sampling": {"seed": 10**30}}, 400, ['"sampling": seed 1000000', "[0, 4294967295]"]),
    ({"sampling": {"seed": 1e23}}, 400, ['"sampling"."seed" is the JSON number 1e+23', "whole"]),
    ({"sampling": {"temperature": 1e300}}, 400, ["temperature 1e+300", "[0.001, 1000]"]),
    (
        {"sampling": {"temperature": 10**400}},
        400,
        ['"temperature" is the JSON number 1000', "range"],
    ),
    ({"sampling": {"top_p": 1e-300}}, 400, ["top-p 1e-300", "(0.001, 1]"]),
    (b'{"text": ["a"], "sampling": {"temperature": Infinity}}', 400, ["Infinity", "JSON number"]),
    (b'{"text": ["a"], "sampling": {"top_p": NaN}}', 400, ["NaN", "JSON number"]),
    (b'{"text": ["a"], "sampling": {"temperature": 1e999}}', 400, ["1e999", "JSON number"]),
]


@pytest.mark.slow
def test_the_server_refuses_what_the_command_line_refuses(world, tmp_path):
    """Each bad request gets its 4xx naming the field, the server goes on, and its log holds no
    traceback."""
    from test_serve import post, server

    text = SOURCES.splitlines()
    log = tmp_path / "serve.log"
    with server(world["run"], log=log) as url:
        for body, status, needles in BAD_REQUESTS:
            body = body if isinstance(body, bytes) else {"text": text, **body}
            got = post(f"{url}/generate", body)
            assert got[0] == status and all(n in got[1]["error"] for n in needles), (body, got)
        got = post(f"{url}/score", {"text": text, "targets": text, "taks": "demo"})
        assert got[0] == 400 and 'did you mean "task"' in got[1]["error"], got
        got = post(f"{url}/attention", {"text": text[0], "layers": 1})
        assert got[0] == 400 and 'did you mean "layer"' in got[1]["error"], got
        body = {"text": text, "nbest": 2, "sampling": {"seed": 4294967295, "temperature": 1000}}
        assert post(f"{url}/generate", body)[0] == 200
    assert "Traceback" not in log.read_text()


# -- 3. special tokens in what a user gives; 5. terms merged, conflicts refused ---------------
@pytest.mark.parametrize(
    "option, lines, needles",
    [
        ("--prefixes", ["de </s> kat", "", ""], ["p.txt, line 1", "</s>", "special token"]),
        ("--prefixes", ["", "<pad>", ""], ["p.txt, line 2", "<pad>"]),
        ("--prefixes", ["", "", "<s> de"], ["p.txt, line 3", "<s>"]),
        ("--score-targets", ["de", "</s>", "de"], ["p.txt, line 2", "</s>"]),
        ("--score-targets", ["<unk> de", "de", "de"], ["p.txt, line 1", "<unk>"]),
        ("--terms", ["cat\t</s>"], ["p.txt, line 1", "the target term", "</s>"]),
        ("--terms", ["cat\thond", "<s>\tkat"], ["p.txt, line 2", "the source term", "<s>"]),
        ("--terms", ["cat\thond", "dog\tkat", "cat\tde"], ["p.txt, line 3", "and 'hond' at"]),
    ],
)
def test_special_tokens_and_conflicting_terms_are_refused(
    world, capsys, tmp_path, option, lines, needles
):
    given = tmp_path / "p.txt"
    given.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out.txt"
    out.write_text("kept\n")
    before = snapshot(out, given, world["run"])
    result = s2s(
        capsys, "generate", world["run"], "--input", world["src"], "--output", out, option, given
    )
    fails(result, before, *needles)


def test_identical_terms_are_merged(world, capsys, tmp_path):
    """A term given 3,000 times is one term: the same outputs as given once, and no warning."""
    once, many = tmp_path / "once.tsv", tmp_path / "many.tsv"
    once.write_text("cat\thond\n")
    many.write_text("cat\thond\n" + "cat \t hond\n" * 2999)
    outputs = []
    for terms in (once, many):
        code, out, err = s2s(
            capsys, "generate", world["run"], "--input", world["src"], "-q", "--terms", terms
        )
        assert code == 0 and "WARNING" not in err, err
        outputs.append(out)
    assert outputs[0] == outputs[1] and "hond" in outputs[0].splitlines()[0]


@pytest.mark.slow
def test_the_server_and_the_api_refuse_special_tokens_and_conflicting_terms(world, tmp_path):
    from s2s.core.errors import UsageError
    from s2s.core.inference import load_run
    from test_serve import post, server

    text = SOURCES.splitlines()
    with server(world["run"], log=tmp_path / "serve.log") as url:
        for path, body, needles in [
            ("/generate", {"prefixes": ["de </s>", "", ""]}, ['"prefixes"[0]', "</s>"]),
            ("/generate", {"terms": [["cat", "<pad>"]]}, ['"terms"[0]', "<pad>"]),
            ("/generate", {"terms": [["cat", "hond"], ["cat", "de"]]}, ['"terms"[1]', "'hond'"]),
            ("/generate", {"terms": [["zzzq", "hond"]]}, ["source vocabulary cannot spell"]),
            ("/score", {"targets": ["de", "de </s>", "de"]}, ['"targets"[1]', "</s>"]),
        ]:
            got = post(f"{url}{path}", {"text": text, **body})
            assert got[0] == 400 and all(n in got[1]["error"] for n in needles), (body, got)
        alone = post(f"{url}/generate", {"text": text, "terms": [["cat", "hond"]]})
        merged = post(f"{url}/generate", {"text": text, "terms": [["cat", "hond"]] * 100})
        assert merged[0] == 200 and merged[1]["hypotheses"] == alone[1]["hypotheses"]
    assert "Traceback" not in (tmp_path / "serve.log").read_text()
    run = load_run(world["run"])
    for call, needle in [
        (lambda: run.outputs(text, prefixes=["</s>", "", ""]), "prefixes"),
        (lambda: run.outputs(text, terms=[("cat", "hond"), ("cat", "de")]), "terms"),
        (lambda: run.score(text, ["de", "de", "</s>"]), "targets"),
    ]:
        with pytest.raises(UsageError, match=needle):
            call()


# -- 6. side files checked whole before the first output --------------------------------------
@pytest.mark.parametrize(
    "option, lines, needles",
    [
        ("--prefixes", ["de", "", "", ""], ["p.txt has 4 line(s)", "src.txt 3"]),
        ("--score-targets", ["de", "de", "de", "de"], ["p.txt has 4 line(s)", "src.txt 3"]),
        ("--prefixes", ["de", ""], ["p.txt has 2 line(s)", "src.txt 3"]),
        ("--prefixes", ["de", "", "de zzzq"], ["p.txt, line 3", "cannot spell"]),
        ("--prefixes", ["de", "", "de " * 300], ["p.txt, line 3", "at most"]),
        ("--score-targets", ["de", "de", "de " * 1100], ["p.txt, line 3", "at most 1024"]),
    ],
)
def test_side_files_are_checked_before_the_first_output(
    world, capsys, tmp_path, option, lines, needles
):
    """Decoding a line at a time (decode.max_sentences=1, one thread), nothing is written to
    stdout before a side file's fault on its last line, or its line count, stops the command."""
    given = tmp_path / "p.txt"
    given.write_text("".join(line + "\n" for line in lines))
    before = snapshot(given, world["run"])
    result = s2s(
        capsys,
        "generate",
        world["run"],
        "decode.max_sentences=1",
        "--input",
        world["src"],
        option,
        given,
    )
    fails(result, before, *needles)
    assert result[1] == "", result[1]


# -- 7. s2s score on empty files ---------------------------------------------------------------
@pytest.mark.parametrize("task", ["demo", "translation", "parsing"])
@pytest.mark.parametrize("ci", [[], ["--ci"]])
def test_score_of_empty_files_is_one_line(capsys, tmp_path, task, ci):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    before = snapshot(tmp_path)
    result = s2s(capsys, "score", task, "--ref", empty, "--hyp", empty, *ci)
    fails(result, before, "empty.txt is empty", "no reference lines")


# -- 8. names that can never work --------------------------------------------------------------
@pytest.mark.parametrize(
    "name, needle",
    [
        ("x.example.org:80", "without a port"),
        ("http://x.example.org", "without a scheme"),
        ("a*b", "wildcard"),
        ("", "not empty"),
    ],
)
def test_serve_refuses_allowed_hosts_that_never_match(world, tmp_path, name, needle):
    """Refused in one line before the port is claimed or the model loads (a server that started
    would outlive the 60 s bound)."""
    before = snapshot(world["run"])
    result = cli("serve", world["run"], "--port", "0", "--allowed-hosts", name, timeout=60)
    fails(result, before, f"--allowed-hosts {name!r}", needle)
    assert b"loaded" not in result.stderr


@pytest.mark.parametrize("name", ["", " ", ".hidden", "../x", "a/b"])
def test_label_refuses_a_name_that_is_no_file_name(world, capsys, tmp_path, name):
    before = snapshot(tmp_path)
    out = tmp_path / "labels"
    result = s2s(
        capsys, "label", world["run"], "--input", world["src"], "--output", out, "--name", name
    )
    fails(result, before, f"--name {name!r}", "file name")


# -- 9. run.init_keep=[schedule] from a source past optim.max_updates ------------------------
def test_init_keep_schedule_from_a_finished_source_is_refused(world, capsys, tmp_path):
    """The source is at update 2: max_updates=2 would train nothing (it exited 0 and reported
    the source's test figures as the new run's); refused before the run directory is made.
    max_updates=3 trains the one update left."""
    argv = ["train", "demo", "-q", *TINY_MODEL, "run.quiet=true", "task.train_size=200"]
    argv += ["task.valid_size=10", "task.test_size=10", "run.valid_interval=1"]
    argv += [f"run.init_from={world['run']}", "run.init_keep=[schedule]"]
    argv += [f"data.cache_dir={world['root'] / 'cache'}"]
    before = snapshot(world["run"], tmp_path)
    result = s2s(capsys, *argv, "optim.max_updates=2", f"run.dir={tmp_path / 'new'}")
    fails(result, before, "run.init_keep=[schedule]", "at update 2", "optim.max_updates=2")
    assert not (tmp_path / "new").exists()
    code, _, err = s2s(capsys, *argv, "optim.max_updates=3", f"run.dir={tmp_path / 'more'}")
    assert code == 0, err
    assert checkpoint_update(tmp_path / "more") == 3


def checkpoint_update(run: Path) -> int:
    from s2s.core.runs import checkpoint

    return checkpoint.tested(run)[0]["update"]


# -- 4. a parser's trees scored as the model writes them --------------------------------------
@pytest.fixture(scope="module")
def parser_run(tmp_path_factory):
    from conftest import NLTK_DATA, corpus
    from test_serve import parser

    corpus(NLTK_DATA)
    return parser(tmp_path_factory.mktemp("parser"))


@pytest.mark.slow
def test_a_parsers_trees_are_scored_as_the_model_writes_them(parser_run, capsys, tmp_path):
    """--score-targets, POST /score and Run.score of the trees `--json` wrote give their
    `logprob` and `tokens` (the tree as raw text was scored as other tokens: 317 against 176);
    a line that is no tree is one line naming the file and line."""
    from s2s.core.inference import load_run
    from test_serve import post, server

    import json

    text = tmp_path / "in.txt"
    text.write_text("The dog sees a cat .\nPrices rose in the quarter .\n")
    code, out, err = s2s(capsys, "generate", parser_run, "--input", text, "-q", "--json")
    assert code == 0, err
    best = [json.loads(line)["outputs"][0] for line in out.splitlines()]
    trees = tmp_path / "trees.txt"
    trees.write_text("".join(b["output"] + "\n" for b in best))
    code, out, err = s2s(capsys, "generate", parser_run, "--input", text, "--score-targets", trees)
    assert code == 0, err
    rated = [json.loads(line) for line in out.splitlines()]
    for b, r in zip(best, rated):
        assert r["tokens"] == b["tokens"] and r["logprob"] == pytest.approx(b["logprob"], abs=2e-3)
    lines = text.read_text().splitlines()
    api = load_run(parser_run).score(lines, [b["output"] for b in best])
    assert [a.logprob for a in api] == pytest.approx([b["logprob"] for b in best], abs=2e-3)
    with server(parser_run, log=tmp_path / "serve.log") as url:
        got = post(f"{url}/score", {"text": lines, "targets": [b["output"] for b in best]})
        assert got[0] == 200 and [s["tokens"] for s in got[1]["scores"]] == [
            b["tokens"] for b in best
        ]
        got = post(f"{url}/score", {"text": lines, "targets": ["(S (NP x)", best[1]["output"]]})
        assert got[0] == 400 and '"targets"[0]: not an output of the task' in got[1]["error"]
    bad = tmp_path / "bad.txt"
    bad.write_text(best[0]["output"] + "\n(S (NP x) ))\n")
    before = snapshot(bad, parser_run)
    result = s2s(capsys, "generate", parser_run, "--input", text, "--score-targets", bad)
    fails(result, before, "bad.txt, line 2", "not an output of the task")


# -- 10. a client over --max-connections gets its 503, not a reset ----------------------------
@pytest.mark.slow
def test_every_refused_client_reads_its_503_under_load(world, tmp_path):
    """Two connections held, 60 more at once, each sending a whole request before reading: all
    60 read the JSON 503 with Retry-After (closing at once with their request unread made the
    kernel reset most of them: 6 to 24 of 100 got the 503), then the server answers as before."""
    import json
    import socket
    import time

    from test_serve import post, server

    body = json.dumps({"text": ["the cat sees a dog"]}).encode()
    request = (
        "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    got: list = []

    def client(port: int) -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
                sock.sendall(request)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            got.append(answer)
        except OSError as e:  # ConnectionResetError: what this test is about
            got.append(repr(e).encode())

    log = tmp_path / "serve.log"
    args = ("--max-connections", "2", "--client-seconds", "60")
    with server(world["run"], *args, log=log) as url:
        port = int(url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(2)]
        time.sleep(0.5)
        threads = [threading.Thread(target=client, args=(port,), daemon=True) for _ in range(60)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for sock in held:
            sock.close()
        assert len(got) == 60
        refused = [a for a in got if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) == 60, [a[:60] for a in got if not a.startswith(b"HTTP/1.1 503")][:5]
        head, _, answer = refused[0].partition(b"\r\n\r\n")
        assert b"retry-after: 1" in head.lower() and "2 connections" in json.loads(answer)["error"]
        time.sleep(0.5)
        assert post(f"{url}/generate", {"text": ["the cat sees a dog"]})[0] == 200
    assert "Traceback" not in log.read_text()


# -- one output guard: no writing command replaces a run's file or writes into its folders -------
def other_run(world) -> Path:
    """A second run directory (a copy of the world's), whose files no command may replace."""
    import shutil

    other = world["root"] / "other_run"
    if not other.exists():
        shutil.copytree(world["run"], other)
    return other


def writers(world, out) -> dict:
    """Every command that writes a file or a folder, with OUT as what it writes."""
    run, src, ckpt = world["run"], world["src"], world["run"] / "checkpoint_best.pt"
    return {
        "generate": ["generate", run, "--input", src, "--output", out],
        "rerank": ["rerank", run, "--input", src, "--nbest", "2", "--with", run, "--weights"]
        + ["1", "--output", out],
        "average": ["average", ckpt, "--output", out],
        "label": ["label", run, "--input", src, "--output", out],
        "attention": ["attention", run, "--input", src, "--output", out],
        "export": ["export", run, "--to", "safetensors", "--output", out, "--force"],
        "plot": ["plot", run, "--output", out],
        "sweep": ["sweep", "demo", "--grid", "model.layers=1,2", "--budget-updates", "1"]
        + ["--dir", out],
    }


FILE_WRITERS = ["generate", "rerank", "average"]
FOLDER_WRITERS = ["label", "attention", "export", "plot", "sweep"]


@pytest.mark.parametrize("command", FILE_WRITERS)
@pytest.mark.parametrize("name", ["config.yaml", "checkpoint_best.pt", "result.json"])
def test_no_command_writes_over_a_file_of_a_run(world, capsys, command, name):
    other = other_run(world)
    before = snapshot(other, world["run"])
    argv = writers(world, other / name)[command]
    fails(s2s(capsys, *argv, "-q"), before, f"--output {other / name}", "elsewhere")


@pytest.mark.parametrize("command", FOLDER_WRITERS)
@pytest.mark.parametrize("folder", ["", "checkpoints"])
def test_no_command_writes_into_a_run_or_its_checkpoints(world, capsys, command, folder):
    other = other_run(world)
    target = other / folder if folder else other
    before = snapshot(other, world["run"])
    needles = ["is a run directory"] if not folder else ["checkpoints folder of run directory"]
    fails(s2s(capsys, *writers(world, target)[command], "-q"), before, target, *needles)


@pytest.mark.parametrize("command", FILE_WRITERS + FOLDER_WRITERS)
def test_an_output_below_a_regular_file_is_one_line(world, capsys, tmp_path, command):
    """Not "File exists" nor a temporary file's "Not a directory": the file in the way."""
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine\n")
    before = snapshot(tmp_path, world["run"])
    result = s2s(capsys, *writers(world, blocker / "out")[command], "-q")
    line = fails(result, before, blocker, "is a file, not a folder")
    assert ".tmp" not in line


def test_average_replaces_its_own_earlier_average_in_a_run(world, capsys, tmp_path):
    """RUN_DIR/checkpoint_average.pt is average's own: a second average replaces it."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    for _ in range(2):
        code, _, err = s2s(capsys, "average", run, "--last", "2")
        assert code == 0 and (run / "checkpoint_average.pt").is_file(), err


def test_a_failed_write_names_the_users_file_never_a_temporary(tmp_path):
    """A full disk while writing (or a failed rename) is reported about the file named, not
    its hidden temporary, and leaves nothing behind (`files.replacing`, every writer's way)."""
    import errno

    from s2s.core.errors import explain
    from s2s.core.files import replacing

    out = tmp_path / "out.txt"
    with pytest.raises(OSError) as caught:
        with replacing(out) as f:
            f.write("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert explain(caught.value, "rerank") == (f"{out}: No space left on device", 2)
    assert list(tmp_path.iterdir()) == []


# -- rerank: weights, --nbest, scorers of another job, long lines, <unk>, --tune-ref --output ----
@pytest.fixture(scope="module")
def parse_run(world):
    """A tiny demo run of the other mode (parse)."""
    run = world["root"] / "parse_run"
    argv = ["train", "demo", "-q", *TINY_MODEL, "run.quiet=true", "task.train_size=200"]
    argv += ["task.valid_size=10", "task.test_size=10", "optim.max_updates=1", "task.mode=parse"]
    cache = world["root"] / "cache"
    assert main([*argv, f"run.dir={run}", f"data.cache_dir={cache}"]) == 0
    return run


@pytest.mark.parametrize(
    "options, needles",
    [
        (["--weights", "nan"], ["--weights nan", "finite"]),
        (["--weights", "inf"], ["--weights inf", "finite"]),
        (["--weights=-inf"], ["--weights -inf", "finite"]),
        (["--weights", "1", "--nbest", "100000"], ["--nbest 100000", "target vocabulary"]),
    ],
)
def test_rerank_refuses_bad_weights_and_an_nbest_above_the_vocabulary(
    world, capsys, tmp_path, options, needles
):
    before = snapshot(world["run"], tmp_path)
    argv = ["rerank", world["run"], "--input", world["src"], "--with", world["run"], *options]
    fails(s2s(capsys, *argv, "--output", tmp_path / "out.txt"), before, *needles)


def test_rerank_refuses_a_scorer_of_another_mode(world, parse_run, capsys, tmp_path):
    before = snapshot(world["run"], parse_run, tmp_path)
    argv = ["rerank", world["run"], "--input", world["src"], "--weights", "1"]
    result = s2s(capsys, *argv, "--with", parse_run, "--output", tmp_path / "out.txt")
    fails(result, before, f"--with {parse_run}", "task.mode is 'parse'")


def test_rerank_refuses_a_line_longer_than_the_positions(world, capsys, tmp_path):
    long = tmp_path / "long.txt"
    long.write_text("the cat\n" + " ".join(["the cat"] * 600) + "\n")
    before = snapshot(world["run"], tmp_path)
    argv = ["rerank", world["run"], "--input", long, "--with", world["run"], "--weights", "1"]
    fails(s2s(capsys, *argv), before, f"--input {long}, line 2", "model.max_positions=1024")


def test_rerank_tune_ref_with_output_writes_the_chosen_lines(world, capsys, tmp_path):
    out = tmp_path / "out.txt"
    argv = ["rerank", world["run"], "--input", world["src"], "--with", world["run"], "-q"]
    code, stdout, err = s2s(capsys, *argv, "--tune-ref", world["src"], "--output", out)
    assert code == 0, err
    tuned = __import__("json").loads(stdout)
    assert set(tuned) == {"weights", "dev", "search", "metric", "higher_is_better"}
    assert len(out.read_text().splitlines()) == len(SOURCES.splitlines())


def test_rerank_scores_candidates_holding_unk(world):
    """A candidate the search wrote with <unk> (the model's unknown token) is scored by the
    scorers, not refused as a special token a user typed (`Run.score(searched=True)`)."""
    from s2s.core.errors import UsageError
    from s2s.core.inference import load_run
    from s2s.core.inference.rerank import Scorers, features

    run = load_run(world["run"])
    with pytest.raises(UsageError, match="<unk>"):
        run.score(["the cat sees a dog"], ["<unk> kat"])
    got = run.score(["the cat sees a dog"], ["<unk> kat"], searched=True)
    assert len(got[0].tokens) == 3 and got[0].logprob < 0
    candidates = run.outputs(["the cat sees a dog"], n=2)
    candidates[0][1].text = "<unk> " + candidates[0][1].text
    rows = features(["the cat sees a dog"], candidates, Scorers([run], [run]))
    assert len(rows[0]) == 2 and all(len(r) == 3 for r in rows[0])


# -- data: CR-only line ends, a list without brackets, a launcher's rank -------------------------
def test_cr_only_line_ends_are_named_as_such(world, capsys, tmp_path):
    """A file whose lines end in CR alone was one long line ("no usable pairs", or one output
    for three inputs); now one line saying what its line ends are."""
    mac = tmp_path / "mac.txt"
    mac.write_bytes(SOURCES.replace("\n", "\r").encode())
    before = snapshot(tmp_path, world["run"])
    fails(s2s(capsys, "score", "demo", "--ref", mac, "--hyp", mac), before, mac, "CR")
    out = tmp_path / "out.txt"
    result = s2s(capsys, "generate", world["run"], "--input", mac, "--output", out, "-q")
    fails(result, before, mac, "carriage return alone")


@pytest.mark.parametrize("value", ["empty,same", "empty"])
def test_a_list_setting_without_brackets_is_s2s_own_line(capsys, tmp_path, value):
    result = s2s(capsys, "prepare", "demo", f"data.clean={value}", f"data.cache_dir={tmp_path}")
    fails(result, snapshot(tmp_path), f"data.clean='{value}'", f"data.clean=[{value}]")


def test_a_launchers_rank_that_is_no_number_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GROUP_RANK", "abc")
    result = s2s(capsys, "prepare", "demo", "--nodes", "2", f"data.cache_dir={tmp_path}")
    fails(result, snapshot(tmp_path), "GROUP_RANK='abc'", "whole number")

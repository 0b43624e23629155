"""Downloads have an overall deadline (a mirror that trickles or stalls meets it), and fetched data
files are verified before every use (size, sum or line count), against servers on 127.0.0.1."""

from __future__ import annotations

import contextlib
import functools
import gzip
import http.server
import os
import shutil
import threading
import time

import pytest
from conftest import MULTI30K, corpus
from s2s.core.errors import ConfigError, DataError
from s2s.core.setup.config import load_config


# -- 5. downloads have an overall deadline ------------------------------------------------------------
@contextlib.contextmanager
def local_server(send):
    """A server on 127.0.0.1 whose GET calls send(handler, stop) (stop: set when the test ends);
    yields its URL."""
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            try:
                send(self, stop)
            except OSError:  # the client gave up
                return

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def trickle(tmp_path):
    """A server on 127.0.0.1 that sends a gzipped file one byte every 0.5 s (until the client goes)."""
    body = gzip.compress(b"a caption\n" * 20)

    def send(handler, stop):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        for i in range(len(body)):
            if stop.is_set():
                return
            handler.wfile.write(body[i : i + 1])
            handler.wfile.flush()
            time.sleep(0.5)

    with local_server(send) as url:
        yield url


def test_a_trickling_mirror_meets_the_deadline(trickle, tmp_path):
    from s2s.data_recipes.download import fetch_gzip

    t0 = time.monotonic()
    with pytest.raises(
        DataError, match=r"/x\.gz: not downloaded within 2 s .*S2S_DOWNLOAD_DEADLINE"
    ):
        fetch_gzip(f"{trickle}/x.gz", tmp_path / "out" / "x", deadline_s=2)
    assert 1.9 < time.monotonic() - t0 < 6
    assert not list((tmp_path / "out").iterdir())  # nothing left under the final name


def test_a_mirror_that_stalls_meets_the_deadline_too(tmp_path):
    """Headers, two bytes, then silence: the wait on the socket ends at the deadline, not after
    the per-read timeout (60 s)."""
    from s2s.data_recipes.download import fetch_gzip

    def send(handler, stop):
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        handler.wfile.write(b"\x1f\x8b")
        handler.wfile.flush()
        stop.wait(20)

    with local_server(send) as url:
        t0 = time.monotonic()
        with pytest.raises(DataError, match="not downloaded within 2 s"):
            fetch_gzip(f"{url}/z.gz", tmp_path / "z", deadline_s=2)
        assert time.monotonic() - t0 < 6


def test_the_deadline_from_the_environment_through_the_recipe(trickle, tmp_path, monkeypatch):
    from s2s.data_recipes import multi30k

    monkeypatch.setenv("S2S_MULTI30K_URL", trickle)
    monkeypatch.setenv("S2S_DOWNLOAD_DEADLINE", "2")
    t0 = time.monotonic()
    with pytest.raises(DataError, match=r"test_2017_mscoco\.en\.gz: not downloaded within 2 s"):
        multi30k.fetch(tmp_path / "cache", splits=["test_2017_mscoco"], langs=["en"])
    assert time.monotonic() - t0 < 6
    monkeypatch.setenv("S2S_DOWNLOAD_DEADLINE", "soon")
    with pytest.raises(
        ConfigError, match="S2S_DOWNLOAD_DEADLINE='soon': must be a number of seconds > 0"
    ):
        multi30k.fetch(tmp_path / "cache", splits=["test_2017_mscoco"], langs=["en"])


def test_a_download_within_its_deadline(tmp_path, monkeypatch):
    from s2s.data_recipes.download import deadline_seconds, fetch_gzip

    monkeypatch.delenv("S2S_DOWNLOAD_DEADLINE", raising=False)
    assert deadline_seconds() == 3600
    root = tmp_path / "www"
    root.mkdir()
    (root / "y.gz").write_bytes(gzip.compress(b"line\n" * 1000))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    try:
        out = fetch_gzip(
            f"http://127.0.0.1:{httpd.server_address[1]}/y.gz",
            tmp_path / "y",
            lines=1000,
            deadline_s=30,
        )
        assert out.read_bytes() == b"line\n" * 1000
    finally:
        httpd.shutdown()
        httpd.server_close()


# -- 6. fetched data files are verified before every use ----------------------------------------------
@pytest.fixture
def fetched(tmp_path, monkeypatch):
    """A data home whose multi30k folder holds a copy of val.{en,de}; no server answers."""
    from s2s.data_recipes import multi30k

    folder = tmp_path / "home" / "multi30k"
    folder.mkdir(parents=True)
    for lang in ("en", "de"):
        shutil.copy(corpus(MULTI30K) / f"val.{lang}", folder / f"val.{lang}")
    monkeypatch.setenv("S2S_DATA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(
        "S2S_SHARED_DATA", raising=False
    )  # else the recipe reads the test run's copy there
    monkeypatch.setenv(
        "S2S_MULTI30K_URL", "http://127.0.0.1:9"
    )  # nothing listens: a download would fail
    monkeypatch.setattr(multi30k, "_VERIFIED", {})
    return folder


def test_a_good_file_in_place_is_used(fetched):
    from s2s.data_recipes import multi30k

    assert multi30k.fetch(splits=["val"], langs=["en", "de"]) == fetched


def test_a_truncated_file_in_place_is_named(fetched):
    from s2s.data_recipes import multi30k

    data = (fetched / "val.de").read_bytes()
    (fetched / "val.de").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError) as err:
        multi30k.fetch(splits=["val"], langs=["en", "de"])
    message = str(err.value)
    assert (
        str(fetched / "val.de") in message
        and f"{len(data) // 2} bytes, expected {len(data)}" in message
    )
    assert "delete it" in message and multi30k.FETCH_COMMAND in message and "\n" not in message


def test_a_damaged_file_of_the_right_size_is_named(fetched, registry):
    from s2s.core.data.members import task_section
    from s2s.data_recipes import multi30k
    from s2s.plugins.translation import TranslationTask

    data = bytearray((fetched / "val.en").read_bytes())
    data[100] ^= 0x20  # one letter's case
    (fetched / "val.en").write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"val\.en: damaged or truncated Multi30k file \(sha256 "):
        multi30k.fetch(splits=["val"], langs=["en"])
    cfg = load_config("multi30k_en_de", registry=registry)  # the preset, reading the data home
    with pytest.raises(DataError, match=r"val\.en: damaged or truncated"):
        list(TranslationTask(task_section(cfg.task)).read_split("valid"))


def test_the_verification_is_remembered_by_size_and_mtime(fetched, monkeypatch):
    from s2s.data_recipes import multi30k

    hashed = []
    real = multi30k._problem
    monkeypatch.setattr(multi30k, "_problem", lambda *a: hashed.append(a[0].name) or real(*a))
    for _ in range(3):
        multi30k.fetch(splits=["val"], langs=["en"])
    assert hashed == ["val.en"]  # once per process
    path = fetched / "val.en"
    data = path.read_bytes()
    path.write_bytes(data.replace(b"A ", b"a ", 1))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.raises(DataError, match="sha256"):
        multi30k.fetch(splits=["val"], langs=["en"])
    assert hashed == ["val.en", "val.en"]


def test_a_file_without_a_pinned_sum_is_checked_by_lines(fetched):
    from s2s.data_recipes import multi30k

    (fetched / "test_2017_mscoco.en").write_text("a caption\n" * 461, encoding="utf-8")
    multi30k.fetch(splits=["test_2017_mscoco"], langs=["en"])
    (fetched / "test_2017_mscoco.de").write_text("eine Bildunterschrift\n" * 460, encoding="utf-8")
    with pytest.raises(
        DataError,
        match=r"test_2017_mscoco\.de: damaged or truncated Multi30k file \(460 lines, expected 461\)",
    ):
        multi30k.fetch(splits=["test_2017_mscoco"], langs=["de"])

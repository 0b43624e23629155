"""The recipes that obtain their data, against a file server on 127.0.0.1 (the tests never reach
the network): Multi30k's release files through urllib, the treebank sample through nltk.download."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import threading
import zipfile
from pathlib import Path

import pytest
from conftest import MULTI30K, NLTK_DATA, corpus
from s2s.core.data.members import task_section
from s2s.core.errors import DataError
from s2s.core.setup.config import load_config
from s2s.data_recipes import data_home, multi30k, treebank
from s2s.data_recipes.__main__ import main as fetch_main
from s2s.plugins.translation import TranslationConfig, TranslationTask


@pytest.fixture(autouse=True)
def _no_shared_data(monkeypatch):
    """These tests fetch: S2S_SHARED_DATA (the test run's corpora) would make the recipes read it instead."""
    monkeypatch.delenv("S2S_SHARED_DATA", raising=False)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """A file server on 127.0.0.1 over tmp_path/www; `.requests` lists the paths it was asked for."""
    root = tmp_path / "www"
    root.mkdir()
    requests = []

    class Handler(_Quiet):
        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
    )
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    httpd.root, httpd.requests = root, requests
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _gzip(text: bytes, dest: Path) -> None:
    with gzip.open(dest, "wb") as f:
        f.write(text)


@pytest.fixture
def release(server, monkeypatch):
    """The server holds gzipped copies of val.{en,de} as the release has them; S2S_MULTI30K_URL points at it."""
    for lang in ("en", "de"):
        _gzip((corpus(MULTI30K) / f"val.{lang}").read_bytes(), server.root / f"val.{lang}.gz")
    monkeypatch.setenv("S2S_MULTI30K_URL", server.url)
    return server


def test_data_home_follows_xdg_and_its_override(monkeypatch, tmp_path):
    monkeypatch.delenv("S2S_DATA_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_home() == tmp_path / "xdg" / "s2s"
    assert multi30k.default_dir() == tmp_path / "xdg" / "s2s" / "multi30k"
    monkeypatch.setenv("S2S_DATA_HOME", str(tmp_path / "mine"))
    assert data_home() == tmp_path / "mine"


def test_multi30k_fetched_once_and_verified(release, tmp_path):
    out = multi30k.fetch(tmp_path / "cache", splits=["val"], langs=["en", "de"])
    for lang in ("en", "de"):
        assert (out / f"val.{lang}").read_bytes() == (MULTI30K / f"val.{lang}").read_bytes()
    assert sorted(release.requests) == ["/val.de.gz", "/val.en.gz"]
    assert sorted(p.name for p in out.iterdir()) == ["val.de", "val.en"]  # no temporary left
    multi30k.fetch(tmp_path / "cache", splits=["val"], langs=["en", "de"])
    assert len(release.requests) == 2  # the second call finds the files


def test_the_preset_reads_the_fetched_copy(release, tmp_path, monkeypatch):
    monkeypatch.setenv("S2S_DATA_HOME", str(tmp_path / "home"))
    cfg = load_config("multi30k_en_de", task_config_cls=TranslationConfig)
    task = TranslationTask(task_section(cfg.task))
    pairs = list(task.read_split("valid"))
    assert len(pairs) == 1014 and (tmp_path / "home" / "multi30k" / "val.de").is_file()
    assert pairs[0][0] == (MULTI30K / "val.en").read_text(encoding="utf-8").splitlines()[0].strip()


def test_a_changed_file_fails_its_checksum_and_is_not_kept(release, tmp_path):
    text = (MULTI30K / "val.en").read_bytes().replace(b"A ", b"One ", 1)
    _gzip(text, release.root / "val.en.gz")
    with pytest.raises(DataError, match=r"val\.en\.gz: checksum mismatch") as err:
        multi30k.fetch(tmp_path / "cache", splits=["val"], langs=["en"])
    assert "\n" not in str(err.value) and "task.data_dir" in str(err.value)
    assert not list((tmp_path / "cache").iterdir())


def test_a_truncated_gzip_is_named(release, tmp_path):
    whole = (release.root / "val.en.gz").read_bytes()
    (release.root / "val.en.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError, match=r"/val\.en\.gz: truncated or corrupt gzip"):
        multi30k.fetch(tmp_path / "cache", splits=["val"], langs=["en"])
    assert not list((tmp_path / "cache").iterdir())


def test_http_errors_and_offline_say_how_to_get_the_data(release, tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"/val\.fr\.gz: HTTP error 404"):
        multi30k.fetch(tmp_path / "cache", splits=["val"], langs=["fr"])
    monkeypatch.setenv("S2S_MULTI30K_URL", "http://127.0.0.1:9")  # nothing listens: as if offline
    with pytest.raises(DataError) as err:
        multi30k.fetch(tmp_path / "cache", splits=["val"], langs=["en"])
    message = str(err.value)
    assert (
        "cannot connect" in message
        and multi30k.FETCH_COMMAND in message
        and "task.data_dir" in message
    )


def test_files_without_a_known_checksum_are_checked_by_line_count(server, tmp_path, monkeypatch):
    """test_2017_mscoco has no pinned sha256 here: its published 461 lines are what is checked."""
    monkeypatch.setenv("S2S_MULTI30K_URL", server.url)
    assert ("test_2017_mscoco", "en") not in multi30k.SHA256
    _gzip(b"a caption\n" * 460, server.root / "test_2017_mscoco.en.gz")
    with pytest.raises(DataError, match="460 lines, expected 461"):
        multi30k.fetch(tmp_path / "cache", splits=["test_2017_mscoco"], langs=["en"])
    _gzip(b"a caption\n" * 461, server.root / "test_2017_mscoco.en.gz")
    assert (
        multi30k.fetch(tmp_path / "cache", splits=["test_2017_mscoco"], langs=["en"])
        / "test_2017_mscoco.en"
    ).is_file()


def test_a_local_copy_wins_and_unknown_names_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("S2S_MULTI30K_URL", "http://127.0.0.1:9")
    cfg = load_config(
        "multi30k_en_de", [f"task.data_dir={corpus(MULTI30K)}"], task_config_cls=TranslationConfig
    )
    assert (
        sum(1 for _ in TranslationTask(task_section(cfg.task)).read_split("test")) == 1000
    )  # no download
    with pytest.raises(DataError, match="no split 'test_2019'"):
        multi30k.fetch(tmp_path, splits=["test_2019"])
    with pytest.raises(DataError, match="no language 'cs'"):
        multi30k.fetch(tmp_path, splits=["val"], langs=["cs"])


# -- the NLTK treebank sample -----------------------------------------------------------------
@pytest.fixture
def nltk_index(server, monkeypatch, tmp_path):
    """An NLTK data index on the local server offering treebank.zip, and an empty nltk_data."""
    archive = corpus(NLTK_DATA / "corpora" / "treebank.zip")
    data = archive.read_bytes()
    (server.root / "treebank.zip").write_bytes(data)
    unzipped = sum(i.file_size for i in zipfile.ZipFile(archive).infolist())
    (server.root / "index.xml").write_text(
        '<?xml version="1.0"?>\n<nltk_data><packages>\n'
        f'<package id="treebank" name="Penn Treebank Sample" subdir="corpora" url="{server.url}/treebank.zip" '
        f'size="{len(data)}" unzipped_size="{unzipped}" checksum="{hashlib.md5(data).hexdigest()}" '
        f'sha256_checksum="{hashlib.sha256(data).hexdigest()}" unzip="1"/>\n'
        "</packages><collections/></nltk_data>\n"
    )
    monkeypatch.setenv("S2S_NLTK_INDEX_URL", f"{server.url}/index.xml")
    try:  # recent nltk refuses loopback and private addresses (its SSRF guard): lifted for this server
        import nltk.pathsec
    except ImportError:  # older releases have no such guard
        pass
    else:
        monkeypatch.setattr(nltk.pathsec, "ENFORCE", False)
    home = tmp_path / "nltk_data"
    home.mkdir()
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(home)])  # the user's nltk_data is only this
    return home


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_treebank_sample_is_downloaded_into_nltk_data(nltk_index, server):
    from s2s.plugins.parsing import ParsingConfig, ParsingTask

    cfg = load_config("ptb_sample_parsing", task_config_cls=ParsingConfig)
    assert (
        len(list(ParsingTask(task_section(cfg.task)).read_split("test"))) == 118
    )  # the preset, as is
    assert (nltk_index / "corpora" / "treebank.zip").is_file()
    assert "/index.xml" in server.requests and "/treebank.zip" in server.requests
    asked = len(server.requests)
    assert len(list(treebank.sample_trees(None, "valid"))) == 127
    assert len(server.requests) == asked  # found where it was put


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_fetch_command_writes_the_shared_layout(nltk_index, release, tmp_path, capsys):
    assert fetch_main(["treebank", "--dir", str(tmp_path / "data")]) == 0
    assert (tmp_path / "data" / "nltk_data" / "corpora" / "treebank.zip").is_file()
    assert len(list(treebank.sample_trees(tmp_path / "data" / "nltk_data", "test"))) == 118
    assert (
        fetch_main(["multi30k", "--dir", str(tmp_path / "data")]) == 2
    )  # the server holds only val.{en,de}
    assert "HTTP error 404" in capsys.readouterr().err


def test_treebank_offline_says_how_to_get_it(monkeypatch, tmp_path):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    monkeypatch.setenv("S2S_NLTK_INDEX_URL", "http://127.0.0.1:9/index.xml")  # nothing listens
    with pytest.raises(DataError) as err:
        list(treebank.sample_trees(None, "test"))
    message = str(err.value)
    assert treebank.FETCH_COMMAND in message and "task.nltk_data" in message and "\n" not in message
    with pytest.raises(
        DataError, match="set task.nltk_data to the directory holding corpora/treebank.zip"
    ):
        list(treebank.sample_trees(tmp_path, "test"))

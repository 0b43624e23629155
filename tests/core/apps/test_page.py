"""The page of `s2s serve` in a real headless browser (Debian's chromium, driven by selenium), and
the tree drawing it shows (`s2s.core.apps.serve.treesvg`).

The browser test loads the page from a real server, types sentences, runs them, and checks what
the page shows: the outputs of POST /generate, a drawn tree (an <svg class="tree"> in the DOM)
for a parser, the attention heatmap, no script error. It skips, with one line, where chromium
or its driver is not installed (`apt-get install -y chromium chromium-driver`; .ci/run does).

Screenshots: S2S_SCREENSHOTS=DIR writes DIR/serve_translation.png and DIR/serve_parse.png (the
docs' are taken so, from trained runs: S2S_PAGE_TRANSLATION_RUN=RUN_DIR and
S2S_PAGE_PARSING_RUN=RUN_DIR serve those instead of the tiny runs the test trains).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import NLTK_DATA, needs
from s2s.core.apps.serve import treesvg
from s2s.core.apps.serve.bodies import MAX_CHARS
from test_serve import parser, post, server

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WIDTH = 1200


# -- the tree drawing --------------------------------------------------------------------------
def test_penn_treebank_and_demo_brackets_read_as_trees():
    ptb = treesvg.parse("(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .)))")
    assert ptb.label == "TOP" and ptb.children[0].label == "S"
    demo = treesvg.parse("(S (NP the dog )NP (VP barks )VP )S")
    assert demo.label == "S" and [c.label for c in demo.children] == ["NP", "VP"]
    assert demo.children[0].children == ["the", "dog"]
    assert (
        treesvg.parse("( (S (NP (NN x))))").label == "S"
    )  # the treebank's unlabelled outer bracket


@pytest.mark.parametrize(
    "line",
    [
        "the dog barks",
        "",
        "(S (NP the dog )VP )S",
        "(S (NP x)",
        "(S x))",
        "(A x) (B y)",
        "(A x) tail",
        "dog (NN dog)",
    ],
)
def test_what_is_not_one_tree_is_not_drawn(line):
    assert treesvg.parse(line) is None


def test_the_drawing_has_every_label_and_word_in_order_and_escapes_text():
    tree = treesvg.parse("(S (NP (NNP AT&T) (NNS <shares>)) (VP (VBD rose)) (. .))")
    svg = treesvg.svg(tree)
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" class="tree"') and svg.endswith(
        "</svg>"
    )
    words = [part.split(">", 1)[1].split("<", 1)[0] for part in svg.split('class="word"')[1:]]
    assert words == ["AT&amp;T", "&lt;shares&gt;", "rose", "."]
    labels = [part.split(">", 1)[1].split("<", 1)[0] for part in svg.split('class="label"')[1:]]
    assert labels == ["S", "NP", "NNP", "NNS", "VP", "VBD", "."]
    assert svg.count("<line") == len(labels) - 1 + len(
        words
    )  # an edge to every phrase but the root, and every word
    xs = [float(part.split('x="', 1)[1].split('"', 1)[0]) for part in svg.split('class="word"')[1:]]
    assert xs == sorted(xs)


# -- the page in a browser ---------------------------------------------------------------------
def browser(profile: Path):
    """A headless chromium with a fresh profile in `profile` (a test's temporary folder, so
    that no profile is left behind), driven by selenium; skips where there is none."""
    if not (CHROMIUM and DRIVER):
        pytest.skip(
            "no chromium / chromedriver installed (apt-get install -y chromium chromium-driver)"
        )
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},900",
    ]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=options)


def run_page(driver, url: str, lines: list[str], load: bool = True) -> None:
    """Load the page (`load`), type `lines`, press Run, wait (60 s at most) for the outputs and
    the heatmap."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    if load:
        driver.get(url + "/")
        WebDriverWait(driver, 30).until(lambda d: "tasks:" in d.find_element(By.ID, "run").text)
    driver.find_element(By.ID, "text").clear()
    driver.find_element(By.ID, "text").send_keys("\n".join(lines))
    driver.find_element(By.ID, "run-button").click()
    WebDriverWait(driver, 60).until(
        lambda d: (
            d.find_elements(By.CSS_SELECTOR, "#heatmap svg rect")
            or not d.find_element(By.ID, "error").get_attribute("hidden")
        )
    )
    assert driver.find_element(By.ID, "error").get_attribute("hidden"), driver.find_element(
        By.ID, "error"
    ).text


def screenshot(driver, name: str) -> None:
    """The whole page as DIR/NAME when S2S_SCREENSHOTS=DIR asks for it."""
    folder = os.environ.get("S2S_SCREENSHOTS")
    if not folder:
        return
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, height + 120)  # the window's frame: the viewport holds the page
    time.sleep(0.5)
    Path(folder).mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(Path(folder) / name))


def no_script_errors(driver) -> None:
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def served(env: str, train, tmp_path_factory, name: str) -> Path:
    given = os.environ.get(env)
    return Path(given) if given else train(tmp_path_factory.mktemp(name))


@pytest.mark.slow
def test_the_page_translates_what_is_typed_and_draws_its_attention(demo_run, tmp_path):
    from selenium.webdriver.common.by import By

    driver = browser(tmp_path)
    run = Path(os.environ.get("S2S_PAGE_TRANSLATION_RUN") or demo_run)
    lines = (
        ["A man in a blue shirt is riding a bike down the street.", "Two dogs play in the snow."]
        if os.environ.get("S2S_PAGE_TRANSLATION_RUN")
        else ["the dog sees a cat", "a big cat sees the dog"]
    )
    try:
        with server(run, "-q") as url:
            expected = post(url + "/generate", {"text": lines})[1]
            run_page(driver, url, lines)
            outputs = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".result .output")]
            assert outputs == expected["hypotheses"]
            cells = driver.find_elements(By.CSS_SELECTOR, "#heatmap svg rect")
            attention = post(url + "/attention", {"text": lines[0]})[1]
            assert len(cells) == len(attention["output_tokens"]) * len(attention["source_tokens"])
            assert not driver.find_elements(By.CSS_SELECTOR, "svg.tree")  # a translation is no tree
            no_script_errors(driver)
            screenshot(driver, "serve_translation.png")
            # a refused request: its error on the page, and the page goes on
            from selenium.webdriver.support.ui import WebDriverWait

            driver.find_element(By.ID, "text").clear()
            driver.find_element(By.ID, "text").send_keys("x" * (MAX_CHARS + 1))
            driver.find_element(By.ID, "run-button").click()
            WebDriverWait(driver, 30).until(
                lambda d: not d.find_element(By.ID, "error").get_attribute("hidden")
            )
            assert f"at most {MAX_CHARS}" in driver.find_element(By.ID, "error").text
            run_page(driver, url, lines[:1], load=False)
            assert [
                e.text for e in driver.find_elements(By.CSS_SELECTOR, ".result .output")
            ] == expected["hypotheses"][:1]
            # the n best of each sentence, best first: the server's lists
            from selenium.webdriver.support.ui import Select

            Select(driver.find_element(By.ID, "nbest")).select_by_value("3")
            run_page(driver, url, lines, load=False)
            nbest = post(url + "/generate", {"text": lines, "nbest": 3})[1]["nbest"]
            shown = [
                [li.text.rsplit(" ", 1)[0] for li in box.find_elements(By.CSS_SELECTOR, "li")]
                for box in driver.find_elements(By.CSS_SELECTOR, ".result .nbest")
            ]
            assert shown == [[o["output"] for o in outs] for outs in nbest]
            screenshot(driver, "serve_nbest.png")
    finally:
        driver.quit()


@pytest.mark.slow
@needs(NLTK_DATA)
def test_the_page_draws_the_tree_of_a_parse(tmp_path_factory):
    from selenium.webdriver.common.by import By

    driver = browser(tmp_path_factory.mktemp("chromium"))
    run = served("S2S_PAGE_PARSING_RUN", parser, tmp_path_factory, "ptb")
    lines = ["The company said its profit rose 10% in the third quarter."]
    try:
        with server(run, "-q") as url:
            expected = post(url + "/generate", {"text": lines})[1]
            run_page(driver, url, lines)
            assert (
                driver.find_element(By.CSS_SELECTOR, ".result .output").text
                == expected["hypotheses"][0]
            )
            trees = driver.find_elements(By.CSS_SELECTOR, ".result svg.tree")
            assert len(trees) == 1 and trees[0].size["width"] > 100
            words = [w.text for w in trees[0].find_elements(By.CSS_SELECTOR, "text.word")]
            assert (
                words == expected["sources"][0].split()
            )  # the Penn Treebank tokens, in order, drawn
            assert trees[0].find_elements(By.CSS_SELECTOR, "text.label") and trees[0].find_elements(
                By.TAG_NAME, "line"
            )
            no_script_errors(driver)
            screenshot(driver, "serve_parse.png")
    finally:
        driver.quit()

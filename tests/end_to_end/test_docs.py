"""The documentation: README.md is a front page, every page under docs/ is linked from it, every
relative link leads to a file that exists, and every `s2s ...` command in a ```bash block is one
the command line accepts, with a preset that exists and overrides that load.

Fast: nothing is trained or read beyond the Markdown files, the presets and the config schema.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch (s2s.core.RUNTIME_ENV)

import re  # noqa: E402
import shlex  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import unquote  # noqa: E402

import pytest  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from s2s.core.apps.cli import build_parser  # noqa: E402
from s2s.core.setup.config import load_config, preset_names  # noqa: E402
from s2s.core.setup.registry import Registry  # noqa: E402
from conftest import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_CHARS = 12_000
#: docs/performance.md holds the current figures; their history is in bench/results and git
MAX_PERFORMANCE_CHARS = 15_000
SETUP = (
    "pip install torch==2.13.0 -e . && s2s quickstart",
    "pip install torch==2.13.0 -e '.[test,export]' && python -m pytest -q",
)

FENCE = re.compile(r"^(```|~~~)(\S*)[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# Words that stand for something the reader fills in. An override whose value holds one cannot be
# loaded and is skipped; a command line that needs one where the parser would reject it is skipped
# whole. Both lists are asserted small below.
PLACEHOLDER = re.compile(
    r"\b(?:RUN_DIR|RUN_DIR_OR_CHECKPOINT|DIR|FILE|PRESET|MEMBER|CKPT)\b|\.\.\.|\$"
)
SHELL_OPERATORS = {"&&", "||", "|", ";", "&"}
REDIRECTS = {"<", ">", ">>", "2>", "&>"}


def text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def prose(markdown: str) -> str:
    """The Markdown without its fenced code blocks and inline code spans (links there are not links)."""
    markdown = FENCE.sub("", markdown)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", markdown, flags=re.S)


def bash_blocks(markdown: str) -> list[tuple[int, str]]:
    """(line number of the block's first line, body) of every ```bash block."""
    return [
        (markdown.count("\n", 0, m.start(3)) + 1, m.group(3))
        for m in FENCE.finditer(markdown)
        if m.group(2) == "bash"
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {
        slug(h) for h in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", FENCE.sub("", text(page)), re.M)
    }


def links(page: Path) -> list[str]:
    return LINK.findall(prose(text(page)))


def commands(page: Path):
    """Every `s2s` command in the page's ```bash blocks: (where, the line, argv after `s2s`).

    Backslash continuations are joined; a line may hold several commands (`&&`, `|`, `;`), and
    redirections are dropped. `torchrun ... --no-python s2s ...` counts as `s2s ...`."""
    for first, body in bash_blocks(text(page)):
        lines = body.split("\n")
        n = 0
        while n < len(lines):
            start, line = n, lines[n]
            while line.endswith("\\") and n + 1 < len(lines):
                n += 1
                line = line[:-1] + " " + lines[n]
            n += 1
            lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
            segments, segment = [], []
            for token in tokens:
                if token in SHELL_OPERATORS:
                    segments.append(segment)
                    segment = []
                else:
                    segment.append(token)
            segments.append(segment)
            for segment in segments:
                words, skip = [], False
                for token in segment:  # drop `< FILE`, `> FILE`
                    if skip:
                        skip = False
                    elif token in REDIRECTS:
                        skip = True
                    else:
                        words.append(token)
                # torchrun's processes: `--no-python s2s ARGS`
                start_at = words.index("--no-python") + 1 if "--no-python" in words else 0
                argv = words[start_at + 1 :] if words[start_at : start_at + 1] == ["s2s"] else None
                if argv is not None:
                    yield f"{rel(page)}:{first + start}", line.strip(), argv


COMMANDS = [c for page in PAGES for c in commands(page)]


@pytest.fixture(scope="module")
def registry():
    return Registry.installed()


def test_readme_is_a_front_page():
    readme = text(README)
    assert len(readme) < MAX_README_CHARS, f"README.md has {len(readme):,} characters"
    first_bash = bash_blocks(readme)[0][1]
    for command in SETUP:  # the two set-up commands, exactly, in the first code block
        assert command in first_bash.splitlines(), command
    assert readme.index("```bash") < readme.index("\n## "), (
        "the set-up commands come before the first section"
    )
    for heading in ("Quickstart", "Commands", "Presets"):
        assert re.search(rf"^## {heading}$", readme, re.M), heading


def test_performance_page_gives_current_figures_each_with_its_command_and_result_file():
    page = text(README.parent / "docs" / "performance.md")
    assert len(page) < MAX_PERFORMANCE_CHARS, f"docs/performance.md has {len(page):,} characters"
    results = set(re.findall(r"bench/[a-z]+/results/[a-z0-9_.-]+\.json", page))
    assert results and all((README.parent / r).is_file() for r in results), results
    assert re.search(r"python (-m )?bench[./]", page), "no benchmark command named"


def test_every_docs_page_is_linked_from_the_readme():
    assert len(DOCS) >= 10, [rel(p) for p in DOCS]
    linked = {
        (README.parent / unquote(target.split("#")[0])).resolve()
        for target in links(README)
        if not SCHEME.match(target) and not target.startswith("#")
    }
    missing = [rel(p) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"docs pages not linked from README.md: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_leads_to_something_that_exists(page):
    found = links(page)
    assert found, f"{rel(page)} links nowhere (every docs page links back to README.md)"
    broken = []
    for target in found:
        if SCHEME.match(target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path)).resolve() if path else page.resolve()
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{rel(page)}: {broken}"


def test_the_command_lines_are_found_and_few_are_skipped():
    """Guards the tests below: they see the commands, and the placeholders they skip stay few."""
    pages = {where.split(":")[0] for where, _, _ in COMMANDS}
    assert len(COMMANDS) >= 25 and "README.md" in pages and len(pages) >= 6, (len(COMMANDS), pages)
    skipped_lines = [line for _, line, argv in COMMANDS if _unresolvable(argv)]
    skipped_overrides = [
        o for _, _, argv in COMMANDS for o in _overrides(argv) if PLACEHOLDER.search(o)
    ]
    assert len(skipped_lines) <= 2, skipped_lines
    assert len(skipped_overrides) <= 3, skipped_overrides


def _unresolvable(argv: list[str]) -> bool:
    """A line whose placeholders the parser cannot take as they are (none today)."""
    return any(re.fullmatch(r"\[.*|.*\]|<.*>|\$.*", a) for a in argv)


def _overrides(argv: list[str]) -> list[str]:
    return [a for a in argv[1:] if "=" in a and not a.startswith("-")]


@pytest.mark.parametrize("where, line, argv", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_command_line_parses(where, line, argv):
    if _unresolvable(argv):
        pytest.skip(f"placeholder the parser cannot take: {line}")
    try:
        args, unknown = build_parser().parse_known_args(argv)
    except SystemExit as e:
        pytest.fail(
            f"{where}: `s2s {shlex.join(argv)}` is rejected by the parser (exit {e.code}): {line}"
        )
    assert not unknown, f"{where}: arguments the parser does not know: {unknown} in {line}"
    assert args.command == argv[0]


TRAINING = [
    c for c in COMMANDS if c[2] and c[2][0] in ("train", "prepare") and not _unresolvable(c[2])
]


def test_training_commands_are_found():
    assert len(TRAINING) >= 15, [line for _, line, _ in TRAINING]


@pytest.mark.parametrize("where, line, argv", TRAINING, ids=[c[0] for c in TRAINING])
def test_preset_exists_and_its_overrides_load(where, line, argv, registry):
    args, _ = build_parser().parse_known_args(argv)
    preset = args.preset
    if "/" in preset or Path(preset).suffix in (".yaml", ".yml"):
        pytest.skip(f"a preset file of the reader's own: {preset}")
    assert preset in preset_names(), f"{where}: no preset {preset!r} ({line})"
    overrides = [o for o in args.overrides if not PLACEHOLDER.search(o)]
    try:
        cfg = load_config(preset, overrides, registry=registry)
    except Exception as e:  # ConfigError names the key; say where the line is
        pytest.fail(f"{where}: {line}: {type(e).__name__}: {e}")
    for override in overrides:  # each one took effect
        key, _, _ = override.partition("=")
        given, node = OmegaConf.from_dotlist([override]), cfg
        for part in key.split("."):
            given, node = given[part], node[part]
        assert getattr(node, "value", node) == given, f"{where}: {override} gave {node!r}"

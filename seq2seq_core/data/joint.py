"""Vocabularies shared by the members of a run (`multitask.shared_vocab`).

A task says what each side of its vocabulary is (`Task.shareable`: a tokenizer kind, the
languages it writes, a size). Sides of the same kind that write a language in common, across
members, are joined (transitively) into a group, and each group gets one vocabulary trained over
the group's training text, so that one English word is one embedding row in every task. Its
size is the largest its sides ask for. A side that joins no other member's keeps its own.

The text is temperature-sampled (Arivazhagan et al. 2019; Kudugunta et al. 2021 build their
shared vocabulary this way): member k, with n_k lines in the group, gives m_k = N q_k lines,
q_k proportional to n_k^(1/T), N = sum n_k, T = `multitask.vocab_temperature`. Each of its lines
goes in r_k = m_k / n_k times (the fraction drawn at random, seeded by run.seed), so that a member
100 times smaller than another is not 1% of the text but, at T = 5, 28%.

Each vocabulary is cached under data.cache_dir in `joint-KEY/` (KEY: the members' task sections
and the settings above) with the fingerprint of every file read for it, and rebuilt when one
changes. The sharing members' prepared data sits beneath it, in a folder named after the
vocabularies' hashes: a member prepared with a shared vocabulary never meets one prepared alone
or with another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import tempfile
from itertools import combinations
from pathlib import Path
from typing import Iterator

import numpy as np

from .. import files
from ..errors import DataError
from .cache import cache_key

log = logging.getLogger("s2s")
SIDES = ("src", "tgt")
FORMAT = 1
MANIFEST = "joint.json"
_BATCH = 1000


def assign(members: list) -> list[list[tuple[int, str]]]:
    """Set each member's `share` (side -> group number) and return the groups, each a list of
    (member index, side): sides of one tokenizer kind with a language in common, spanning at
    least two members."""
    nodes = [
        (k, side, kind)
        for k, m in enumerate(members)
        for side in SIDES
        if (kind := m.task.shareable(side)) is not None
    ]
    parent = list(range(len(nodes)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, j in combinations(range(len(nodes)), 2):
        a, b = nodes[i][2], nodes[j][2]
        if a.tokenizer == b.tokenizer and a.languages & b.languages:
            parent[root(i)] = root(j)
    joined: dict[int, list[tuple[int, str]]] = {}
    for i, (k, side, _) in enumerate(nodes):
        joined.setdefault(root(i), []).append((k, side))
    groups = [g for g in joined.values() if len({k for k, _ in g}) > 1]
    for m in members:
        m.share = {}
    for number, group in enumerate(groups):
        for k, side in group:
            members[k].share[side] = number
    return groups


def rates(lines: list[int], temperature: float) -> np.ndarray:
    """r_k: how many times each of member k's n_k lines goes into the joint text, so that member
    k gives N q_k of its N = sum n lines, q_k proportional to n_k^(1/T)."""
    n = np.asarray(lines, dtype=np.float64)
    q = n ** (1.0 / temperature)
    return q / q.sum() * n.sum() / n


def sampled(paths: list[Path], r: np.ndarray, seed: int) -> Iterator[list[str]]:
    """Batches of the lines of each file, each line r_k times (the fraction drawn at random)."""
    rng = np.random.default_rng(seed)
    batch: list[str] = []
    for path, rate in zip(paths, r):
        whole, part = math.floor(rate), rate - math.floor(rate)
        with open(path, encoding="utf-8", newline="\n") as f:
            for line in f:
                batch.extend([line.rstrip("\n")] * (whole + int(rng.random() < part)))
                if len(batch) >= _BATCH:
                    yield batch
                    batch = []
    if batch:
        yield batch


def _spec(members, groups, cfg, data_cfg) -> dict:
    return {
        "format": FORMAT,
        "temperature": cfg.multitask.vocab_temperature,
        "seed": cfg.run.seed,
        "groups": [[[cache_key(members[k].task, data_cfg), side] for k, side in g] for g in groups],
    }


def _valid(root: Path, n: int) -> dict | None:
    """The manifest of the cached vocabularies, if every file in it and every input is as
    recorded."""
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
        for name, digest in manifest["files"].items():
            if files.sha256(root / name) != digest:
                return None
        for path, seen in manifest["inputs"].items():
            if files.fingerprint(path) != seen:
                log.warning("the shared vocabularies in %s are rebuilt: %s changed", root, path)
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return manifest if len(manifest["files"]) == n else None


def _train(members, group, temperature: float, seed: int, tmp: Path):
    """One group's vocabulary, trained over its members' sampled training text."""
    paths, counts = [], []
    for k in sorted({k for k, _ in group}):
        sides = [SIDES.index(s) for kk, s in group if kk == k]
        path = tmp / f"{k}.txt"
        n = 0
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for pair in members[k].task.read_split("train"):
                for i in sides:
                    f.write(pair[i].replace("\n", " ") + "\n")
                    n += 1
        if n == 0:
            raise DataError(
                f"task {members[k].name!r} has no training text for the shared vocabulary"
            )
        paths.append(path)
        counts.append(n)
    r = rates(counts, temperature)
    kinds = [members[k].task.shareable(side) for k, side in group]
    size = max(kind.size for kind in kinds)
    shares = ", ".join(
        f"{members[k].name} {100 * c * x / sum(np.multiply(counts, r)):.1f}%"
        for k, c, x in zip(sorted({k for k, _ in group}), counts, r)
    )
    log.info(
        "shared vocabulary (%s, %s, %d tokens) of %s; its text (vocab_temperature %g): %s",
        kinds[0].tokenizer,
        "+".join(sorted(set().union(*(kd.languages for kd in kinds)))),
        size,
        ", ".join(f"{members[k].name}.{side}" for k, side in group),
        temperature,
        shares,
    )
    return kinds[0].train(sampled(paths, r, seed), size)


def build(members: list, groups: list, cfg, data_cfg) -> Path:
    """Every group's vocabulary, trained or read from the cache, given to its members' tasks
    (`Task.joint`); returns the folder under which the sharing members' data is prepared."""
    spec = _spec(members, groups, cfg, data_cfg)
    key = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(data_cfg.cache_dir) / f"joint-{key}"
    kinds = [members[g[0][0]].task.shareable(g[0][1]) for g in groups]
    names = [f"group{i}.json" for i in range(len(groups))]
    manifest = _valid(root, len(groups))
    if manifest is None:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DataError(
                f"data.cache_dir {data_cfg.cache_dir} is not writable: {e.strerror or e}"
            ) from None
        with (
            files.recording(exclude=[root]) as inputs,
            tempfile.TemporaryDirectory(dir=root, prefix=".text") as tmp,
        ):
            for i, group in enumerate(groups):
                _train(
                    members, group, cfg.multitask.vocab_temperature, cfg.run.seed, Path(tmp)
                ).save(root / names[i])
        manifest = {
            "spec": spec,
            "files": {n: files.sha256(root / n) for n in names},
            "inputs": {p: files.fingerprint(p) for p in sorted(inputs)},
        }
        files.atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=1))
    vocabs = [kind.load(root / name) for kind, name in zip(kinds, names)]
    for m in members:
        m.task.joint = {side: vocabs[g] for side, g in m.share.items()}
    digest = hashlib.sha1("".join(manifest["files"][n] for n in names).encode()).hexdigest()[:12]
    return root / f"data-{digest}"

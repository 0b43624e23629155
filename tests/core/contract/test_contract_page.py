"""docs/contract.md names every public name of `s2s.core` (its `__all__`) in a heading of its
own, and no name that is not exported: the page a plugin author reads is the whole contract."""

from __future__ import annotations

import re

import s2s.core
from conftest import ROOT


def test_the_contract_page_names_every_exported_name_and_no_other():
    text = (ROOT / "docs" / "contract.md").read_text(encoding="utf-8")
    headings = re.findall(r"^### (.+)$", text, re.M)
    documented = {name for h in headings for name in re.findall(r"`([A-Za-z_][\w]*)`", h)}
    exported = set(s2s.core.__all__)
    assert not exported - documented, f"exported, not on docs/contract.md: {exported - documented}"
    assert not documented - exported, f"on docs/contract.md, not exported: {documented - exported}"
    for name in exported:
        assert hasattr(s2s.core, name), name

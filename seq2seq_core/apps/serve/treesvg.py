"""A bracketed tree drawn as SVG, for the page `s2s serve` shows.

The engine knows no task, so it draws any output line that reads as one bracketed tree: the Penn
Treebank's `(S (NP (DT The) (NN dog)) (VP ...))` (the parsing task's output) and the demo's
`(S (NP the dog )NP ... )S`, whose closing brackets repeat their label. A line that is not one
well-formed tree (a translation, a tree with a stray bracket) is not drawn.

Layout: the words sit on the bottom row in their order, each as wide as its text (or its tag's,
when the tag is wider); a phrase sits centred over its first and last child, one row above its
highest child.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape

#: an opening bracket with its label, a closing bracket with its (optional) label, or a word
TOKEN = re.compile(r"\(([^\s()]*)|\)([^\s()]*)|([^\s()]+)")

CHAR_W, FONT, ROW_H, GAP, PAD = (
    7.8,
    13,
    44,
    14,
    10,
)  # pixels: a character, the font, a row, between words, margin


@dataclass
class Node:
    label: str
    children: list = field(default_factory=list)  # Nodes and words (str)
    x: float = 0.0
    row: int = 0


def parse(line: str) -> Node | None:
    """The tree a line brackets, or None when it is not exactly one well-formed tree."""
    text = line.strip()
    if not text.startswith("("):
        return None
    stack: list[Node] = []
    root = None
    for m in TOKEN.finditer(text):
        opening, closing, word = m.groups()
        if root is not None:
            return None  # something after the tree closed
        if opening is not None:
            node = Node(opening)
            if stack:
                stack[-1].children.append(node)
            stack.append(node)
        elif closing is not None:
            if not stack or (closing and closing != stack[-1].label):
                return None
            node = stack.pop()
            if not stack:
                root = node
        else:
            if not stack:
                return None
            stack[-1].children.append(word)
    if root is None or stack:
        return None
    if not root.label and len(root.children) == 1 and isinstance(root.children[0], Node):
        root = root.children[0]  # the treebank's unlabelled outer bracket "( (S ...))"
    return root


def svg(tree: Node) -> str:
    """The tree as a standalone <svg> element (class "tree"), sized to its contents."""
    words: list[tuple[str, float, Node]] = []  # (word, x, the phrase it hangs from)
    cursor = [float(PAD)]

    def place(node: Node, row: int) -> int:
        """Lays out `node`'s subtree with `node` at `row` counted from the top; returns its
        height."""
        node.row = row
        xs, height = [], 1
        for child in node.children:
            if isinstance(child, Node):
                height = max(height, 1 + place(child, row + 1))
                xs.append(child.x)
            else:
                width = CHAR_W * max(len(child), len(node.label)) + GAP
                xs.append(cursor[0] + width / 2)
                words.append((child, xs[-1], node))
                cursor[0] += width
        if not xs:  # an empty phrase "(X )": a slot of its own
            width = CHAR_W * len(node.label) + GAP
            xs.append(cursor[0] + width / 2)
            cursor[0] += width
        node.x = (xs[0] + xs[-1]) / 2
        return height

    bottom = place(tree, 0)  # the words' row

    def y(row: int) -> float:
        """The baseline of a row's text."""
        return PAD + FONT + row * ROW_H

    edges, texts = [], []

    def draw(node: Node) -> None:
        texts.append(_text(node.x, y(node.row), node.label, "label"))
        for child in node.children:
            if isinstance(child, Node):
                edges.append((node.x, node.row, child.x, child.row))
                draw(child)

    draw(tree)
    for word, x, parent in words:
        edges.append((parent.x, parent.row, x, bottom))
        texts.append(_text(x, y(bottom), word, "word"))
    lines = "".join(
        f'<line x1="{x1:.1f}" y1="{y(r1) + 5:.1f}" x2="{x2:.1f}" y2="{y(r2) - FONT:.1f}"/>'
        for x1, r1, x2, r2 in edges
    )
    width, height = cursor[0] + PAD, y(bottom) + PAD
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tree" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" '
        f'font-size="{FONT}"><g stroke="#8a8a8a" stroke-width="1">{lines}</g>{"".join(texts)}</svg>'
    )


def _text(x: float, y: float, text: str, kind: str) -> str:
    style = 'fill="#1f4e8c" font-weight="bold"' if kind == "label" else 'fill="#111"'
    return (
        f'<text class="{kind}" x="{x:.1f}" y="{y:.1f}" text-anchor="middle" '
        f"{style}>{escape(text)}</text>"
    )

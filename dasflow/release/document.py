"""A tiny document model rendered to Markdown and to a self-contained HTML page.

The certificate and the accuracy report are built once as a list of blocks and rendered twice, so the two
formats can never disagree. The HTML page has inline CSS and images as ``data:`` URIs only: it loads nothing
from the network and can be archived as one file.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    text: str
    strong: bool = False


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Image:
    """An image embedded as base64 (``alt`` is the caption; ``mime``: PNG, or SVG for the charts drawn
    without matplotlib)."""

    data_base64: str
    alt: str
    mime: str = "image/png"


Block = Heading | Para | Bullets | Table | Image


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: Sequence[Block]) -> str:
    """GitHub-flavoured Markdown (images as inline data URIs)."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            out += [f"**{b.text}**" if b.strong else b.text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {item}" for item in b.items] + [""]
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
            out.append("|" + "---|" * len(b.header))
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        else:
            out += [f"![{b.alt}](data:{b.mime};base64,{b.data_base64})", ""]
    return "\n".join(out).rstrip("\n") + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;max-width:1100px;
color:#1b1b1b;padding:0 1em}
h1{font-size:1.6em;border-bottom:2px solid #205493;padding-bottom:.2em}h2{font-size:1.25em;color:#205493}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:.85em}
th,td{border:1px solid #c8c8c8;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#eef2f7}tr:nth-child(even) td{background:#fafafa}
code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.95em}
.banner{background:#b50909;color:#fff;font-weight:bold;padding:.6em 1em;margin-bottom:1em}
figure{margin:1em 0}figcaption{font-size:.85em;color:#555}img{max-width:100%;height:auto}
"""


def _inline(text: str) -> str:
    """Escape, then render ``code`` spans (the only inline markup the documents use)."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def to_html(blocks: Sequence[Block], title: str, banner: str | None = None) -> str:
    """A self-contained HTML5 page; ``banner`` (e.g. the test-release notice) is the first thing shown."""
    body: list[str] = []
    if banner:
        body.append(f'<div class="banner" id="banner">{_inline(banner)}</div>')
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{_inline(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            text = _inline(b.text)
            body.append(f"<p><strong>{text}</strong></p>" if b.strong else f"<p>{text}</p>")
        elif isinstance(b, Bullets):
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{_inline(h)}</th>" for h in b.header)
            rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        else:
            body.append(f'<figure><img class="plot" alt="{html.escape(b.alt)}" '
                        f'src="data:{b.mime};base64,{b.data_base64}"><figcaption>{_inline(b.alt)}'
                        "</figcaption></figure>")
    full_title = (f"{banner} — " if banner else "") + title
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(full_title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")

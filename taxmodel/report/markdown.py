"""Render a report Document as Markdown, with the figures as PNG files beside the .md.

For places that render Markdown (GitHub/GitLab comments, wikis, CI summaries): image links are
relative file names, tables are GitHub-flavoured pipe tables.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from taxmodel.report.document import Bullets, Document, Figure, Heading, Paragraph, Table, figure_png


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _table(t: Table) -> list[str]:
    lines = ["| " + " | ".join(_cell(c) for c in t.columns) + " |",
             "|" + "|".join("---:" if n else ":---" for n in t.numeric) + "|"]
    for i, row in enumerate(t.rows):
        cells = [_cell(v) for v in row]
        if t.total_last and i == len(t.rows) - 1:
            cells = [f"**{c}**" if c else c for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    if t.caption:
        lines += ["", f"*{_cell(t.caption)}*"]
    return lines


def figure_file_name(md_path: Path, fig: Figure) -> str:
    """``report.md`` -> ``report-<figure>.png`` (no spaces or odd characters, so the link needs no quoting)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{md_path.stem}-{fig.name}.png")


def render_markdown(doc: Document, md_path: str | os.PathLike, *, dpi: int = 130) -> str:
    """Write the figures beside ``md_path`` and return the Markdown text (the caller writes it)."""
    md_path = Path(md_path)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# {doc.title}", ""]
    for block in doc.blocks:
        if isinstance(block, Heading):
            lines += ["#" * min(max(block.level, 2), 6) + " " + block.text, ""]
        elif isinstance(block, Paragraph):
            lines += [f"> **{block.text}**" if block.emphasis else block.text, ""]
        elif isinstance(block, Bullets):
            lines += [f"- {item}" for item in block.items] + [""]
        elif isinstance(block, Table):
            lines += _table(block) + [""]
        elif isinstance(block, Figure):
            name = figure_file_name(md_path, block)
            tmp = md_path.parent / f".{name}.tmp"
            tmp.write_bytes(figure_png(block.figure, dpi))
            os.replace(tmp, md_path.parent / name)
            lines += [f"![{block.alt}]({name})", "", f"*{block.caption}*", ""]
        else:  # pragma: no cover - the Block union is closed
            raise TypeError(f"unknown block {type(block).__name__}")
    return "\n".join(lines)

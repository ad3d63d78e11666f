"""Render a report Document as Markdown, with the figures as PNG files in a folder beside the .md.

For places that render Markdown (GitHub/GitLab comments, wikis, CI summaries): image links are
relative file names, tables are GitHub-flavoured pipe tables.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from taxmodel import safetext
from taxmodel.fsutil import atomic_write, make_dirs, temp_stem
from taxmodel.report.blocks import Bullets, Document, Figure, Heading, Paragraph, Table, figure_png


escape_text = safetext.markdown
"""Text as it should read, never as Markdown (the one sanitizer of names for Markdown, shared
with ``taxmodel compare --markdown``): a bundle-supplied name cannot become a link, an image
fetched from elsewhere, HTML, or a heading."""


def _cell(text: str) -> str:
    return escape_text(text)


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


def figure_dir(md_path: Path) -> Path:
    """``report.md`` -> ``report-figures/`` beside it: the report's figures in a folder of its own,
    not loose in the report's directory (no spaces or odd characters: links need no quoting; within
    NAME_MAX whatever the report's legal name, as ``fsutil.temp_stem`` shortens it)."""
    return md_path.parent / temp_stem(re.sub(r"[^A-Za-z0-9_.-]", "_", f"{md_path.stem}-figures"))


def figure_file_name(md_path: Path, fig: Figure) -> str:
    """The link to a figure from the report: ``report-figures/<figure>.png``, the name shortened
    like a temporary's (``fsutil.temp_stem``) so that it stays within NAME_MAX whatever the figure's."""
    return f"{figure_dir(md_path).name}/" + temp_stem(re.sub(r"[^A-Za-z0-9_.-]", "_", fig.name)) + ".png"


def render_markdown(doc: Document, md_path: str | os.PathLike, *, dpi: int = 130,
                    written: list[Path] | None = None) -> str:
    """Write the figures into ``figure_dir(md_path)`` and return the Markdown text (the caller
    writes it); each figure file written is appended to ``written``."""
    md_path = Path(md_path)
    make_dirs(md_path.parent, "report")
    lines = [f"# {escape_text(doc.title)}", ""]
    for block in doc.blocks:
        if isinstance(block, Heading):
            lines += ["#" * min(max(block.level, 2), 6) + " " + escape_text(block.text), ""]
        elif isinstance(block, Paragraph):
            lines += [f"> **{escape_text(block.text)}**" if block.emphasis else escape_text(block.text), ""]
        elif isinstance(block, Bullets):
            lines += [f"- {escape_text(item)}" for item in block.items] + [""]
        elif isinstance(block, Table):
            lines += _table(block) + [""]
        elif isinstance(block, Figure):
            name = figure_file_name(md_path, block)
            make_dirs(figure_dir(md_path), "report figures")
            path = atomic_write(md_path.parent / name, figure_png(block.figure, dpi), what="figure")
            if written is not None:
                written.append(path)
            lines += [f"![{escape_text(block.alt)}]({name})", "", f"*{escape_text(block.caption)}*", ""]
        else:  # pragma: no cover - the Block union is closed
            raise TypeError(f"unknown block {type(block).__name__}")
    return "\n".join(lines)

"""The blocks a report is made of (headings, paragraphs, bullet lists, tables of pre-formatted
strings, matplotlib figures) and the document that lists them: the small document model that
``document`` assembles, sections such as ``advice`` contribute to, and ``html``/``markdown`` render.
"""
from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Union

import pandas as pd

if TYPE_CHECKING:  # the figures come from report.figures; this module does not draw
    from matplotlib.figure import Figure as MplFigure


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Paragraph:
    text: str
    emphasis: bool = False  # the headline: rendered prominently


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    numeric: list[bool]  # right-align these columns
    caption: str = ""
    total_last: bool = False  # the last row is a total: rendered in bold


@dataclass
class Figure:
    figure: MplFigure
    name: str  # file-name stem, unique within the document
    caption: str
    alt: str


Block = Union[Heading, Paragraph, Bullets, Table, Figure]


@dataclass
class Document:
    title: str
    blocks: list[Block] = field(default_factory=list)

    def add(self, *blocks: Block) -> None:
        self.blocks.extend(blocks)

    @property
    def figures(self) -> list[Figure]:
        return [b for b in self.blocks if isinstance(b, Figure)]


def format_number(value: object) -> str:
    """Cell text: floats with 2 decimals (10 ns resolution for us), everything else as str; NaN as an empty cell."""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        text = f"{value:,.2f}"
        return "0.00" if text == "-0.00" else text
    return str(value)


def table_from_frame(frame: pd.DataFrame, caption: str = "", total_last: bool = False, missing: str = "") -> Table:
    """``missing``: the text of NaN cells (the ledger's "n/m" for a tax that was not measured)."""
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    rows = [[missing if isinstance(v, float) and math.isnan(v) else format_number(v) for v in row]
            for row in frame.itertuples(index=False, name=None)]
    return Table([str(c) for c in frame.columns], rows, numeric, caption, total_last)


def figure_png(fig: MplFigure, dpi: int = 130) -> bytes:
    """PNG bytes of a figure (white background, so it reads on dark-themed pages too)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


def slug(text: str) -> str:
    """A file-name stem made of the text's letters and digits (figure names)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "figure"

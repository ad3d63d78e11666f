"""Render a report Document as one self-contained HTML file.

Self-contained because reports are mailed, attached to CI runs and opened offline: figures are
embedded as base64 PNG, the stylesheet is inline, and there is no script and no external URL.
"""
from __future__ import annotations

import base64
import html

from taxmodel.report import style
from taxmodel.report.blocks import Bullets, Document, Figure, Heading, Paragraph, Table, figure_png

_CSS = f"""
body {{ font-family: "Liberation Sans", Arial, Helvetica, sans-serif; color: {style.TEXT_COLOR};
       max-width: 1180px; margin: 2em auto; padding: 0 1em; line-height: 1.45; background: #ffffff; }}
h1 {{ font-size: 1.6em; border-bottom: 2px solid {style.CATEGORY_COLORS['bsp_tax']}; padding-bottom: .2em; }}
h2 {{ font-size: 1.3em; margin-top: 1.8em; }}
h3 {{ font-size: 1.1em; margin-top: 1.4em; }}
p.headline {{ font-size: 1.1em; background: #f3f7fa; border-left: 5px solid {style.CATEGORY_COLORS['bsp_tax']};
             padding: .6em .9em; }}
table {{ border-collapse: collapse; margin: .6em 0 1.2em; font-size: .9em; }}
caption {{ caption-side: bottom; text-align: left; color: #555; font-size: .9em; padding-top: .3em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: .25em .7em; text-align: left; vertical-align: top; }}
th {{ background: #f2f2f2; }}
td.num, th.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
tr.total td {{ font-weight: bold; border-top: 2px solid #888; }}
figure {{ margin: 1em 0 1.6em; }}
figure img {{ max-width: 100%; height: auto; border: 1px solid #eee; }}
figcaption {{ color: #555; font-size: .9em; }}
"""


def render_html(doc: Document, *, dpi: int = 130) -> str:
    """The whole page as a string."""
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{e(doc.title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>", f"<h1>{e(doc.title)}</h1>"]
    for block in doc.blocks:
        if isinstance(block, Heading):
            level = min(max(block.level, 2), 6)
            out.append(f"<h{level}>{e(block.text)}</h{level}>")
        elif isinstance(block, Paragraph):
            cls = ' class="headline"' if block.emphasis else ""
            out.append(f"<p{cls}>{e(block.text)}</p>")
        elif isinstance(block, Bullets):
            out.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, Table):
            out.append(_table(block))
        elif isinstance(block, Figure):
            data = base64.b64encode(figure_png(block.figure, dpi)).decode("ascii")
            out.append(f'<figure id="{e(block.name)}"><img src="data:image/png;base64,{data}" alt="{e(block.alt)}">'
                       f"<figcaption>{e(block.caption)}</figcaption></figure>")
        else:  # pragma: no cover - the Block union is closed
            raise TypeError(f"unknown block {type(block).__name__}")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


def _table(t: Table) -> str:
    e = html.escape
    head = "".join(f'<th{" class=num" if n else ""}>{e(c)}</th>' for c, n in zip(t.columns, t.numeric))
    body = []
    for i, row in enumerate(t.rows):
        cls = ' class="total"' if t.total_last and i == len(t.rows) - 1 else ""
        cells = "".join(f'<td{" class=num" if n else ""}>{e(v)}</td>' for v, n in zip(row, t.numeric))
        body.append(f"<tr{cls}>{cells}</tr>")
    caption = f"<caption>{e(t.caption)}</caption>" if t.caption else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"

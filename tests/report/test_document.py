"""One document model, two renderings: HTML self-contained, Markdown with PNGs beside it, and
both saying the same things."""
import base64
import io
import re

import pytest
from PIL import Image

from taxmodel.report import blocks, document, headline
from taxmodel.report.build import report_format, write_report
from taxmodel.report.html import render_html
from taxmodel.report.markdown import escape_text, render_markdown


@pytest.fixture(scope="module")
def doc(real_cases):
    return document.build_document(real_cases)


@pytest.fixture(scope="module")
def html(doc):
    return render_html(doc, dpi=40)


@pytest.fixture(scope="module")
def md(doc, tmp_path_factory):
    md_path = tmp_path_factory.mktemp("md") / "my report.md"
    return md_path, render_markdown(doc, md_path, dpi=40)


def test_document_reading_order_and_content(doc, real_cases):
    headings = [b.text for b in doc.blocks if isinstance(b, blocks.Heading)]
    assert headings[0] == "Headline"
    assert headings[-2:] == ["Caveats", "Runs"]
    assert "ag_gemm: sweep over problem size" in headings
    assert "Inside fused kernels" in headings
    names = [f.name for f in doc.figures]
    assert len(names) == len(set(names))
    # ledger bars, 2 timelines (one per size), sweep, what fusing would buy, 2 CTA views (fused bundles)
    assert len(names) == 7
    assert "What fusing would buy" in headings and "what-fusing-would-buy" in names
    sentences = [b.text for b in doc.blocks if isinstance(b, blocks.Paragraph) and b.emphasis]
    assert sentences == headline.headlines([led for _, led in real_cases])


def test_caveats_include_ledger_caveats_and_unattributed(real_cases, fake_cases):
    cav = document.caveats([led for _, led in real_cases])
    assert any("datasheet" in c for c in cav)
    assert sum("datasheet" in c for c in cav) == len(real_cases)  # not repeated by the report
    from fake_ledger import ledger_from_parts

    led = ledger_from_parts("bsp", {"useful": 9_000, "unattributed": 1_000})
    assert any("1.0 us per iteration (10.0%) is unattributed" in c for c in document.caveats([led]))
    fake = fake_cases[0][1]
    assert any("uncertainty 2.0 us" in c for c in document.caveats([fake]))


def test_metadata_table_lists_device_versions_date(fake_cases):
    t = document.metadata_table(fake_cases[:1])
    row = t.iloc[0]
    assert row["device"] == "NVIDIA H200"
    assert row["versions"] == "torch 2.11.0, triton 3.6.0"
    assert row["date"] == "2026-11-22T10:00:00Z" and row["repetitions"] == "1" and row["iterations"] == "3"


def test_html_is_self_contained(doc, html):
    assert "<script" not in html and "<link" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "url(" not in html
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == len(doc.figures)
    for data in images:
        Image.open(io.BytesIO(base64.b64decode(data))).verify()
    assert html.count("<table>") == sum(isinstance(b, blocks.Table) for b in doc.blocks)


def test_markdown_writes_pngs_beside_and_links_them(doc, md):
    md_path, text = md
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == len(doc.figures)
    for link in links:
        assert " " not in link and link.startswith("my_report-figures/") and link.count("/") == 1
        Image.open(md_path.parent / link).verify()
    assert not list(md_path.parent.glob("*.png")), "figures loose beside the report"


def test_html_and_markdown_say_the_same(doc, html, md):
    """Every table cell and sentence of the document appears in both renderings."""
    import html as html_mod

    md = md[1]

    for block in doc.blocks:
        if isinstance(block, blocks.Table):
            for row in block.rows:
                for cell in row:
                    assert html_mod.escape(cell) in html
                    assert escape_text(cell) in md
        elif isinstance(block, (blocks.Paragraph, blocks.Heading)):
            assert html_mod.escape(block.text) in html and escape_text(block.text) in md


def test_write_report_picks_format_and_is_atomic(real_cases, tmp_path):
    assert report_format(tmp_path / "x.md", None) == "md"
    assert report_format(tmp_path / "x.html", None) == "html"
    assert report_format(tmp_path / "x.md", "html") == "html"
    out = write_report(real_cases[:2], tmp_path / "r.html")
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temp files left


def test_number_format():
    assert blocks.format_number(1234.5678) == "1,234.57"
    assert blocks.format_number(-0.001) == "0.00"
    assert blocks.format_number(float("nan")) == ""
    assert blocks.format_number("x") == "x"


def test_a_figure_that_cannot_be_drawn_leaves_a_sentence(fake_cases):
    """A ledger with no iteration in repetition 0 has no timeline; the report says so and goes on."""
    bundle, led = fake_cases[0]
    import dataclasses

    odd = dataclasses.replace(led, windows=led.windows.assign(repetition=1))
    doc = document.build_document([(bundle, odd)])
    notes = [b.text for b in doc.blocks if isinstance(b, blocks.Paragraph) and b.text.startswith("Figure not drawn")]
    assert len(notes) == 1 and "no iterations in repetition 0" in notes[0]
    assert any(isinstance(b, blocks.Figure) for b in doc.blocks)  # the ledger bars are still there


def test_what_fusing_would_buy_lists_each_bundles_candidates(doc, real_cases):
    from taxmodel.report.advice import TERMINAL_COLUMNS

    i = next(j for j, b in enumerate(doc.blocks) if isinstance(b, blocks.Heading) and b.text == "What fusing would buy")
    tables = []
    for b in doc.blocks[i + 1:]:
        if isinstance(b, blocks.Heading) and b.level == 2:
            break
        if isinstance(b, blocks.Table):
            tables.append(b)
    assert tables and all(t.columns == TERMINAL_COLUMNS for t in tables)
    # the synthetic bsp bundles hold an all-gather and its GEMM
    assert any(row[0] == "AG+GEMM" for t in tables for row in t.rows)

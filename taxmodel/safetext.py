"""Names from traces, shown safely: one sanitizer per place a name can end up.

Kernel, op, file and meta names come from files anyone can write, and each place taxmodel shows
them has its own way of being hijacked:

* a terminal obeys escape sequences: OSC 52 writes the clipboard, CSI 2J clears the screen, a
  carriage return overwrites a line that was printed (``terminal``);
* Markdown (a pull-request comment, a CI job summary) renders headings, images, links and HTML
  from text (``markdown``, ``markdown_code``);
* XML 1.0 (JUnit) cannot hold most control characters at all: one makes the file invalid
  (``xml``);
* matplotlib reads ``$...$`` in a label as mathtext, and an unbalanced or unknown command stops
  the figure (``MATPLOTLIB_RC`` turns that parsing off).

Every function keeps printable text as it is and shows what it removes, so that two names that
differ only in a control character still differ on screen (``\\x1b`` for ESC, ``\\u202e`` for a
bidirectional override). This module is at the bottom layer (no imports of the package).
"""
from __future__ import annotations

import re

# C0 and C1 control characters and DEL, except tab and newline (a caller decides about those),
# plus the Unicode format characters that reorder or hide text (bidirectional overrides,
# zero-width joiners, BOM): the "Trojan Source" family.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
_CONTROL_NL = re.compile(_CONTROL.pattern[:-1] + r"\n\t]")
# XML 1.0: #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF]
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _visible(m: re.Match) -> str:
    c = m.group()
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def terminal(text: object, *, keep_newlines: bool = True) -> str:
    """``text`` with every control character (ESC, CR, BEL, C1 CSI, ...) and every text-reordering
    format character shown as an escape (``\\x1b``), so a terminal prints it and obeys nothing.
    Tabs and (unless ``keep_newlines`` is false) newlines pass."""
    s = str(text)
    pattern = _CONTROL if keep_newlines else _CONTROL_NL
    return pattern.sub(_visible, s) if pattern.search(s) else s


def name(text: object) -> str:
    """One name on one line: ``terminal`` with newlines and tabs shown as escapes too."""
    return terminal(text, keep_newlines=False)


_MD_SPECIAL = re.compile(r"([\\`*_\[\]#!|<>&~$:@])")


def markdown(text: object) -> str:
    """``text`` as literal Markdown inline text: one line, every character that (GitHub-flavoured)
    Markdown or the HTML it allows would act on inside a line backslash-escaped, so a name cannot
    open an image, a link or autolink (``:``), a table cell, a code span, emphasis, math (``$``),
    an HTML tag or a mention (``@``)."""
    s = terminal(" ".join(str(text).split()))  # a line break would start a heading or a list
    return _MD_SPECIAL.sub(r"\\\1", s)


def markdown_code(text: object) -> str:
    """``text`` inside an inline code span: one line, with a fence longer than any run of
    backticks inside it, and ``|`` escaped so that it stays in its table cell."""
    s = name(text).replace("|", "\\|")
    longest = max((len(r) for r in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s.strip() else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def xml(text: object) -> str:
    """``text`` without what XML 1.0 cannot hold (shown as escapes instead), and with the
    reordering format characters shown too; ElementTree escapes ``<``/``&`` itself."""
    s = str(text)
    s = _NOT_XML.sub(_visible, s) if _NOT_XML.search(s) else s
    return terminal(s)


MATPLOTLIB_RC: dict[str, object] = {"text.parse_math": False}
"""matplotlib settings under which every label, title and tick is literal text: a ``$`` in a kernel
name never starts mathtext (an unknown command in it would stop the figure). Figures are made
inside ``matplotlib.rc_context`` with these (``report.style.RC_PARAMS`` includes them)."""

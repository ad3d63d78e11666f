"""How GPU names are compared: lower case, punctuation and spaces as single spaces."""
from __future__ import annotations

import re


def normalized_name(name: str) -> str:
    """A GPU name as presets are matched: lower case, punctuation and spaces as single spaces."""
    return re.sub(r"[^a-z0-9]+", " ", name.lower()).strip()

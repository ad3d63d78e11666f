"""One look for every figure: colour = ledger category, lightness + hatch = its sub-part.

Why this scheme: a reader learns one colour per category (all blues are the bulk-synchronous
tax, all oranges the launch tax, ...) and can still tell sub-parts apart by lightness and
hatching, which survives colour-blindness and black-and-white printing. Category hues are the
Okabe-Ito palette (Okabe & Ito 2008), designed to stay distinct under the common colour-vision
deficiencies. Kernels themselves are drawn in greys so that colour always means "ledger".
"""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # figures are rendered to files, never to a screen

from matplotlib import colors as mcolors  # noqa: E402

from taxmodel import safetext  # noqa: E402
from taxmodel.ledger.categories import CATEGORIES, LABELS, SUBCATEGORY_ORDER  # noqa: E402

OKABE_ITO: dict[str, str] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}

CATEGORY_COLORS: dict[str, str] = {
    "useful": OKABE_ITO["bluish_green"],
    "compute_inefficiency": OKABE_ITO["yellow"],
    "locality_tax": OKABE_ITO["reddish_purple"],
    "bsp_tax": OKABE_ITO["blue"],
    "launch_tax": OKABE_ITO["vermillion"],
    "unattributed": "#9E9E9E",
}

# Lightness steps for the sub-parts of one category: 0 is the category colour itself, negative
# darkens (mix with black), positive lightens (mix with white). Chosen so neighbours in a stack
# differ clearly in lightness even in greyscale.
_SHADE_STEPS: dict[int, tuple[float, ...]] = {
    1: (0.0,),
    2: (0.0, 0.5),
    3: (-0.3, 0.15, 0.55),
    4: (-0.35, 0.0, 0.35, 0.65),
    5: (-0.4, -0.1, 0.2, 0.45, 0.7),
}
_HATCHES: tuple[str, ...] = ("", "//", "..", "xx", "\\\\")

EDGE_COLOR = "#333333"
TEXT_COLOR = "#222222"
GRID_COLOR = "#DDDDDD"

# Kernel roles (timeline lanes): greys with hatching, so they never compete with ledger colours.
ROLE_STYLES: dict[str, dict[str, str]] = {
    "compute": {"color": "#4D4D4D", "hatch": ""},
    "comm": {"color": "#BDBDBD", "hatch": "///"},
    "fused": {"color": "#7F7F7F", "hatch": "xx"},
    "copy": {"color": "#E0E0E0", "hatch": ".."},
    "other": {"color": "#F2F2F2", "hatch": ""},
}

# Variant lines in sweeps: the reference (bsp) is always black and solid; the others take
# distinct markers and dashes (shape, not only colour, tells them apart).
REFERENCE_VARIANT = "bsp"
_VARIANT_CYCLE: tuple[tuple[str, str, str], ...] = (
    (OKABE_ITO["orange"], "o", "--"),
    (OKABE_ITO["sky_blue"], "s", "-."),
    (OKABE_ITO["reddish_purple"], "^", ":"),
    (OKABE_ITO["bluish_green"], "D", (0, (5, 1, 1, 1))),
    (OKABE_ITO["vermillion"], "v", (0, (1, 1))),
)


@dataclass(frozen=True)
class PartStyle:
    """How one ledger sub-category is drawn."""

    color: str
    hatch: str
    label: str


def _shade(hex_color: str, step: float) -> str:
    if step == 0:
        return hex_color
    rgb = mcolors.to_rgb(hex_color)
    target = (1.0, 1.0, 1.0) if step > 0 else (0.0, 0.0, 0.0)
    t = abs(step)
    return mcolors.to_hex(tuple(c + (g - c) * t for c, g in zip(rgb, target)))


def _build_part_styles() -> dict[str, PartStyle]:
    styles: dict[str, PartStyle] = {}
    for category, subs in CATEGORIES.items():
        steps = _SHADE_STEPS[len(subs)]
        for i, sub in enumerate(subs):
            styles[sub] = PartStyle(_shade(CATEGORY_COLORS[category], steps[i]), _HATCHES[i], LABELS[sub])
    return styles


PART_STYLES: dict[str, PartStyle] = _build_part_styles()
"""Style of every sub-category (keys: categories.SUBCATEGORY_ORDER)."""


def part_style(name: str) -> PartStyle:
    """Style of a sub-category; a category name maps to its own colour (for category-level plots)."""
    if name in PART_STYLES:
        return PART_STYLES[name]
    if name in CATEGORY_COLORS:
        return PartStyle(CATEGORY_COLORS[name], "", LABELS[name])
    raise KeyError(f"no style for ledger part {name!r}; known: {', '.join(SUBCATEGORY_ORDER)}")


def variant_style(variant: str, others: list[str]) -> dict[str, object]:
    """Line style for a variant in a sweep: bsp is black/solid; ``others`` fixes the order of the rest."""
    if variant == REFERENCE_VARIANT:
        return {"color": OKABE_ITO["black"], "marker": "o", "linestyle": "-"}
    rest = [v for v in others if v != REFERENCE_VARIANT]
    i = rest.index(variant) if variant in rest else len(rest)
    color, marker, dash = _VARIANT_CYCLE[i % len(_VARIANT_CYCLE)]
    return {"color": color, "marker": marker, "linestyle": dash}


RC_PARAMS: dict[str, object] = {
    **safetext.MATPLOTLIB_RC,  # names from traces are literal text, never mathtext
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "axes.edgecolor": EDGE_COLOR,
    "axes.labelcolor": TEXT_COLOR,
    "text.color": TEXT_COLOR,
    "xtick.color": TEXT_COLOR,
    "ytick.color": TEXT_COLOR,
    "axes.grid": True,
    "grid.color": GRID_COLOR,
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "hatch.linewidth": 0.6,
    "hatch.color": "#333333",
    "figure.dpi": 110,
    "savefig.dpi": 130,
    "savefig.bbox": "tight",
    "legend.frameon": False,
}
"""Matplotlib settings applied (scoped, via ``matplotlib.rc_context``) by every figure function."""

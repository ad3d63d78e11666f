"""One palette: every ledger part has a style; parts are told apart by colour and by hatch."""
from matplotlib import colors as mcolors

from taxmodel.ledger.categories import CATEGORIES, SUBCATEGORY_ORDER
from taxmodel.report import style


def _lightness(hex_color: str) -> float:
    r, g, b = mcolors.to_rgb(hex_color)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b  # relative luminance (linear approx.), what greyscale print keeps


def test_every_part_has_a_style_and_a_label():
    assert set(style.PART_STYLES) == set(SUBCATEGORY_ORDER)
    for sub in SUBCATEGORY_ORDER:
        assert style.part_style(sub).label


def test_colours_unique_and_category_hues_are_okabe_ito():
    colours = [style.PART_STYLES[s].color for s in SUBCATEGORY_ORDER]
    assert len(set(colours)) == len(colours)
    okabe = {c.lower() for c in style.OKABE_ITO.values()}
    for cat in CATEGORIES:
        if cat != "unattributed":
            assert style.CATEGORY_COLORS[cat].lower() in okabe
    assert len(set(style.CATEGORY_COLORS.values())) == len(CATEGORIES)


def test_sub_parts_of_a_category_differ_in_lightness_and_hatch():
    """Lightness + hatch (not hue) separate sub-parts, so they survive colour-blindness and greyscale."""
    for subs in CATEGORIES.values():
        hatches = [style.PART_STYLES[s].hatch for s in subs]
        assert len(set(hatches)) == len(subs)
        light = sorted(_lightness(style.PART_STYLES[s].color) for s in subs)
        assert all(b - a > 0.08 for a, b in zip(light, light[1:])), subs


def test_category_name_maps_to_category_colour():
    assert style.part_style("bsp_tax").color == style.CATEGORY_COLORS["bsp_tax"]
    assert style.part_style("useful").color == style.CATEGORY_COLORS["useful"]


def test_variant_styles_reference_black_others_distinct():
    variants = ["bsp", "fg_pull", "fg_push", "torch_fused"]
    styles = [style.variant_style(v, variants) for v in variants]
    assert styles[0]["color"] == "#000000" and styles[0]["linestyle"] == "-"
    assert len({s["color"] for s in styles}) == 4
    assert len({s["marker"] for s in styles[1:]}) == 3

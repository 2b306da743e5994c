"""The accuracy-against-resolution plot (``vit_rope.eval.report``): lines named by what tells them apart, the model
in the title, and a legend that covers no line."""

import pytest

from vit_rope.eval import report

pytest.importorskip("matplotlib")

DEMO = "vit_rope_tiny_patch16_mixed_224 (output/demo/best.pth)"
SIZES = (48, 64, 80, 96, 128, 160)
# top-1 of the demo's policies: extrapolate falls at 128-160 px, where the legend sat over it
CURVES = {"extrapolate": (43, 52, 51, 48, 37, 31), "interpolate": (45, 52, 54, 54, 53, 49),
          "ntk": (43, 52, 52, 50, 42, 37), "yarn": (43, 52, 54, 54, 52, 48), "normalized": (31, 37, 41, 42, 43, 42)}


def results(model: str = DEMO, shift: float = 0.0) -> list[dict]:
    return [{"model": model, "policy": policy, "img_size": size, "train_size": 64, "top1": top1 + shift}
            for policy, curve in CURVES.items() for size, top1 in zip(SIZES, curve, strict=True)]


def legend_of(fig):
    (ax,) = fig.axes
    return ax, ax.get_legend() or fig.legends[0]


def covered_points(fig) -> list:
    """The data points (and midpoints of the segments between them) that lie under the legend, in display space."""
    ax, legend = legend_of(fig)
    fig.draw_without_rendering()
    box = legend.get_window_extent()
    covered = []
    for line in ax.get_lines():
        points = ax.transData.transform(line.get_xydata())
        covered += [tuple(p) for p in [*points, *(points[:-1] + points[1:]) / 2] if box.contains(*p)]
    return covered


@pytest.mark.parametrize("rows, labels, title", [
    (results(), list(CURVES), DEMO),  # one model: lines named by policy, the model in the title
    (results() + results(DEMO.replace("demo", "multires"), shift=-3.0),  # several: by their run folder, too
     [f"{run} [{policy}]" for run in ("demo", "multires") for policy in CURVES], "vit_rope_tiny_patch16_mixed_224"),
], ids=["one model", "several models"])
def test_lines_are_named_by_what_tells_them_apart_and_the_legend_leaves_them_alone(rows, labels, title):
    fig = report.accuracy_figure(rows)
    ax, legend = legend_of(fig)
    assert [text.get_text() for text in legend.get_texts()] == labels
    assert ax.get_title() == title and fig.get_suptitle() == "Accuracy against resolution"
    assert covered_points(fig) == []


def test_short_names_keep_what_differs_and_whole_labels_otherwise():
    ema = "m (out/a/best.pth, EMA)"
    assert report.short_names(["m (out/a/best.pth)", "m (out/a/last.pth)"]) == \
        ("m", {"m (out/a/best.pth)": "best.pth", "m (out/a/last.pth)": "last.pth"})
    assert report.short_names(["m (out/a/best.pth)", "n (out/b/best.pth)"]) == \
        (None, {"m (out/a/best.pth)": "m (a)", "n (out/b/best.pth)": "n (b)"})
    assert report.short_names(["m (out/a/best.pth)", ema])[1] == {"m (out/a/best.pth)": "best.pth",
                                                                   ema: "best.pth, EMA"}
    assert report.short_names(["RoPE-Mixed", "APE"]) == (None, {"RoPE-Mixed": "RoPE-Mixed", "APE": "APE"})

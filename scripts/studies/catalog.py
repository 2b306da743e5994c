"""Every Imagenette study the study script runs: its configs, folders and arms, the sizes it is evaluated at, the
goal its RoPE arms are held to and what it is read against (``scripts/imagenette_study.py``; the reports in this
package read the folders named here).

The studies ask one question on growing training grids: does RoPE hold its accuracy above the training size, as
RoPE-ViT (Heo et al., ECCV 2024, arXiv:2403.13298) reports on its 14x14 grid? ``docs/studies.md`` describes each.
"""

from __future__ import annotations

from pathlib import Path

from studies.goal import Goal

# study -> (config folder, results folder, training outputs, {arm: (label, arm of the same-recipe APE baseline)}),
# arms in the order they run: the cheap, most asked-for ones first.
STUDIES = {
    "v1": ("configs/imagenette_study", "results/imagenette", "output/study", {
        "ape": ("APE (timm ViT)", None), "axial": ("RoPE-Axial", None), "mixed": ("RoPE-Mixed", None),
        "axial_ape": ("RoPE-Axial + APE", None), "mixed_ape": ("RoPE-Mixed + APE", None)}),
    "v2": ("configs/imagenette_study/v2", "results/imagenette/v2", "output/study/v2", {
        "mixed": ("RoPE-Mixed", "ape"), "ape": ("APE", None),
        "mixed_coord": ("RoPE-Mixed + coord aug", "ape"),
        "mixed_sizes": ("RoPE-Mixed + sizes 48-96", "ape_sizes"), "ape_sizes": ("APE + sizes 48-96", None),
        "mixed_p8": ("RoPE-Mixed, patch 8", "ape_p8"), "ape_p8": ("APE, patch 8", None),
        "axial_p8": ("RoPE-Axial, patch 8", "ape_p8"),
        "mixed_coord_sizes": ("RoPE-Mixed + coord aug + sizes", "ape_sizes"),
        "axial": ("RoPE-Axial", "ape"), "axial_sizes": ("RoPE-Axial + sizes 48-96", "ape_sizes"),
        "axial_coord": ("RoPE-Axial + coord aug", "ape")}),
    "v3": ("configs/imagenette_study/v3", "results/imagenette/v3", "output/study/v3", {
        "mixed": ("RoPE-Mixed", "ape"), "ape": ("APE", None), "axial": ("RoPE-Axial", "ape"),
        "mixed_coord_sizes": ("RoPE-Mixed + coord aug + sizes 80-160", "ape")}),
    "v4": ("configs/imagenette_study/v4", "results/imagenette/v4", "output/study/v4", {
        "mixed_coord_sizes": ("RoPE-Mixed + coord aug + sizes 80-160", "ape_sizes"),
        "dinov3": ("DINOv3 RoPE + coord rescale 2", "ape_sizes"), "ape_sizes": ("APE + sizes 80-160", None),
        "mixed_third": ("RoPE-Mixed, a third of the images x 90 epochs", "ape_third"),
        "ape_third": ("APE, a third of the images x 90 epochs", None)}),
    "encodings": ("configs/imagenette_study/encodings", "results/imagenette/encodings", "output/study/encodings", {
        "mixed_p8": ("RoPE-Mixed, patch 8", "ape_p8"), "axial_p8": ("RoPE-Axial, patch 8", "ape_p8"),
        "ape_p8": ("APE, patch 8", None), "golden": ("Golden-angle RoPE, patch 8", "ape_p8"),
        "string_mixed": ("STRING over RoPE-Mixed, patch 8", "ape_p8"),
        "lookhere": ("LookHere LH-180, patch 8", "ape_p8"), "alibi": ("2D-ALiBi, patch 8", "ape_p8"),
        "nope": ("No position encoding, patch 8", "ape_p8"), "pape": ("PaPE, patch 8", "ape_p8"),
        "pape_ri": ("PaPE-RI, patch 8", "ape_p8"), "comrope_ap": ("ComRoPE-AP, patch 8", "ape_p8"),
        "comrope_ld": ("ComRoPE-LD, patch 8", "ape_p8"), "liere": ("LieRE, patch 8", "ape_p8"),
        "fire": ("FIRE, patch 8", "ape_p8")}),
    "vit_s": ("configs/imagenette_vit_s", "results/imagenette/vit_s", "output/imagenette_vit_s", {
        "mixed": ("RoPE-Mixed ViT-S", "ape"), "ape": ("APE ViT-S", None), "axial": ("RoPE-Axial ViT-S", "ape")}),
    "swin": ("configs/imagenette_study/swin", "results/imagenette/swin", "output/study/swin", {
        "mixed": ("Swin, RoPE-Mixed", "rpb"), "axial": ("Swin, RoPE-Axial", "rpb"),
        "rpb": ("Swin, relative position bias", None)}),
}
# The studies whose committed results the side-by-side table of the docs page (studies.compare) reads.
COMPARED = {study: Path(folder) for study, (_, folder, _, _) in STUDIES.items()}
# The study whose summary (studies.compare.headline) the README shows beside RoPE-ViT's table: the 14x14 grid.
HEADLINE = "v3"
# Evaluation sizes per study: 0.75x-2.5x of 64 px (v1, v2); RoPE-ViT's 160-512 px ratios of 112 px (v3, vit_s: grids
# 10-32).
SIZES = {"v1": [48, 64, 80, 96, 128, 160], "v2": [48, 64, 80, 96, 128, 160], "v3": [80, 112, 160, 192, 256],
         "encodings": [48, 64, 80, 96, 128, 160],
         "v4": [80, 112, 160, 192, 256],
         "vit_s": [80, 112, 160, 192, 256], "swin": [48, 64, 80, 96, 128, 160]}
# The goal each RoPE arm is read against: v1 and v2 hold at 2x and beat APE at 2x and at the largest size; on the
# 14x14 grid, RoPE-ViT's own claim: hold at 1.43x-1.71x (320 and 384 px of 224) and beat APE at 2.29x (512 px).
ROPE_VIT_GOAL = Goal(hold=(1.43, 1.71), beat=(None,))
# The Swin study holds its RoPE arms to v1 and v2's goal against timm's Swin with its relative position bias.
GOALS = {"v3": ROPE_VIT_GOAL, "v4": ROPE_VIT_GOAL, "vit_s": ROPE_VIT_GOAL,
         "swin": Goal(baseline="relative-position-bias Swin")}
# Arms that wait until every seed of the others is done: v3's remedy comes after its three controls, v4's stage 2
# (the data question) after stage 1.
LATER = {"v3": ("mixed_coord_sizes",), "v4": ("mixed_third", "ape_third")}
# APE arms of another study that a study's RoPE arms must also beat: v4's goal names v3's APE (trained at 112 px
# alone) beside its own APE + sizes; the encodings study, which re-runs one seed of v2's APE, is read against v2's
# two seeds of it too. study -> [(name in the tables, the other study, its arm)].
CONTROLS = {"v4": [("v3's APE", "v3", "ape")], "encodings": [("v2's APE, patch 8", "v2", "ape_p8")]}
# Arms set against the same model trained another way in another study: change above the training size here, there
# and the difference (studies.paired). v4's stage 2 (a third of the images) against v3's runs on all of them: the data
# question. study -> [(arm, the other study, its arm)].
PAIRS = {"v4": [("mixed_third", "v3", "mixed"), ("ape_third", "v3", "ape")]}
# Arms re-run from another study to show that they reproduce it: study -> (the study they come from, its arms).
REPRODUCES = {"encodings": ("v2", ("mixed_p8", "axial_p8", "ape_p8"))}
# Options of the study's main evaluation (eval/): a Swin's windows scale with the image, RoPE-ViT's rule for its Swins
# at 384 px, so that the positions in a window pass the trained range and the policies act.
EVAL_OPTIONS = {"swin": ["--window-size", "scale"]}
# A second evaluation, positions as trained only, beside the main one: study -> (its folder, the options that differ).
# One crop fraction can favour an arm (eval_crop<fraction>); a Swin also runs with the windows it trained with, padded
# where a stage is not whole windows (eval_windows_<rule>: no position beyond the trained window, nothing for a policy
# to do). studies.results.second_evaluations names the folders in the reports.
SECOND_EVAL = {**{study: ("eval_crop0.875", ["--crop-pct", "0.875"]) for study in ("v3", "v4", "encodings")},
               "swin": ("eval_windows_keep", ["--window-size", "keep", "--pad-windows"])}

"""Probes of a frozen backbone (``vit_rope.eval.probes``, ``vit_rope.eval.extraction``): DINO's weighted kNN and a
linear probe, their maths on synthetic features, pooling over valid NaFlex tokens, one probe fitted at one size and
evaluated at every size, the command on a backbone without a head, and each bad input refused before any forward."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from helpers.evaluation import ROPE, run, write_checkpoint
from helpers.models import perturbed
from helpers.naflex import images, pack
from vit_rope.errors import UserError
from vit_rope.eval import extraction, harness, probes, report
from vit_rope.eval.extraction import check_feature_memory
from vit_rope.eval.loading import EvalModel, create_from_checkpoint, load_trained
from vit_rope.eval.probes import (
    LinearProbe,
    ProbeOptions,
    feature_width,
    fit_linear,
    knn_votes,
    model_outputs,
)
from vit_rope.train.state import load_checkpoint, save_checkpoint


def clusters(count: int, classes: int, width: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` features around one random direction per class (noise 0.1 of it), and their classes."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, width, generator=torch.Generator().manual_seed(99))
    labels = torch.arange(count) % classes
    return centres[labels] + 0.1 * torch.randn(count, width, generator=g), labels


def test_knn_on_separated_classes_is_exact_and_on_random_labels_is_chance() -> None:
    bank, labels = clusters(500, 10)
    queries, truth = clusters(300, 10, seed=1)
    assert (knn_votes(bank, labels, queries, 10).argmax(1) == truth).all()
    g = torch.Generator().manual_seed(2)
    noise, shuffled = torch.randn(2000, 16, generator=g), torch.randint(0, 10, (2000,), generator=g)
    hits = (knn_votes(noise, shuffled, torch.randn(4000, 16, generator=g), 10, chunk=512).argmax(1)
            == torch.randint(0, 10, (4000,), generator=g)).float().mean()
    assert 0.08 < hits < 0.12  # chance: 10%, about 0.5% standard error


def test_the_weighted_vote_equals_a_hand_computed_case() -> None:
    """Three neighbours of four, weighted exp(cos / T): one close neighbour of class 0 outvotes two of class 1."""
    bank = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    labels = torch.tensor([0, 1, 1, 0])
    norm = math.sqrt(1.04)  # |(1, 0.2)|
    cos = [1 / norm, 0.2 / norm, 1.2 / (norm * math.sqrt(2))]  # to bank rows 0, 1, 2; row 3 is the farthest
    votes = knn_votes(bank * 3, labels, torch.tensor([[1.0, 0.2]]), 2, k=3, temperature=0.5)  # scale is normalised
    expected = [math.exp(cos[0] / 0.5), math.exp(cos[1] / 0.5) + math.exp(cos[2] / 0.5)]
    torch.testing.assert_close(votes, torch.tensor([expected]))
    assert votes.argmax().item() == 0
    torch.testing.assert_close(knn_votes(bank, labels, torch.tensor([[1.0, 0.2]]), 2, k=9),  # k past the bank: all
                               knn_votes(bank, labels, torch.tensor([[1.0, 0.2]]), 2, k=4))


def test_the_linear_probe_recovers_a_linearly_separable_labelling() -> None:
    """Labels from a random linear map, with a margin: fitted, the probe labels its train points and new ones
    alike; the fit is deterministic, and the standardisation it learnt goes with it."""
    g = torch.Generator().manual_seed(0)
    truth = torch.randn(4, 12, generator=g)

    def sample(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(count * 3, 12, generator=g) * 5 + 3  # off-centre and scaled: standardisation matters
        logits = (x - 3) @ truth.T
        top = logits.topk(2).values
        keep = top[:, 0] - top[:, 1] > 1.0
        return x[keep][:count], logits[keep][:count].argmax(1)

    x, y = sample(800)
    probe = fit_linear(x, y, 4)
    assert (probe(x).argmax(1) == y).all()
    new_x, new_y = sample(400)
    assert (probe(new_x).argmax(1) == new_y).float().mean() > 0.97
    again = fit_linear(x, y, 4)
    assert torch.equal(again.weight, probe.weight) and torch.equal(again.bias, probe.bias)
    torch.testing.assert_close(probe.mean, x.mean(0))


@pytest.mark.parametrize("pool", ["avg", "token", "map"])
@pytest.mark.parametrize("family", ["ours", "timm"])
def test_naflex_pooling_reads_valid_tokens_only(pool: str, family: str) -> None:
    """The pooled features of each sample of a padded NaFlex batch equal those of its image alone, whatever the
    padding holds, for our ViT and timm's NaFlexViT; logits come out of the same pass as model(batch)'s."""
    name, extra = (ROPE, {}) if family == "ours" else ("naflexvit_base_patch16_gap", {"embed_dim": 64, "num_heads": 2,
                                                                                   "class_token": True})
    model = perturbed(name, None, depth=1, num_classes=3, global_pool=pool, **extra)
    pictures = images([(2, 3), (3, 2)])
    batch, garbage = pack(pictures, 9, -2.0), pack(pictures, 9, 50.0)
    with torch.inference_mode():
        logits, features = model_outputs(model, batch)
        torch.testing.assert_close(model_outputs(model, garbage, logits=False)[1], features)
        torch.testing.assert_close(logits, model(batch))
        for b, picture in enumerate(pictures):
            torch.testing.assert_close(features[b], model_outputs(model, picture[None], logits=False)[1][0],
                                       atol=1e-4, rtol=1e-4)
    assert features.shape == (2, model.num_features)


@pytest.mark.parametrize("name, kwargs", [
    (ROPE, {"depth": 1}),
    ("vit_rope_eva02_tiny_patch14_224", {"depth": 1}),  # a twin
    ("swin_rope_mixed_tiny_patch4_window7_224", {"embed_dim": 32, "depths": [1, 1], "num_heads": [1, 2],
                                                 "window_size": 4, "img_size": 32}),
    ("vit_tiny_patch16_224", {"depth": 1, "dynamic_img_size": True}),  # timm's APE baseline
])
def test_every_kind_of_model_gives_one_vector_per_image_and_its_logits(name: str, kwargs: dict) -> None:
    model = timm.create_model(name, num_classes=3, **kwargs).eval()
    size = 56 if "patch14" in name else 32
    x = torch.randn(2, 3, size, size)
    with torch.inference_mode():
        logits, features = model_outputs(model, x)
        torch.testing.assert_close(logits, model(x))
    assert features.shape == (2, feature_width(model, name, size))


def test_a_probe_fitted_at_one_size_is_the_one_evaluated_at_every_size(image_root: Path, tmp_path: Path,
                                                                       monkeypatch) -> None:
    """One fit per run (model x policy), on the train split's pooled features at --linear-size, the same probe
    object then scoring every size; kNN's bank is taken at each size, the train split read once per size."""
    fitted, applied, passes = [], [], []
    real_fit, real_call, real_pass = probes.fit_linear, LinearProbe.__call__, extraction.forward_split

    def fit(features: torch.Tensor, *args, **kwargs) -> LinearProbe:
        fitted.append(features)
        return real_fit(features, *args, **kwargs)

    def call(self: LinearProbe, features: torch.Tensor) -> torch.Tensor:
        applied.append((id(self), len(features)))
        return real_call(self, features)

    def forward_split(runs, samples, indices, setting, *args) -> extraction.Pass:
        passes.append((len(indices), setting.name))
        return real_pass(runs, samples, indices, setting, *args)

    monkeypatch.setattr(probes, "fit_linear", fit)
    monkeypatch.setattr(LinearProbe, "__call__", call)
    monkeypatch.setattr(extraction, "forward_split", forward_split)
    model = load_trained(write_checkpoint(tmp_path / "best.pth"))
    options = ProbeOptions(("knn", "linear"), k=3, linear_size=48)
    results = harness.evaluate_models([model], image_root, [32, 64], ["extrapolate", "interpolate"], device="cpu",
                                      batch_size=5, workers=0, probes=options)
    assert len(fitted) == 2 and all(features.shape[0] == 24 for features in fitted)  # 24 train images, 2 policies
    used = [probe for probe, _ in applied]
    assert len(applied) == 4 and len(set(used)) == 2 and used[0] == used[2] and used[1] == used[3]
    assert sorted(setting for count, setting in passes if count == 24) == ["32 px", "48 px", "64 px"]
    # the fit's features are the model's pooled ones on the train images at 48 px
    train = extraction.train_split(image_root, None, options, ["class_0", "class_1", "class_2"])
    model.model.set_resolution_policy("extrapolate")
    expected = extraction.forward_split(extraction.Runs([model], [(0, "extrapolate")], [harness.normalisation(
        model.model, "cpu")], "cpu", 0, "keep"), train.samples, train.indices, harness.square_setting(48, 1.0, [0]),
        24, [0], {}, {0})
    torch.testing.assert_close(fitted[0], expected.features[0])
    linear = [row for row in results if row["probe"] == "linear"]
    assert {(row["img_size"], row["linear_size"], row["train_images"]) for row in linear} == {(32, 48, 24),
                                                                                               (64, 48, 24)}


def test_the_command_probes_a_backbone_without_a_head(image_root: Path, tmp_path: Path, capsys) -> None:
    """A headless weights file (what DINOv3 and the other backbones ship) through --model, and a checkpoint and
    timm's APE ViT beside it: every probe's rows, named in the table, the plot written."""
    backbone = timm.create_model(ROPE, depth=1, num_classes=0)
    save_file(backbone.state_dict(), tmp_path / "backbone.safetensors")
    out = tmp_path / "eval"
    assert run("--model", ROPE, "--pretrained-file", str(tmp_path / "backbone.safetensors"), "--model-kwargs",
               "depth=1", "--train-size", "32", "--data-dir", str(image_root), "--img-sizes", "32", "48",
               "--seq-lens", "4", "--probe", "knn", "linear", "--knn-k", "5", "--output", str(out)) == 0
    assert f"probes: knn, linear built from {image_root / 'train'}" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())["results"]
    assert [(r["probe"], r["img_size"] or r["seq_len"]) for r in results] == [
        ("knn", 32), ("linear", 32), ("knn", 48), ("linear", 48), ("knn", 4), ("linear", 4)]  # then the budget
    assert all(r["knn_k"] == 5 and r["knn_temperature"] == 0.07 and r["bank_size"] is None for r in results[::2])
    assert all(0 <= r["top1"] <= r["top5"] <= 100 and r["images"] == 12 for r in results)
    checkpoint = write_checkpoint(tmp_path / "best.pth")
    assert run("--checkpoint", str(checkpoint), "--model", "vit_tiny_patch16_224", "--random-init", "--model-kwargs",
               "depth=1", "--data-dir", str(image_root), "--img-sizes", "32", "--probe", "head", "knn", "--knn-k", "5",
               "--bank-size", "48", "--output", str(out)) == 0
    results = json.loads((out / "results.json").read_text())["results"]
    assert {(r["model"].split(" ")[0], r["probe"], r.get("bank_size")) for r in results} == {
        (ROPE, "head", None), (ROPE, "knn", 48), ("vit_tiny_patch16_224", "head", None),
        ("vit_tiny_patch16_224", "knn", 48)}
    assert "| model | policy | probe | 32* |" in (out / "results.md").read_text()
    assert (out / "accuracy_vs_resolution.png").stat().st_size > 1000
    panels = report.probe_panels(results)  # the plot: a panel per probe, a line per model x policy in each
    assert list(panels) == ["head", "knn"] and [len(rows) for rows in panels.values()] == [2, 2]
    assert {row["model"] for row in panels["knn"]} == {row["model"] for row in panels["head"]}
    assert {row["model"].split(" ")[0] for row in panels["knn"]} == {ROPE, "vit_tiny_patch16_224"}
    assert any(row["model"].endswith(", extrapolate") for row in panels["knn"])


def test_a_backbone_from_create_from_checkpoint_is_probed(image_root: Path, tmp_path: Path) -> None:
    """The Python API on any checkpoint the generic loader builds: no head, kNN at each size."""
    save_file(timm.create_model(ROPE, depth=1, num_classes=0).state_dict(), tmp_path / "backbone.safetensors")
    model = create_from_checkpoint(tmp_path / "backbone.safetensors", model=ROPE, depth=1, num_classes=0)
    results = harness.evaluate_models([EvalModel("backbone", model, 32)], image_root, [32, 48], device="cpu",
                                      workers=0, probes=ProbeOptions(("knn",), k=5))
    assert [(row["img_size"], row["probe"], row["train_images"]) for row in results] == [(32, "knn", 24),
                                                                                        (48, "knn", 24)]


def test_the_train_split_is_the_checkpoints_and_asked_only_of_the_probes(image_root: Path, tmp_path: Path,
                                                                          capsys) -> None:
    """Checkpoints trained on different train splits: their heads are evaluated as before; the probes need one."""
    for name, split in (("first", "train"), ("second", "other")):
        state = load_checkpoint(write_checkpoint(tmp_path / f"{name}.pth"))
        save_checkpoint({**state, "config": {**state["config"], "train_split": split}}, tmp_path / f"{name}.pth")
    common = ["--checkpoint", str(tmp_path / "first.pth"), str(tmp_path / "second.pth"), "--data-dir", str(image_root),
              "--img-sizes", "32", "--output", str(tmp_path / "eval")]
    assert run(*common) == 0
    assert run(*common, "--probe", "knn", "--knn-k", "3") == 2
    assert "were trained with different train_split" in capsys.readouterr().err
    assert run(*common, "--probe", "knn", "--knn-k", "3", "--train-split", "train") == 0


@pytest.mark.parametrize("case, message", [
    ("no_head", "(depth=1, random init) has no classifier (num_classes=0), so it has no head to evaluate: probe its "
                "features with --probe knn or --probe linear"),
    ("backbone_file", "it has no classifier: probe its features with --probe knn or --probe linear"),
    ("unpooled", "pools nothing: its pre-logits are (1, 5, 192) for one image"),
    ("bank_size", "--bank-size 40 is not a positive multiple of the patch size 16 of"),
    ("linear_size", "--linear-size 20 is not a positive multiple of the patch size 16 of"),
    ("k", "--knn-k 30 is larger than the bank: "),
    ("empty_class", "class class_2 has no train images in"),
    ("unknown_class", "the val classes ['class_2'] are not classes of the train split"),
    ("temperature", "--knn-k 20 and --knn-temperature 0.0 must be positive"),
    ("knn_flag_alone", "--bank-size sets the knn probe, which this run does not evaluate (--probe linear): add "
                       "--probe knn, or drop --bank-size"),
    ("linear_flag_alone", "--linear-size sets the linear probe, which this run does not evaluate (--probe head): "
                          "add --probe linear, or drop --linear-size"),
])
def test_bad_input(case: str, message: str, image_root: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    """Each mistake: exit code 2, one line naming the value, nothing written, and no pass over the data begun."""
    for module in (harness, extraction):  # any pass over a split would fail loudly
        monkeypatch.setattr(module, "forward_split", None)
    source = ["--model", ROPE, "--random-init", "--model-kwargs", "depth=1", "--train-size", "32"]
    probe = {"knn_flag_alone": ["--probe", "linear", "--bank-size", "32"],
             "linear_flag_alone": ["--linear-size", "32"]}.get(case, ["--probe", "knn", "linear"])
    if case == "no_head":
        source[-3:-2], probe = ["depth=1", "num_classes=0"], []
    if case == "backbone_file":
        save_file(timm.create_model(ROPE, depth=1, num_classes=0).state_dict(), tmp_path / "backbone.safetensors")
        source[2:3], probe = ["--pretrained-file", str(tmp_path / "backbone.safetensors")], []
    if case == "unpooled":
        source = ["--model", "vit_tiny_patch16_224", "--random-init", "--model-kwargs", "depth=1", "global_pool=''",
                  "--train-size", "32"]
    probe += {"bank_size": ["--bank-size", "40"], "linear_size": ["--linear-size", "20"], "k": ["--knn-k", "30"],
              "empty_class": ["--train-limit", "2"], "temperature": ["--knn-temperature", "0"]}.get(case, [])
    if case == "unknown_class":
        (image_root / "train" / "class_2").rename(image_root / "train" / "class_9")
    code = run(*source, "--data-dir", str(image_root), "--img-sizes", "32", *probe, "--output", str(tmp_path / "eval"))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "eval").exists()


def test_probe_options_and_feature_memory_are_checked() -> None:
    with pytest.raises(UserError, match=r"^unknown probe svm: choose from head, knn, linear$"):
        ProbeOptions(("knn", "svm"))
    assert check_feature_memory({0: 192}, 9469, 3925, {0: 1}, True, 2**34) == 4 * 192 * (2 * 9469 + 3925) + 2**27
    with pytest.raises(UserError, match=r"the probes' features need about 1.6 GiB \(1000000 train and 1000 val images "
                                        r"x 2 runs of model and policy, 4 bytes per feature\) but 1.0 GiB are free"):
        check_feature_memory({0: 192, 1: 192}, 10**6, 1000, {}, True, 2**30)

"""Images/s of our ComRoPE-AP, ComRoPE-LD, LieRE, PaPE and PaPE-RI against their official implementations, on the
same model with the same weights, measured in one interleaved run.

    PYTHONPATH=/tmp/refpkgs python benchmarks/official_kinds.py --comrope ComRoPE --liere LieRE \\
        --pape parabolic-position-encoding --rounds 5 --json results/performance/official_kinds_cpu_vit_s.json

The official code stays out of this repository: each option takes the path of a checkout, imported from there (the
commits our layers were checked against, ``PINNED``, are what the result records beside the checkout's own commit).
LieRE's code imports ``einops`` and PaPE's ``pape.configs`` ``tyro`` and ``dataclasses-json``, which this project does
not depend on: install them aside (``pip install --target /tmp/refpkgs einops tyro dataclasses-json``) and put that
folder on ``PYTHONPATH``. Shims, none to the maths: transformers >= 5 dropped ``CLIPAttention._shape``, which
ComRoPE's layer calls (added back as 4.46 defines it); LieRE's modules import ``ipdb``, stubbed.

What "the same model" is, per kind (ViT-S widths: 384 wide, 6 heads of 64; batch 8 at 224 px, 14 x 14 patches and a
class token, 197 tokens):

- ComRoPE-AP / -LD (``model.py``'s ``ComRoPEAPAttention`` / ``ComRoPELDAttention``, block size 8 as our models) and
  LieRE (``models/rope_vit.py``'s ``LierePositionEncoder``, generators per head of size 8, one set for every layer as
  the official ``Transformer`` runs, and ``FlexibleAttention``): 12 attention layers, each with a residual, the
  official layers' weights copied into ours (``vit_rope.layers.attention.RoPEAttention`` with ``ComRoPE`` or
  ``LieRE``), the tokens averaged at the end. Their official models are a CLIP ViT and a lucidrains ViT, other
  blocks than our timm ones, so the attention stack is where the two sides compute the same thing. Each side builds
  its rotations per forward as its model does: ours from the grid's positions (in evaluation kept per grid until the
  generators change, as our ViT keeps them), the official ComRoPE from positions ``[1, N, 2]`` shared by the batch
  (its cheapest input), the official LieRE encoder once for all layers.
- PaPE / PaPE-RI: the whole official ``pape.nn.image_classifier.ImageClassifier`` (ImageNet, 50 parabolas for PaPE)
  against ours built from its weights by ``vit_rope.create_from_checkpoint`` on a folder written to a
  temporary directory. Drop-path off on both sides (the official default 0.1 would drop a random set of branches at
  every training step); every official weight drawn at random (its zeroed classifier would make every logit equal,
  which no parity check could see through).

Before timing, both sides' outputs are checked equal (``TOLERANCE``) in evaluation and in training mode, so the
timing compares the same computation. Timing: inference (``torch.inference_mode``, eval) and a training step
(forward, cross-entropy, backward; the stacks' averaged tokens taken as logits), every (kind, side) in each round in
a new random order (``benchmarks.throughput``'s ``interleaved_seconds``), ``--steps`` steps per round after
``--warmup``; a side's figure is the median of its per-round images/s and the ratio ours / official the median of the
per-round ratios, held to ``TARGET``. Subnormal floats are flushed on both sides, as ``train.py`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.throughput import against, interleaved_speeds, paired_ratio, prepare, setup_machine, verdict  # noqa: E402
from vit_rope.encodings.base import image_positions  # noqa: E402
from vit_rope.encodings.generators.comrope import ComRoPE  # noqa: E402
from vit_rope.encodings.generators.liere import LieRE  # noqa: E402
from vit_rope.eval import report  # noqa: E402
from vit_rope.eval.loading import create_from_checkpoint  # noqa: E402
from vit_rope.layers.attention import RoPEAttention  # noqa: E402
from vit_rope.train.distributed import flushed_subnormals  # noqa: E402

# the official repositories: a file each checkout must hold, and the commit our layers' parity tests were made at
REPOS = {"comrope": ("ComRoPE", "model.py", "7aeef083f8af53479d0e86af562029bd89af6422"),
         "liere": ("LieRE", "models/rope_vit.py", "b27b41ba0d27331ec0774de852939c6d407889aa"),
         "pape": ("parabolic-position-encoding", "pape/nn/image_classifier.py",
                  "21cb390eafb9398e78c7c786d20505f557c973ec")}
KINDS = {"comrope_ap": "comrope", "comrope_ld": "comrope", "liere": "liere", "pape": "pape", "pape_ri": "pape"}
MODES = ("infer", "train")
TARGET = 1.0  # the least ratio ours / official
TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}  # fp32, 12 layers: the two sides order their sums differently
BLOCK = 8  # ComRoPE's block and LieRE's generator size in our models (and LieRE's official ImageNet recipe)


class Widths(NamedTuple):
    """The model both sides are built at: ViT-S by default, smaller in the smoke test."""

    dim: int = 384
    heads: int = 6
    depth: int = 12
    mlp: int = 1536
    img_size: int = 224
    patch: int = 16

    @property
    def grid(self) -> int:
        return self.img_size // self.patch


class Pair(NamedTuple):
    """One kind's two sides, computing the same function of ``inputs``; ``level`` says what they are."""

    ours: nn.Module
    official: nn.Module
    inputs: Tensor
    level: str


class ResidualAttention(nn.Module):
    """``depth`` attention layers, each added to its input, the tokens averaged at the end (one logit vector per
    image for the training step's cross-entropy). Subclasses give what each layer takes (``layer_inputs``, built once
    per forward, as each side's model builds its rotations) and how a layer is called (``attend``)."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def layer_inputs(self, x: Tensor) -> Sequence[Any]:
        raise NotImplementedError

    def attend(self, layer: nn.Module, x: Tensor, inputs: Any) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        for layer, inputs in zip(self.layers, self.layer_inputs(x), strict=True):
            x = x + self.attend(layer, x, inputs)
        return x.mean(1)


class OurAttention(ResidualAttention):
    """Our side of ComRoPE and LieRE: ``RoPEAttention`` layers with the tables ``encoding`` gives for an image
    batch's grid, as our ViT's forward builds them."""

    def __init__(self, encoding: ComRoPE | LieRE, widths: Widths, qkv_bias: bool) -> None:
        super().__init__([RoPEAttention(widths.dim, num_heads=widths.heads, qkv_bias=qkv_bias)
                          for _ in range(widths.depth)])
        self.encoding, self.grid = encoding, widths.grid

    def layer_inputs(self, x: Tensor) -> Sequence[Any]:
        return self.encoding.block_inputs(image_positions(self.encoding, self.grid, self.grid, x.device), 1)

    def attend(self, layer: nn.Module, x: Tensor, inputs: Any) -> Tensor:
        return layer(x, inputs)


class OfficialComRoPE(ResidualAttention):
    """The official ComRoPE layers, given their positions as ``CustomVIT.forward`` gives them (``set_positions``)."""

    def __init__(self, layers: Sequence[nn.Module], positions: Tensor) -> None:
        super().__init__(layers)
        self.register_buffer("positions", positions, persistent=False)

    def layer_inputs(self, x: Tensor) -> Sequence[Tensor]:
        return [self.positions] * len(self.layers)

    def attend(self, layer: nn.Module, x: Tensor, inputs: Tensor) -> Tensor:
        layer.set_positions(inputs)
        return layer(x)[0]  # (output, attention weights or None)


class OfficialLieRE(ResidualAttention):
    """The official LieRE layers with the rotations its encoder gives once per forward for every layer, as
    ``RoPEViT.forward`` and ``Transformer.forward`` run them."""

    def __init__(self, encoder: nn.Module, layers: Sequence[nn.Module], img_size: int) -> None:
        super().__init__(layers)
        self.encoder, self.img_size = encoder, img_size

    def layer_inputs(self, x: Tensor) -> Sequence[Tensor]:
        rotations = self.encoder(torch.tensor([[self.img_size] * 2], device=x.device), dtype=x.dtype)
        return [rotations] * len(self.layers)

    def attend(self, layer: nn.Module, x: Tensor, inputs: Tensor) -> Tensor:
        return layer(x, inputs)


class OfficialClassifier(nn.Module):
    """PaPE's official classifier called on images: it takes a batch object with ``.images``."""

    def __init__(self, classifier: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, images: Tensor) -> Tensor:
        return self.classifier(types.SimpleNamespace(images=images))


def import_official(root: Path, module: str) -> types.ModuleType:
    """``module`` imported from the checkout ``root`` (put first on the path), checked to come from there: a module
    of the same name elsewhere on the path would time the wrong code."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    imported = importlib.import_module(module)
    if not Path(imported.__file__).resolve().is_relative_to(root.resolve()):
        raise ImportError(f"{module} was imported from {imported.__file__}, not from the checkout {root}.")
    return imported


def checkout_commit(root: Path) -> str | None:
    """The commit a checkout is at, or None where it is no git work tree."""
    found = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def comrope_pair(root: Path, kind: str, widths: Widths, batch: int) -> Pair:
    """The official ComRoPE-AP or -LD layers and ours with their weights (q, k and v fused into our qkv)."""
    from transformers.models.clip.modeling_clip import CLIPAttention

    if not hasattr(CLIPAttention, "_shape"):  # transformers >= 5 dropped it; as 4.46 defines it
        def _shape(self: CLIPAttention, tensor: Tensor, seq_len: int, bsz: int) -> Tensor:
            return tensor.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        CLIPAttention._shape = _shape
    official = import_official(root, "model")
    config = official.CustomVITConfig(hidden_size=widths.dim, num_attention_heads=widths.heads, block_size=BLOCK,
                                      image_size=widths.img_size, patch_size=widths.patch, attn_implementation="eager")
    cls = official.ComRoPEAPAttention if kind == "comrope_ap" else official.ComRoPELDAttention
    layers = [cls(config) for _ in range(widths.depth)]
    encoding = ComRoPE(kind, widths.depth, widths.heads, widths.dim // widths.heads, (widths.grid,) * 2,
                       block_size=BLOCK)
    ours = OurAttention(encoding, widths, qkv_bias=True)
    with torch.no_grad():
        for i, (layer, attn) in enumerate(zip(layers, ours.layers, strict=True)):
            attn.qkv.weight.copy_(torch.cat([getattr(layer, f"{n}_proj").weight for n in "qkv"]))
            attn.qkv.bias.copy_(torch.cat([getattr(layer, f"{n}_proj").bias for n in "qkv"]))
            attn.proj.load_state_dict(layer.out_proj.state_dict())
            encoding.freqs[i].copy_(layer.freqs)
            if kind == "comrope_ld":
                encoding.multiplier[i].copy_(layer.multiplier)
    tokens = torch.randn(batch, 1 + widths.grid**2, widths.dim)
    return Pair(ours, OfficialComRoPE(layers, config.get_positions()[None]), tokens,
                f"{widths.depth} attention layers")


def liere_pair(root: Path, kind: str, widths: Widths, batch: int) -> Pair:
    """The official LieRE encoder and layers and ours with their weights."""
    sys.modules.setdefault("ipdb", types.ModuleType("ipdb"))
    official = import_official(root, "models.rope_vit")
    with contextlib.redirect_stdout(None):  # it prints its generator sizes
        encoder = official.LierePositionEncoder(
            image_size=[widths.img_size] * 2, patch_size=[widths.patch] * 2, dim=widths.dim, phase_type="learned",
            position_sequencing_type="sequential", heads=widths.heads, input_dimensionality=2, generator_dim=BLOCK,
            depth=widths.depth, rotary_embedding_per_layer=False, rotary_embedding_per_head=True)
    layers = [official.FlexibleAttention(widths.dim, heads=widths.heads, dim_head=widths.dim // widths.heads,
                                         dropout=0.0, rotary_embedding_per_head=True) for _ in range(widths.depth)]
    encoding = LieRE(widths.depth, widths.heads, widths.dim // widths.heads, (widths.grid,) * 2, generator_dim=BLOCK)
    ours = OurAttention(encoding, widths, qkv_bias=False)
    with torch.no_grad():
        encoding.generator_raw_params.copy_(encoder.generator_raw_params)
        for layer, attn in zip(layers, ours.layers, strict=True):
            attn.qkv.weight.copy_(layer.to_qkv.weight)
            attn.proj.load_state_dict(layer.to_out[0].state_dict())
    tokens = torch.randn(batch, 1 + widths.grid**2, widths.dim)
    return Pair(ours, OfficialLieRE(encoder, layers, widths.img_size), tokens, f"{widths.depth} attention layers")


def pape_pair(root: Path, kind: str, widths: Widths, batch: int) -> Pair:
    """The official ImageNet classifier and ours built from its weights by ``create_from_checkpoint``."""
    import_official(root, "pape.nn.image_classifier")
    from pape.configs import Config, Dataset, ModelConfig, PaPEConfig, Positional
    from pape.nn.image_classifier import ImageClassifier

    model = ModelConfig(_hidden_size=widths.dim, _head_size=widths.dim // widths.heads, _num_heads=widths.heads,
                        _num_layers=widths.depth, _intermediate_size=widths.mlp, size="small", drop_path=0.0)
    config = Config(dataset=Dataset.imagenet, positional=Positional(kind), model=model, patch_size=widths.patch,
                    pape=PaPEConfig())
    official = ImageClassifier(config)
    with torch.no_grad():
        nn.init.normal_(official.classifier.weight, std=0.02)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(config.to_json())
        torch.save(official.state_dict(), Path(folder) / "model.pt")
        ours = create_from_checkpoint(folder, img_size=widths.img_size)
    images = torch.randn(batch, 3, widths.img_size, widths.img_size)
    return Pair(ours, OfficialClassifier(official), images, "whole classifier")


BUILDERS: dict[str, Callable[[Path, str, Widths, int], Pair]] = {"comrope": comrope_pair, "liere": liere_pair,
                                                                  "pape": pape_pair}


def parity(pair: Pair) -> dict[str, float]:
    """The largest difference of the two sides' outputs in evaluation and in training mode; raises (the timing would
    compare different computations) where they are not equal to ``TOLERANCE``."""
    out = {}
    with torch.no_grad():
        for mode in MODES:
            pair.ours.train(mode == "train")
            pair.official.train(mode == "train")
            ours, official = pair.ours(pair.inputs), pair.official(pair.inputs)
            torch.testing.assert_close(ours, official, **TOLERANCE, msg=lambda msg, m=mode: f"{m}: {msg}")
            out[f"max_abs_diff_{mode}"] = (ours - official).abs().max().item()
    out["max_abs_output"] = official.abs().max().item()
    return out


def compare(pairs: dict[str, Pair], modes: Sequence[str], rounds: int, steps: int, warmup: int,
            save: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Per mode, every kind's two sides interleaved in one run: a row per kind with both sides' images/s, the ratio
    ours / official and its target. ``save`` gets the rows after each mode."""
    device = torch.device("cpu")
    rows: list[dict] = []
    for mode in modes:
        models = {(kind, side): getattr(pair, side) for kind, pair in pairs.items() for side in ("ours", "official")}
        calls = {}
        for kind, pair in pairs.items():  # each kind's input; the rounds then run every kind's sides together
            sides = {key: model for key, model in models.items() if key[0] == kind}
            calls.update(prepare(sides, pair.inputs, mode, amp=False, warmup=warmup))
        batch = {pair.inputs.shape[0] for pair in pairs.values()}
        if len(batch) != 1:
            raise ValueError(f"Every kind's input must have the same batch (images/s), got {sorted(batch)}.")
        speeds = interleaved_speeds(calls, models, mode, batch.pop(), rounds, steps, device)
        for kind, pair in pairs.items():
            ours, official = speeds[kind, "ours"], speeds[kind, "official"]
            ratio = paired_ratio(ours, official)
            rows.append({"kind": kind, "level": pair.level, "batch_size": pair.inputs.shape[0], "mode": mode,
                         "ours_images_per_s": statistics.median(ours),
                         "official_images_per_s": statistics.median(official), "ratio": ratio,
                         "ours_rounds": ours, "official_rounds": official, **against(ratio, TARGET)})
        print(table([row for row in rows if row["mode"] == mode]), flush=True)
        if save is not None:
            save(rows)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table of the rows: both sides' images/s and the ratio ours / official against its target."""
    return report.table(["kind", "compared", "mode", "ours images/s", "official images/s", "ours / official",
                         "target", "result"],
                        [(r["kind"], r["level"], r["mode"], f"{r['ours_images_per_s']:.2f}",
                          f"{r['official_images_per_s']:.2f}", f"{r['ratio']:.3f}", *verdict(r)) for r in rows])


def command_line(argv: Sequence[str], checkouts: dict[str, Path]) -> str:
    """The command as run, with each checkout's path replaced by the repository's name (results name no machine's
    paths) and paths inside this repository relative to it."""
    names = {str(path): f"<{REPOS[repo][0]}>" for repo, path in checkouts.items()}

    def shown(word: str) -> str:
        option, eq, value = word.partition("=")
        if eq and value in names:
            return f"{option}={names[value]}"
        if word in names:
            return names[word]
        path = Path(word)
        return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else word

    script = Path(__file__).resolve().relative_to(ROOT)
    return " ".join([str(script), *map(shown, argv)])


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for repo, (name, _, commit) in REPOS.items():
        kinds = [kind for kind, of in KINDS.items() if of == repo]
        parser.add_argument(f"--{repo}", type=Path, metavar="PATH",
                            help=f"checkout of the official {name} (commit {commit[:8]}): measures {', '.join(kinds)}")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, help="of the given checkouts' kinds, only these")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians over them)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per side per round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side before the rounds")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", help="also write the rows, the parity checks and the machine to this file")
    args = parser.parse_args(argv)
    checkouts = {repo: getattr(args, repo) for repo in REPOS if getattr(args, repo) is not None}
    if not checkouts:
        parser.error("give at least one official checkout: " + ", ".join(f"--{repo} PATH" for repo in REPOS))
    for repo, path in checkouts.items():
        name, marker, _ = REPOS[repo]
        if not (path / marker).is_file():
            parser.error(f"--{repo} {path} is not a checkout of {name}: it has no {marker}")
    args.kinds = [kind for kind in args.kinds or KINDS if KINDS[kind] in checkouts]
    if not args.kinds:
        parser.error(f"none of --kinds is measured by the checkouts given ({', '.join(f'--{r}' for r in checkouts)})")
    for option in ("batch_size", "rounds", "steps"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    args.checkouts = checkouts
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    widths = Widths()
    machine = setup_machine(args.threads, batch_size=args.batch_size, rounds=args.rounds, steps=args.steps,
                            warmup=args.warmup, widths=widths._asdict(), subnormals_flushed=True)
    machine["command"] = command_line(sys.argv[1:] if argv is None else argv, args.checkouts)
    official = {repo: {"repository": REPOS[repo][0], "pinned": REPOS[repo][2], "commit": checkout_commit(path)}
                for repo, path in args.checkouts.items()}
    print(f"# {machine}\n# official: {official}", flush=True)
    checks: dict[str, dict[str, float]] = {}

    def save(rows: list[dict], complete: bool = False) -> None:
        if args.json:
            result = {"machine": machine, "complete": complete, "official": official, "tolerance": TOLERANCE,
                      "parity": checks, "rows": rows}
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")

    with flushed_subnormals():  # as train.py and vit_rope.evaluate run
        pairs = {}
        for kind in args.kinds:
            torch.manual_seed(0)  # each kind's weights and inputs the same, whichever kinds run before it
            repo = KINDS[kind]
            pairs[kind] = BUILDERS[repo](args.checkouts[repo], kind, widths, args.batch_size)
            checks[kind] = parity(pairs[kind])
            print(f"# {kind}: equal outputs ({pairs[kind].level}): {checks[kind]}", flush=True)
        rows = compare(pairs, args.modes, args.rounds, args.steps, args.warmup, save)
    print("\n" + table(rows))
    save(rows, complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

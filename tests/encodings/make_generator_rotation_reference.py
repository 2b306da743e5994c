"""Writes generator_rotation_reference.pt, the official outputs test_generator_rotations.py holds ours to.

Run once, against the official code (which stays out of this repository):

    git clone https://github.com/Longin-Yu/ComRoPE      # commit 7aeef083f8af53479d0e86af562029bd89af6422
    git clone https://github.com/StanfordMIMI/LieRE     # commit b27b41ba0d27331ec0774de852939c6d407889aa
    pip install --target /tmp/refpkgs einops           # LieRE's code imports it
    PYTHONPATH=/tmp/refpkgs python tests/encodings/make_generator_rotation_reference.py ComRoPE LieRE

What it records, for a 2-head attention layer with random weights and tokens, at the training grid (4x4) and a
larger one (6x6):

- ComRoPE-AP and -LD (``model.py``'s ``ComRoPEAPAttention`` / ``ComRoPELDAttention``, block size 4, the class token
  at 0.5): the attention probabilities and outputs, with positions from the model built for that image size
  (``get_positions``, our ``interpolate``) and with the training grid's positions carried on (``(i + 0.5) / 4``, our
  ``extrapolate``);
- LieRE (``models/rope_vit.py``'s ``LierePositionEncoder`` with generators per head, size 8, and
  ``FlexibleAttention``): the attention output with the official positions at both sizes (our ``extrapolate``).

Shims, none to the maths: transformers >= 5 dropped ``CLIPAttention._shape``, which ComRoPE calls (added back as
4.46 defines it); LieRE's modules import ``ipdb``, stubbed.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch

OUT = Path(__file__).with_name("generator_rotation_reference.pt")
WIDTH, HEADS, TRAIN, LARGE = 32, 2, 4, 6


def load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def comrope(root: Path) -> dict[str, torch.Tensor]:
    from transformers.models.clip.modeling_clip import CLIPAttention

    if not hasattr(CLIPAttention, "_shape"):
        CLIPAttention._shape = lambda self, t, seq_len, bsz: t.view(bsz, seq_len, self.num_heads,
                                                                    self.head_dim).transpose(1, 2)
    official = load(root / "model.py", "comrope_official")
    out = {}
    for kind, cls in (("ap", official.ComRoPEAPAttention), ("ld", official.ComRoPELDAttention)):
        torch.manual_seed(0)
        config = official.CustomVITConfig(hidden_size=WIDTH, num_attention_heads=HEADS, block_size=4,
                                          image_size=16 * TRAIN, patch_size=16, attn_implementation="eager")
        attn = cls(config).eval()
        with torch.no_grad():
            for p in attn.parameters():  # biases off zero too
                p.add_(torch.randn_like(p) * 0.1)
        for name, p in attn.named_parameters():
            out[f"comrope_{kind}.{name}"] = p.detach().clone()
        for grid in (TRAIN, LARGE):
            x = torch.randn(1, 1 + grid * grid, WIDTH)
            out[f"comrope_{kind}.x{grid}"] = x
            config.image_size = 16 * grid
            own = config.get_positions()[None]  # the model built for this size: (i + 0.5) / grid
            ys, xs = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
            carried = torch.cat((torch.full((1, 2), 0.5), (torch.stack((ys, xs), -1).reshape(-1, 2) + 0.5) / TRAIN))
            for policy, positions in (("interpolate", own), ("extrapolate", carried[None])):
                attn.set_positions(positions)
                with torch.no_grad():
                    y, probs = attn(x, output_attentions=True)
                out[f"comrope_{kind}.{policy}{grid}.out"], out[f"comrope_{kind}.{policy}{grid}.probs"] = y, probs
    return out


def liere(root: Path) -> dict[str, torch.Tensor]:
    sys.modules.setdefault("ipdb", types.ModuleType("ipdb"))
    sys.path.insert(0, str(root))
    from models.rope_vit import FlexibleAttention, LierePositionEncoder

    torch.manual_seed(0)
    dim = 64 * HEADS  # FlexibleAttention asserts 64 channels per head
    encoder = LierePositionEncoder(image_size=[16 * TRAIN] * 2, patch_size=[16, 16], dim=dim, phase_type="learned",
                                   position_sequencing_type="sequential", heads=HEADS, input_dimensionality=2,
                                   generator_dim=8, depth=1, rotary_embedding_per_layer=False,
                                   rotary_embedding_per_head=True)
    attn = FlexibleAttention(dim, heads=HEADS, dim_head=64, dropout=0.0, rotary_embedding_per_head=True).eval()
    out = {"liere.generator_raw_params": encoder.generator_raw_params.detach().clone(),
           **{f"liere.{name}": p.detach().clone() for name, p in attn.named_parameters()}}
    for grid in (TRAIN, LARGE):
        x = torch.randn(1, 1 + grid * grid, dim)
        with torch.no_grad():
            rotations = encoder(torch.tensor([[16 * grid] * 2]), dtype=torch.float32)
            out[f"liere.x{grid}"], out[f"liere.extrapolate{grid}.out"] = x, attn(x, rotations)
    return out


if __name__ == "__main__":
    comrope_root, liere_root = map(Path, sys.argv[1:3])
    torch.save({**comrope(comrope_root), **liere(liere_root)}, OUT)
    print(f"wrote {OUT}")

"""PaPE and PaPE-RI: a content-dependent parabolic attention bias, written into q and k as extra channels.

Koo Øhrstrøm et al., arXiv:2602.01418, 2026; github.com/DTU-PAS/parabolic-position-encoding at 21cb390. A head's
parabolas become 5 channels for any count (PaPE-RI: 3); docs/models.md, "Parabolic biases", has the derivation. The
official image classifiers, a folder of ``config.json`` and ``model.pt``, are our
``vit_rope_*_patch16_{pape,pape_ri}_224``, keys mapped one to one (``FORMAT``); the format does not save the training
grid: 224 x 224, as the ImageNet classifiers train."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import PatchEmbed, register_notrace_module
from torch import Tensor, nn

from vit_rope.checks import check_choice
from vit_rope.encodings.base import BlockInput, EncodingSpec, PositionEncoding, Positions, register
from vit_rope.encodings.policies import ResolutionPolicy, per_sample
from vit_rope.weights import Converted, Folder, Format, renamed_key

PAPE_KINDS = ("pape", "pape_ri")

PARABOLAS = 50  # the official default (pape/configs.py, PaPEConfig.parabolas)


def check_parabolas(parabolas: int) -> int:
    if isinstance(parabolas, bool) or not isinstance(parabolas, int) or parabolas < 1:
        raise ValueError(f"parabolas={parabolas!r} must be a whole number of parabolas per head, at least 1 (the "
                         f"paper's default is {PARABOLAS}).")
    return parabolas


def pape_positions(coord: Tensor, grids: Tensor, policy: str, train_grid: tuple[int, int] | None) -> Tensor:
    """The official ``(col + 1, row + 1)``, as they are, divided by the grid or scaled to the training grid."""
    xy = coord.flip(-1).float() + 1.0
    if policy == "extrapolate":
        return xy
    size = per_sample(grids.flip(-1).float(), coord)  # [2] or [B, 1, 2] (w, h)
    if policy == "normalized" or train_grid is None:
        return xy / size
    return xy * xy.new_tensor([float(train_grid[1]), float(train_grid[0])]) / size


class ParabolaLayer(nn.Module):
    """What PaPE's and PaPE-RI's layers share: ``forward`` appends their channels to q and k (to a multiple of 4) and
    zero-pads v to that width, as CPU's SDPA flash kernel takes no narrower v (its fallback is slower); attention cuts
    the output back. The weights keep the official names."""

    def __init__(self, dim: int, num_heads: int, parabolas: int, width: int) -> None:
        super().__init__()
        self.num_heads, self.parabolas = num_heads, parabolas
        self.pad = -(dim // num_heads + width) % 4  # known here, so that FX traces no shape arithmetic
        self.widen = width + self.pad  # channels q, k and v gain

    def channels(self, x: Tensor, positions: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """The extra channels of q (pieces ``[B, N, nh, *]``) and of k (``[1 or B, N, nh or 1, *]``), in order."""
        raise NotImplementedError

    def forward(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q_extra, k_extra = self.channels(x, positions)
        B, H, N, _ = q.shape
        zero = q.new_zeros(())

        def widen(t: Tensor, extra: list[Tensor], pad: int) -> Tensor:
            pieces = [t.transpose(1, 2), *(e.to(t.dtype).expand(B, N, H, -1) for e in extra)]
            return torch.cat([*pieces, zero.expand(B, N, H, pad)], -1).transpose(1, 2)  # [B, nh, N, D + E]

        return widen(q, q_extra, self.pad), widen(k, k_extra, self.pad), widen(v, [], self.widen)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, parabolas={self.parabolas}"


@register_notrace_module
class PaPELayer(ParabolaLayer):
    """One layer's PaPE: learned directions (``position``) and the projection of each query's coefficients (``ab``)."""

    def __init__(self, dim: int, num_heads: int, parabolas: int = PARABOLAS) -> None:
        super().__init__(dim, num_heads, check_parabolas(parabolas), 5)
        self.position = nn.Linear(2, num_heads * parabolas, bias=False)
        self.ab = nn.Linear(dim, 2 * num_heads * parabolas, bias=False)

    def channels(self, x: Tensor, positions: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        pos = positions.to(x.dtype)  # [b, N, 2] (x, y)
        p = self.position(pos).unflatten(-1, (self.num_heads, -1))  # [b, N, nh, F]
        ab = self.ab(x).unflatten(-1, (2, self.num_heads, -1))  # [B, N, 2, nh, F]
        a = F.softplus(ab[:, :, 0])
        c = torch.addcmul(-ab[:, :, 1], a, p, value=2)  # [B, N, nh, F] the key position's coefficient
        w = self.position.weight.to(x.dtype).unflatten(0, (self.num_heads, -1))  # [nh, F, 2]
        wx, wy = w.unbind(-1)
        square = torch.stack((wx * wx, 2 * wx * wy, wy * wy), -1)  # [nh, F, 3]: p^2 in x^2, xy, y^2
        q_extra = [torch.einsum("bnhf,hfk->bnhk", a, -square), torch.einsum("bnhf,hfk->bnhk", c, w)]  # [B, N, nh, 3], 2
        px, py = pos.unbind(-1)
        return q_extra, [torch.stack((px * px, px * py, py * py, px, py), -1)[:, :, None]]  # k: [b, N, 1, 5]


@register_notrace_module
class PaPERILayer(ParabolaLayer):
    """One layer's PaPE-RI: a fixed random scale per head (saved, as officially) and each query's curvature."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__(dim, num_heads, 1, 3)
        bound = math.sqrt(1 / 2)  # the official sqrt(1 / num_positions), two coordinates
        self.register_buffer("position_scales", (2 * torch.rand(1, num_heads, 1, 1) - 1) * bound)
        self.a = nn.Linear(dim, num_heads, bias=False)

    def channels(self, x: Tensor, positions: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        p = positions.to(x.dtype)[:, :, None] * self.position_scales.to(x.dtype).view(1, 1, -1, 1)  # [b, N, nh, 2]
        a = F.softplus(self.a(x))[..., None]  # [B, N, nh, 1]
        return [a, 2 * a * p], [-p.square().sum(-1, keepdim=True), p]


class Parabolas(BlockInput):
    """Every token's position ``[1 or B, P + N, 2]``, from which each block's ``attn.pape`` widens q, k and v."""

    def __init__(self, positions: Tensor) -> None:
        self.positions = positions

    def project(self, attn: nn.Module, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = super().project(attn, x)
        layer = getattr(attn, "pape", None)  # None: the layer removed, attention without the parabolas
        return (q, k, v) if layer is None else layer(x, q, k, v, self.positions)


@register_notrace_module
class ParabolicEncoding(PositionEncoding):
    """PaPE or PaPE-RI: every token's official position, handed to each block's ``ParabolaLayer``."""

    policies = ("extrapolate", "interpolate", "normalized")

    def __init__(self, kind: str, depth: int, train_grid: tuple[int, int] | None = None,
                 policy: str | dict | ResolutionPolicy | None = None, parabolas: int | None = None) -> None:
        super().__init__(check_choice(kind, PAPE_KINDS, "parabolic encoding"), depth, train_grid, policy)
        if kind == "pape_ri" and parabolas is not None:
            raise ValueError(f"parabolas={parabolas!r} sets PaPE (encoding='pape'); PaPE-RI has one parabola per "
                             "head, in the Euclidean offset: leave it unset.")
        self.parabolas = None if kind == "pape_ri" else check_parabolas(PARABOLAS if parabolas is None else parabolas)

    def refusal(self, policy: str) -> str:
        return (f"Policy {policy!r} does not apply to {self.kind}, a parabolic bias: ntk and yarn rescale RoPE "
                "frequencies, which it has none of. Use 'extrapolate' (positions as they are), 'interpolate' "
                "(positions scaled to the training grid) or 'normalized' (positions divided by the grid, PaPE's "
                "normalize option).")

    def attach_(self, blocks: nn.ModuleList, dim: int, num_heads: int) -> None:
        """Each block's attention gets its own layer (``pape``: the official checkpoints' weights are per layer)."""
        for blk in blocks:
            blk.attn.pape = PaPELayer(dim, num_heads, self.parabolas) if self.parabolas else PaPERILayer(dim, num_heads)

    def place(self, coord: Tensor, grids: Tensor) -> Tensor:
        return pape_positions(coord, grids, self.policy_name, self.train_grid)

    def forward(self, positions: Positions, num_prefix_tokens: int = 0) -> Tensor:
        """Every token's position ``[1 or B, P + N, 2]``, prefix tokens at the origin."""
        coords = positions.coords.reshape(-1, positions.coords.shape[-2], 2)  # [1 or B, N, 2]
        return F.pad(coords.float(), (0, 0, num_prefix_tokens, 0))

    def block_inputs(self, positions: Positions, num_prefix_tokens: int) -> list[Any]:
        return [Parabolas(self(positions, num_prefix_tokens))] * self.depth

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", parabolas={self.parabolas}" if self.parabolas else "")


@register("pape_ri")
@register("pape", options=("parabolas",))
def _parabolic(spec: EncodingSpec) -> PositionEncoding:
    return ParabolicEncoding(spec.kind, spec.depth, spec.train_grid, spec.policy, **spec.options)


CONFIG, WEIGHTS = "config.json", "model.pt"
FORMAT_NAME = "PaPE's official ImageClassifier"
# pape/configs.py MODEL_SIZES: (hidden_size, head_size, num_heads, num_layers, intermediate_size); -1 in config.json
# takes the size's value
SIZES = {"nano": (128, 32, 4, 4, 256), "tiny": (256, 64, 4, 7, 512), "small": (512, 64, 8, 10, 2048),
         "base": (768, 64, 12, 12, 3072)}
FIELDS = ("hidden_size", "head_size", "num_heads", "num_layers", "intermediate_size")
TRAIN_SIZES = {"imagenet": 224}  # pape/imagenet.py HEIGHT = WIDTH = 224: the grid the format does not save
# the official keys (after encoder.layers.{i}.) -> ours (after blocks.{i}.)
_LAYER_KEYS = {"attention.qkv_proj": "attn.qkv", "attention.out_proj": "attn.proj", "ffn.fc1": "mlp.fc1",
               "ffn.fc2": "mlp.fc2", "attention.position_encoder": "attn.pape", "norm1": "norm1", "norm2": "norm2"}
_TOP_KEYS = {"cls": "cls_token", "embedding.": "patch_embed.proj.", "encoder.norm_pre.": "norm_pre.",
             "encoder.norm_post.": "norm.", "classifier.": "head."}
_KIND_KEYS = {"pape": "position_encoder.ab.weight", "pape_ri": "position_encoder.a.weight"}


def is_pape_checkpoint(state_dict: Mapping[str, Any]) -> bool:
    keys = [key.removeprefix("_orig_mod.") for key in state_dict]
    return "cls" in keys and any(key.startswith("encoder.layers.") for key in keys)


def _sizes(config: dict[str, Any]) -> dict[str, int]:
    model = config.get("model", {})
    size = model.get("size", "base")
    if size not in SIZES:
        raise ValueError(f"config.json has model.size={size!r}; PaPE's sizes are {', '.join(SIZES)}.")
    return {field: default if model.get(f"_{field}", -1) == -1 else int(model[f"_{field}"])
            for field, default in zip(FIELDS, SIZES[size], strict=True)}


def biased_patch_embed(*args: Any, bias: bool = True, **kwargs: Any) -> PatchEmbed:
    """timm's ``PatchEmbed`` with a bias, which timm drops under ``pre_norm`` and the official convolution keeps."""
    return PatchEmbed(*args, bias=True, **kwargs)


def pape_args_from_config(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The vit_rope model name and ``timm.create_model`` arguments of the official classifier ``config`` describes."""
    kind = config.get("positional")
    if kind not in _KIND_KEYS:
        raise ValueError(f"config.json has positional={kind!r}; vit_rope builds the official PaPE classifiers, "
                         f"positional {' or '.join(map(repr, _KIND_KEYS))}.")
    dataset = config.get("dataset")
    if dataset not in TRAIN_SIZES:
        raise ValueError(f"config.json has dataset={dataset!r}; vit_rope builds the official image classifiers "
                         f"(dataset {', '.join(map(repr, TRAIN_SIZES))}), whose training size it knows.")
    s = _sizes(config)
    if s["head_size"] * s["num_heads"] != s["hidden_size"]:
        raise ValueError(f"config.json has head_size={s['head_size']} x num_heads={s['num_heads']} != hidden_size="
                         f"{s['hidden_size']}; vit_rope's attention has heads that split the width.")
    size = config["model"].get("size", "base")
    name = f"vit_rope_{'tiny' if size == 'nano' else size}_patch16_{kind}_224"
    kwargs = dict(embed_dim=s["hidden_size"], depth=s["num_layers"], num_heads=s["num_heads"],
                  mlp_ratio=s["intermediate_size"] / s["hidden_size"], patch_size=int(config.get("patch_size", 16)),
                  img_size=TRAIN_SIZES[dataset], num_classes=1000, pre_norm=True, qkv_bias=True,
                  init_values=0.0,  # no LayerScale (timm.create_model drops arguments that are None)
                  norm_layer=partial(nn.LayerNorm, eps=1e-5), embed_layer=biased_patch_embed, class_token=True,
                  global_pool="token",
                  resolution_policy="normalized" if config.get("normalize") else "extrapolate")
    if kind == "pape":
        kwargs["encoding_options"] = {"parabolas": int(config.get("pape", {}).get("parabolas", PARABOLAS))}
    return name, kwargs


def check_model(config: dict[str, Any], model: nn.Module) -> None:
    """Raise unless ``model`` is the classifier that ``config`` describes, naming the first field that differs."""
    name, kwargs = pape_args_from_config(config)
    kind = getattr(model, "encoding_kind", None)
    if kind != config["positional"]:
        raise ValueError(f"config.json describes an official {config['positional']} classifier, whose weights load "
                         f"into {name}; this model has encoding={kind!r}. Build it with "
                         "vit_rope.create_from_checkpoint(folder).")
    attn, s = model.blocks[0].attn, _sizes(config)
    fields = {  # field: (the file's value, the model's)
        "hidden_size": (s["hidden_size"], model.embed_dim), "num_layers": (s["num_layers"], len(model.blocks)),
        "num_heads": (s["num_heads"], attn.num_heads), "intermediate_size": (s["intermediate_size"],
                                                                             model.blocks[0].mlp.fc1.out_features),
        "patch_size": (kwargs["patch_size"], model.patch_embed.patch_size[0]),
        "pape.parabolas": (kwargs.get("encoding_options", {}).get("parabolas"), model.pos_encoding.parabolas),
        "normalize (the resolution policy)": (kwargs["resolution_policy"], model.resolution_policy.name),
        "norm_pre (LayerNorm before the blocks)": (True, isinstance(model.norm_pre, nn.LayerNorm)),
    }
    for field, (theirs, ours) in fields.items():
        if theirs != ours:
            raise ValueError(f"config.json does not fit the model: {field} is {theirs} in the file, {ours} in the "
                             f"model. Build {name} with {kwargs} "
                             "(vit_rope.create_from_checkpoint(folder) builds and loads it).")


def check_weights(config: dict[str, Any], state_dict: dict[str, Any]) -> None:
    """Raise unless the official ``state_dict`` is the classifier ``config`` describes."""
    _, kwargs = pape_args_from_config(config)
    s, weights = _sizes(config), {key.removeprefix("_orig_mod."): v for key, v in state_dict.items()}
    kind = config["positional"]
    layers = {int(key.split(".")[2]) for key in weights if key.startswith("encoder.layers.")}
    if not any(key.endswith(_KIND_KEYS[kind]) for key in weights):
        other = next((k for k, marker in _KIND_KEYS.items() if any(key.endswith(marker) for key in weights)), None)
        raise ValueError(f"config.json has positional={kind!r}, model.pt holds the weights of {other!r}: the folder "
                         f"mixes two models; positional={other!r} fits its weights.")
    first = "encoder.layers.0.attention."
    heads_times = (s["num_heads"] * kwargs["encoding_options"]["parabolas"], "num_heads x pape.parabolas",
                   weights[first + "position_encoder.position.weight"].shape[0]) if kind == "pape" else \
        (s["num_heads"], "num_heads", weights[first + "position_encoder.position_scales"].shape[1])
    fields = {  # field: (config.json's value, the weights')
        "hidden_size": (s["hidden_size"], weights["cls"].shape[-1]), "num_layers": (s["num_layers"], len(layers)),
        "num_heads x head_size": (s["num_heads"] * s["head_size"], weights[first + "qkv_proj.weight"].shape[0] // 3),
        "intermediate_size": (s["intermediate_size"], weights["encoder.layers.0.ffn.fc1.weight"].shape[0]),
        "patch_size": (kwargs["patch_size"], weights["embedding.weight"].shape[-1]),
        heads_times[1]: (heads_times[0], heads_times[2]),
    }
    for field, (theirs, found) in fields.items():
        if theirs != found:
            raise ValueError(f"config.json and model.pt disagree: {field} is {theirs} in config.json, {found} in the "
                             f"weights. Save the folder again from one model, or set {field} to {found} in config.json "
                             "if the weights are right.")


def from_pape(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    """An official ``ImageClassifier`` state dict in our keys, for ``model``; the caller checks the shapes."""
    state_dict = {key.removeprefix("_orig_mod."): value for key, value in state_dict.items()}
    theirs = next((kind for kind, marker in _KIND_KEYS.items() if any(k.endswith(marker) for k in state_dict)), None)
    ours = getattr(model, "encoding_kind", None)
    if theirs != ours:
        raise ValueError(f"The checkpoint is {FORMAT_NAME} with encoding {theirs!r}; the model has encoding={ours!r}: "
                         f"load it into a vit_rope_*_patch16_{theirs}_224 model (vit_rope.create_from_checkpoint "
                         "builds the one its folder describes).")
    out = {}
    for key, value in state_dict.items():
        match = re.fullmatch(r"encoder\.layers\.(\d+)\.(attention\.position_encoder|attention\.\w+|ffn\.\w+|norm\d)"
                             r"\.(.+)", key)
        if match:
            out[f"blocks.{match[1]}.{_LAYER_KEYS[match[2]]}.{match[3]}"] = value
            continue
        out[renamed_key(key, _TOP_KEYS)] = value
    return out, (f"{FORMAT_NAME}: keys renamed to ours",)


FORMAT = Format(FORMAT_NAME, "'cls' and 'encoder.layers.*' keys", is_pape_checkpoint, from_pape,
                folder=Folder(CONFIG, WEIGHTS, lambda config: {"positional", "pape"} <= set(config),
                              pape_args_from_config, check_model, check_weights))

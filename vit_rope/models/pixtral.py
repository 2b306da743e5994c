"""Twins of Pixtral's vision encoder (transformers 5.24's ``PixtralVisionModel``): ``vit_rope_pixtral_vit_*``. Pixtral
12B (arXiv:2410.07073) reads images at their own size, with 2D RoPE on integer patch indices (x and y on alternate rungs
of one frequency ladder), several images as one sequence with block-diagonal attention (a NaFlex batch). ``*_llava``
adds Llava's projector. Loads transformers' files without transformers (docs/models.md)."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import torch
from timm.layers import GluMlp, Mlp, get_act_layer, get_device_dtype, to_2tuple
from torch import Tensor, nn

from vit_rope.encodings.rope.dinov3_rope import permute_qk_rows, qk_permutation
from vit_rope.layers.rms_norm import RmsNorm
from vit_rope.models.twins import ROTATE_HALF, conversion_notes
from vit_rope.models.vit import RoPEVisionTransformer
from vit_rope.weights import Converted, Description, check_config_fields, check_twin, depth_of

SOURCE = "Hugging Face transformers' PixtralVisionModel (or a Llava with its vision_tower)"
MODEL_TYPES = ("pixtral", "llava", "mistral3")  # the config.json model types this format claims (mistral3: refused)
_ACTS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
_COMMON = dict(class_token=False, pos_embed="none", pre_norm=True, final_norm=False, fc_norm=False, qkv_bias=False,
               proj_bias=False, norm_layer=partial(RmsNorm, eps=1e-5), mlp_layer=partial(GluMlp, gate_last=False),
               mlp_ratio=8.0, act_layer="silu", encoding="axial", rope_theta=1e4, rope_alternate_axes=True,
               resolution_policy="extrapolate", qk_layout="rotate_half", global_pool="avg", num_classes=0,
               embed_dim=1024, depth=24, num_heads=16)  # mlp_ratio: GluMlp's gate and value rows, 2 x 4096
# twin name (without vit_rope_) -> arguments; rope_ref_grid: the largest grid the encoder was trained on
PIXTRAL: dict[str, dict[str, Any]] = {
    "pixtral_vit_12b": dict(_COMMON, img_size=1024, patch_size=16, rope_ref_grid=(64, 64)),  # Pixtral-12B
    "pixtral_vit_12b_llava": dict(_COMMON, img_size=1024, patch_size=16, rope_ref_grid=(64, 64), projector_dim=5120),
    "pixtral_vit_mistral_small_3_1": dict(_COMMON, img_size=1540, patch_size=14, rope_ref_grid=(110, 110)),
}
_BY_PATCH = {16: "pixtral_vit_12b", 14: "pixtral_vit_mistral_small_3_1"}
_LAYER = r"transformer\.layers\.(\d+)\."
_PREFIX = r"(model\.)?(vision_tower\.)?"  # a Llava's (transformers 5: model.) tower prefix
_TOWER = re.compile("^" + _PREFIX)


class PixtralVisionTransformer(RoPEVisionTransformer):
    """With Llava's projector to ``projector_dim``, the LLM's width (0: none), its act timm's ``projector_act``."""

    def __init__(self, projector_dim: int = 0, projector_bias: bool = True, projector_act: str = "gelu",
                 **kwargs: Any) -> None:
        num_classes = kwargs.pop("num_classes", 0)
        super().__init__(num_classes=0, **kwargs)
        self.projector = Mlp(self.embed_dim, projector_dim, projector_dim, act_layer=get_act_layer(projector_act),
                             bias=projector_bias, **get_device_dtype(self)) if projector_dim else None
        self.head_hidden_size = projector_dim or self.embed_dim
        self.reset_classifier(num_classes)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """timm's head; with a projector, over the mean of its tokens (classifying what the language model reads)."""
        projector = getattr(self, "projector", None)
        super().reset_classifier(num_classes if projector is None else 0, global_pool)
        if num_classes > 0 and projector is not None:  # the head over the projector's width
            self.num_classes = num_classes
            self.head = nn.Linear(self.head_hidden_size, num_classes, **get_device_dtype(self)).train(self.training)

    def forward_head(self, x: Tensor, pre_logits: bool = False, patch_valid: Tensor | None = None) -> Tensor:
        """timm's head, or with a projector its tokens (``pre_logits``: before it), pooled into a head given classes."""
        if self.projector is None or self.num_classes:
            return super().forward_head(x if self.projector is None else self.projector(x), pre_logits, patch_valid)
        return x if pre_logits else self.projector(x)


def is_pixtral(state_dict: dict[str, Any]) -> bool:
    """transformers' Pixtral weights: its patch convolution, bare or under a Llava's ``(model.)vision_tower.``."""
    return any(_TOWER.sub("", key) == "patch_conv.weight" for key in state_dict)


def describe_pixtral(state_dict: dict[str, Any]) -> Description:
    """The twin by patch size, depth and projector; width 1024 only, as the keys do not show the head count."""
    conv = next(value for key, value in state_dict.items() if _TOWER.sub("", key) == "patch_conv.weight")
    depth = depth_of(state_dict, _PREFIX + r"transformer\.layers")
    args: dict[str, Any] = {"depth": depth} if depth else {}
    fc1 = next((v for k, v in state_dict.items() if k.endswith("multi_modal_projector.linear_1.weight")), None)
    name = _BY_PATCH.get(int(conv.shape[-1]))
    if fc1 is not None:
        name = "pixtral_vit_12b_llava" if name == "pixtral_vit_12b" else None
        args.update(projector_dim=int(fc1.shape[0]),
                    projector_bias=any(k.endswith("multi_modal_projector.linear_1.bias") for k in state_dict))
    return (f"vit_rope_{name}" if name and conv.shape[0] == 1024 else None), args


def from_pixtral(state_dict: dict[str, Tensor], model: nn.Module) -> Converted:
    """transformers' Pixtral (or Llava) state dict in our keys and q/k layout, the language model dropped."""
    check_twin(model, isinstance(model, PixtralVisionTransformer), SOURCE, "the vit_rope_pixtral_vit_* twins "
               "(vit_rope.create_from_checkpoint(folder) builds the one that fits)", "rotate_half", "rotate-half pairs")
    if not model.pos_encoding[0].alternate_axes:
        raise ValueError(f"The checkpoint is {SOURCE}, whose x and y take alternate RoPE frequencies, but the model "
                         "has rope_alternate_axes=False: keep the twin's True.")
    heads = model.blocks[0].attn.num_heads
    index = qk_permutation("rotate_half", model.embed_dim // heads)
    renames = (("patch_conv.", "patch_embed.proj."), ("ln_pre.", "norm_pre."), ("attention_norm.", "norm1."),
               ("ffn_norm.", "norm2."), ("attention.o_proj.", "attn.proj."), ("feed_forward.down_proj.", "mlp.fc2."),
               ("multi_modal_projector.linear_1.", "projector.fc1."),
               ("multi_modal_projector.linear_2.", "projector.fc2."))
    out, parts, language, projector = {}, {}, [], []
    for key, value in state_dict.items():
        if re.match(r"(model\.)?language_model\.|lm_head\.", key):
            language.append(key)
            continue
        key = re.sub(_LAYER, r"blocks.\1.", _TOWER.sub("", key))
        if key.startswith("multi_modal_projector.") and model.projector is None:
            projector.append(key)
            continue
        if m := re.fullmatch(r"(blocks\.\d+\.)(attention\.[qkv]_proj|feed_forward\.(?:gate|up)_proj)\.weight", key):
            parts.setdefault(m.group(1), {})[m.group(2).split(".")[1][:-5]] = value
            continue
        for old, new in renames:
            key = key.replace(old, new)
        out[key] = value
    for block, p in parts.items():
        if len(p) != 5:
            raise ValueError(f"The checkpoint ({SOURCE}) has {sorted(p)} of {block[:-1]}'s q/k/v and gate/up "
                             "projections, not all five: it is incomplete; save it again from the model.")
        out[block + "attn.qkv.weight"] = permute_qk_rows(torch.cat([p["q"], p["k"], p["v"]]), index, heads)
        out[block + "mlp.fc1.weight"] = torch.cat([p["gate"], p["up"]])
    return out, conversion_notes(SOURCE, f"q/k/v fused, {ROTATE_HALF}, gate and up projections packed", projector,
                                 "projector; the vit_rope_pixtral_vit_12b_llava twin keeps it", language and
                                 f"the language model's {len(language)} tensors (language_model.*, lm_head.*) "
                                 "dropped: vit_rope runs the vision tower and its projector only")


def pixtral_args_from_config(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The twin and arguments of a config.json (``PixtralVisionConfig`` or a Llava's), transformers' defaults in."""
    if config.get("model_type") == "mistral3":
        raise ValueError("config.json has model_type 'mistral3' (Mistral Small 3.1 / 3.2): its projector merges 2x2 "
                         "patches, which vit_rope does not model. Save its model.vision_tower as a PixtralVisionModel "
                         "folder and load that into vit_rope_pixtral_vit_mistral_small_3_1.")
    llava = config if config.get("model_type") == "llava" else {}  # the Llava around the vision config, if any
    v = (config.get("vision_config") or {}) if llava else config
    if llava and v.get("model_type") != "pixtral":
        raise ValueError(f"config.json is a Llava whose vision_config has model_type {v.get('model_type')!r}: "
                         "vit_rope's Llava twins have Pixtral's encoder (vit_rope_pixtral_vit_12b_llava); a CLIP tower "
                         "runs in timm's own models.")
    v = dict(dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                  num_channels=3, image_size=1024, patch_size=16, hidden_act="gelu", attention_dropout=0.0), **v)
    rope = v.get("rope_parameters") or {}
    theta, rope_type = rope.get("rope_theta", v.get("rope_theta", 1e4)), rope.get("rope_type", "axial")
    dim, heads = v["hidden_size"], v["num_attention_heads"]
    refusals = {  # field: (does the twin model its value, what it takes)
        "hidden_act": (v["hidden_act"] in _ACTS, f"one of {', '.join(_ACTS)}"),
        "rope_parameters.rope_type": (rope_type in ("axial", "default"), "'axial' (Pixtral's 2D RoPE)"),
        "head_dim": (v.get("head_dim", dim // heads) == dim // heads, f"hidden_size / num_attention_heads = "
                                                                      f"{dim // heads}"),
        "vision_feature_layer": (llava.get("vision_feature_layer", -1) in (-1, v["num_hidden_layers"]),
                                 "-1 (the last layer's tokens)"),
        "vision_feature_select_strategy": (llava.get("vision_feature_select_strategy", "full") == "full",
                                           "'full' (Pixtral has no class token to crop)"),
        "projector_hidden_act": (llava.get("projector_hidden_act", "gelu") in _ACTS, f"one of {', '.join(_ACTS)}"),
    }
    for field, (fits, takes) in refusals.items():
        if not fits:
            value = {**v, **llava, "rope_parameters.rope_type": rope_type}.get(field)
            raise ValueError(f"config.json has {field}={value!r}, which the vit_rope_pixtral_vit_* twins do not model "
                             f"(they take {takes}).")
    patch, image = (int(to_2tuple(v[key])[0]) for key in ("patch_size", "image_size"))
    ratio = 2 * v["intermediate_size"] / dim  # GluMlp's rows: gate and value
    if int(dim * ratio) != 2 * v["intermediate_size"]:
        raise ValueError(f"config.json has intermediate_size={v['intermediate_size']}, which no MLP ratio of "
                         f"hidden_size={dim} gives in floating point: pick a width that is a ratio of it.")
    args = dict(embed_dim=dim, depth=v["num_hidden_layers"], num_heads=heads, mlp_ratio=ratio,
                in_chans=v["num_channels"], img_size=image, patch_size=patch, act_layer=_ACTS[v["hidden_act"]],
                rope_theta=float(theta), rope_ref_grid=(image // patch, image // patch),
                attn_drop_rate=float(v["attention_dropout"]))
    name = "pixtral_vit_12b_llava" if llava else _BY_PATCH.get(patch, "pixtral_vit_12b")
    if llava:
        args.update(projector_dim=int((llava.get("text_config") or {}).get("hidden_size", 4096)),
                    projector_bias=bool(llava.get("multimodal_projector_bias", True)),
                    projector_act=_ACTS[llava.get("projector_hidden_act", "gelu")])
    return f"vit_rope_{name}", args


def check_pixtral_config(config: dict[str, Any], model: nn.Module) -> None:
    """Raise unless ``model`` is the twin of ``config``, naming the first field that differs and the twin that fits."""
    name, args = pixtral_args_from_config(config)
    if not isinstance(model, PixtralVisionTransformer):
        raise ValueError(f"config.json describes {SOURCE}, which loads into {name}; the model is a "
                         f"{type(model).__name__} (vit_rope.create_from_checkpoint(folder) builds the twin).")
    block, projector = model.blocks[0], model.projector
    fields = {  # field: (the file's value, the model's)
        "hidden_size": (args["embed_dim"], model.embed_dim), "num_hidden_layers": (args["depth"], len(model.blocks)),
        "num_attention_heads": (args["num_heads"], block.attn.num_heads),
        "intermediate_size": (args["mlp_ratio"] * args["embed_dim"] / 2, block.mlp.fc2.in_features),
        "patch_size": (args["patch_size"], model.patch_embed.patch_size[0]),
        "num_channels": (args["in_chans"], model.patch_embed.proj.in_channels),
        "hidden_act": (type(get_act_layer(args["act_layer"])()).__name__, type(block.mlp.act).__name__),
        "rope_theta": (args["rope_theta"], model.pos_encoding[0].theta),
        "text_config.hidden_size (projector)": (args.get("projector_dim", 0), projector.fc2.out_features
                                                if projector is not None else 0),
    }
    check_config_fields(fields, f"{name} with the config's sizes")

"""PaPE's official image classifiers (github.com/DTU-PAS/parabolic-position-encoding) as vit_rope models.

A folder of ``config.json`` and ``model.pt`` is our ``vit_rope_*_patch16_{pape,pape_ri}_224``, keys mapped one to one;
the format does not save the training grid: 224 x 224, as the ImageNet classifiers train (docs/models.md)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from timm.layers import PatchEmbed
from torch import nn

from vit_rope.encodings.pape.parabolas import PARABOLAS
from vit_rope.weights import Converted, Folder, Format, check_config_fields, renamed_keys

CONFIG, WEIGHTS = "config.json", "model.pt"
FORMAT_NAME = "PaPE's official ImageClassifier"
# pape/configs.py MODEL_SIZES, values in FIELDS' order; a -1 in config.json takes the size's value
SIZES = {"nano": (128, 32, 4, 4, 256), "tiny": (256, 64, 4, 7, 512), "small": (512, 64, 8, 10, 2048),
         "base": (768, 64, 12, 12, 3072)}
FIELDS = ("hidden_size", "head_size", "num_heads", "num_layers", "intermediate_size")
TRAIN_SIZES = {"imagenet": 224}  # pape/imagenet.py HEIGHT = WIDTH = 224: the grid the format does not save
# the official keys (after encoder.layers.{i}.) -> ours (after blocks.{i}.)
_LAYER_KEYS = {"attention.qkv_proj.": "attn.qkv.", "attention.out_proj.": "attn.proj.", "ffn.": "mlp.",
               "attention.position_encoder.": "attn.pape."}
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
                  global_pool="token", resolution_policy="normalized" if config.get("normalize") else "extrapolate")
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
    check_config_fields(fields, f"{name} with {kwargs}")


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
    notes = (f"{FORMAT_NAME}: keys renamed to ours",)
    return renamed_keys(state_dict, _TOP_KEYS, "encoder.layers.", _LAYER_KEYS), notes


FORMAT = Format(FORMAT_NAME, "'cls' and 'encoder.layers.*' keys", is_pape_checkpoint, from_pape,
                folder=Folder(CONFIG, WEIGHTS, lambda config: {"positional", "pape"} <= set(config),
                              pape_args_from_config, check_model, check_weights))

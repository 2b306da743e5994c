"""LookHere's official checkpoints (github.com/GreenCUBIC/lookhere, MIT): ``{"weights": ..., "config": ...}``: DeiT-III
in timm's keys, which load as they are into a ``vit_rope_*_lookhere_*`` model built with ``official_args``."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from torch import Tensor, nn

from vit_rope.encodings.bias.lookhere import check_config
from vit_rope.weights import Converted, Description, Format, depth_of, unwrap_state_dict


def is_lookhere_checkpoint(obj: Any) -> bool:
    """Whether ``obj`` is an official LookHere file: a ``weights`` state dict and a LookHere ``config``."""
    return (isinstance(obj, Mapping) and isinstance(obj.get("weights"), dict) and isinstance(obj.get("config"), dict)
            and "head_directions" in obj["config"])


def official_args(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The ``timm.create_model`` arguments of a ``*_lookhere_*`` model for the official file ``obj``."""
    weights = obj["weights"]
    args: dict[str, Any] = dict(encoding="lookhere", encoding_options={"config": obj["config"]},
                                norm_layer=partial(nn.LayerNorm, eps=1e-5), init_values=1e-4)
    for key, arg in (("head.fc1.weight", "head_hidden_dim"), ("head.fc2.weight", "num_classes")):
        if isinstance(weights.get(key), Tensor):
            args[arg] = int(weights[key].shape[0])
    return args


def describe(obj: Mapping[str, Any]) -> Description:
    """The LookHere model of the file: its width and depth, and ``official_args``."""
    depth, patches = depth_of(obj["weights"]), obj["weights"].get("patch_embed.proj.weight")
    shape = {**({"depth": depth} if depth else {}),
             **({"embed_dim": int(patches.shape[0])} if isinstance(patches, Tensor) else {})}
    return None, {**shape, **official_args(obj)}


def from_lookhere(obj: dict[str, Any], model: nn.Module) -> Converted:
    """The state dict of an official LookHere file, for a LookHere ``model`` of its config."""
    kind = getattr(model, "encoding_kind", None)
    if kind != "lookhere":
        raise ValueError(f"The checkpoint is an official LookHere one, the model's encoding is {kind!r}: load it into "
                         "a vit_rope_*_lookhere_* model (vit_rope.create_from_checkpoint builds the one it describes).")
    ours = model.pos_encoding.config
    theirs = check_config(obj["config"], model.pos_encoding.num_heads, len(model.blocks))
    if theirs != ours:
        raise ValueError(f"The checkpoint's LookHere config {theirs} differs from the model's {ours}: create the model "
                         "with encoding_options={'config': <the checkpoint's 'config'>}.")
    weights = dict(obj["weights"])
    if "head.fc1.weight" in weights and not hasattr(model.head, "fc1"):
        hidden = weights["head.fc1.weight"].shape[0]
        raise ValueError(f"The checkpoint's classifier is an MLP (hidden width {hidden}, Tanh), the model's a linear "
                         f"layer: create the model with head_hidden_dim={hidden} (vit_rope.create_from_checkpoint "
                         "builds the official ViT).")
    return unwrap_state_dict(weights), ("LookHere's official file: keys renamed to ours",)


FORMAT = Format("LookHere's official file", "top-level 'weights' and 'config' (with 'head_directions')",
                is_lookhere_checkpoint, from_lookhere, describe, official_args)

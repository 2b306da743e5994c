"""LookHere's official checkpoints (github.com/GreenCUBIC/lookhere, MIT) into ``vit_rope_*_lookhere_*`` models.

The official files are ``{"weights": state_dict, "config": config}``. Their ViT is DeiT-III's (class token, qkv
bias, LayerScale) with timm's key names, LayerNorm at eps 1e-5, no position embedding and a classifier MLP
``Linear -> Tanh -> Linear`` on the class token; the biases are not in the weights but rebuilt from the config. So
the weights load as they are into our model created with ``official=True`` (``official_lookhere_args``) and the
checkpoint's config::

    ckpt = torch.load("LH_180_weights_and_config.pth", weights_only=True)
    model = timm.create_model("vit_rope_base_patch16_lookhere_224", official=True, encoding_options={"config":
    ckpt["config"]}) vit_rope.load_weights(model, "LH_180_weights_and_config.pth")

``vit_rope.models.checkpoint`` calls ``from_lookhere`` for any file of that form, and the evaluation harness takes
the config and ``official=True`` from the file itself (``official_file_args``) unless ``--model-kwargs`` gives them.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from vit_rope.encodings.bias.lookhere import check_config
from vit_rope.models.weights_file import mapped_file


def official_lookhere_args(embed_dim: int, mlp_ratio: float = 4.0) -> dict[str, Any]:
    """What the official ViT differs from ours in, as ``timm.create_model`` arguments (what ``official=True`` adds to
    a ``*_lookhere_*`` model's): its LayerNorm eps, its LayerScale initialisation and its MLP classifier (hidden width
    ``mlp_ratio * embed_dim``)."""
    return dict(norm_layer=partial(nn.LayerNorm, eps=1e-5), init_values=1e-4,
                head_hidden_dim=int(embed_dim * mlp_ratio))


def is_lookhere_checkpoint(obj: Any) -> bool:
    """Whether ``obj`` is an official LookHere file: ``weights`` (a state dict) and ``config`` (LookHere's
    configuration)."""
    return (isinstance(obj, dict) and isinstance(obj.get("weights"), dict) and isinstance(obj.get("config"), dict)
            and "head_directions" in obj["config"])


def official_file_args(path: str | Path) -> dict[str, Any]:
    """What a ``*_lookhere_*`` model needs to load ``path`` if it is an official LookHere file: the file's
    LookHere configuration (``encoding_options``), ``official=True`` and its classifier's ``num_classes``; ``{}`` for
    any other file. Reads the file memory-mapped (the full read that loading does reports what is wrong with a bad
    one)."""
    obj = mapped_file(path)
    if not is_lookhere_checkpoint(obj):
        return {}
    classifier = obj["weights"].get("head.fc2.weight")  # the MLP head's output layer
    classes = {"num_classes": int(classifier.shape[0])} if isinstance(classifier, Tensor) else {}
    return {"encoding_options": {"config": obj["config"]}, "official": True, **classes}


def from_lookhere(obj: dict[str, Any], model: nn.Module) -> dict[str, Tensor]:
    """The state dict of an official LookHere file, checked against ``model``: a LookHere model with the same
    configuration and an MLP classifier. Tensor shapes are checked by the caller, which lists any that differ.

    Raises:
        ValueError: the model is not LookHere, its LookHere configuration differs from the checkpoint's, or it has a
        linear
            classifier where the checkpoint has an MLP; the message names both values and the fix.
    """
    kind = getattr(model, "encoding_kind", None)
    if kind != "lookhere":
        raise ValueError(f"The checkpoint is an official LookHere one, the model's encoding is {kind!r}: load it into "
                         "a vit_rope_*_lookhere_* model.")
    ours = model.pos_encoding.config
    theirs = check_config(obj["config"], model.pos_encoding.num_heads, len(model.blocks))
    if theirs != ours:
        raise ValueError(f"The checkpoint's LookHere config {theirs} differs from the model's {ours}: create the model "
                         "with encoding_options={'config': <the checkpoint's 'config'>}.")
    weights = dict(obj["weights"])
    if "head.fc1.weight" in weights and not hasattr(model.head, "fc1"):
        hidden = weights["head.fc1.weight"].shape[0]
        raise ValueError(f"The checkpoint's classifier is an MLP (hidden width {hidden}, Tanh), the model's a linear "
                         f"layer: create the model with official=True (or head_hidden_dim={hidden}).")
    return weights

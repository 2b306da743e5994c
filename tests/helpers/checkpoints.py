"""Weights files the loaders read: the weights of small models of each kind, and broken files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import timm
import torch
from safetensors.torch import save_file

import vit_rope  # noqa: F401  (registers the vit_rope_* models)


def save_source(kind: str, path: Path, **kwargs) -> Path:
    """The weights of a 2-block tiny model: an axial RoPE checkpoint, a plain timm ViT, or a mixed RoPE checkpoint."""
    name = {"axial": "vit_rope_tiny_patch16_axial_224", "plain_vit": "vit_tiny_patch16_224",
            "mixed": "vit_rope_tiny_patch16_mixed_224"}[kind]
    torch.save({"model": timm.create_model(name, depth=2, **kwargs).state_dict()}, path)
    return path


CORRUPT = {  # file name -> what safetensors / timm's torch.load says about it
    "garbage_header.safetensors": "header too large",
    "truncated.safetensors": "incomplete metadata",
    "truncated.pth": "PytorchStreamReader failed reading zip archive",
    "random.bin": "UnpicklingError: Unsupported operand",  # not torch's advice to retry with weights_only=False
    "empty.pth": "EOFError",
}


def write_corrupt(path: Path) -> Path:
    """A broken weights file of the kind its name in ``CORRUPT`` says, cut from a real 1-block checkpoint."""
    state = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1).state_dict()
    stem = path.name.split(".")[0]
    if stem == "truncated":
        if path.suffix == ".safetensors":
            save_file(state, str(path))
        else:
            torch.save(state, path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif stem == "garbage_header":  # the first 8 bytes give the header length
        path.write_bytes(b"\xff" * 8 + b"{}")
    elif stem == "random":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    else:
        path.write_bytes(b"")
    return path


def meta_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm's Eva state dict under Meta's DINOv3 names: storage tokens, one masked qkv bias, SwiGLU w1 / w2 / w3."""
    out = {"mask_token": torch.zeros(1, state["cls_token"].shape[-1])}
    swiglu = any(".mlp.fc1_g." in key for key in state)
    for key, value in state.items():
        key = key.replace("reg_token", "storage_tokens").replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma")
        if swiglu:
            key = key.replace("mlp.fc1_g", "mlp.w1").replace("mlp.fc1_x", "mlp.w2").replace("mlp.fc2", "mlp.w3")
        if key.endswith("attn.q_bias"):
            v_bias = state[key.replace("attn.q_bias", "attn.v_bias")]
            out[key.replace("q_bias", "qkv.bias")] = torch.cat((value, torch.full_like(value, 7.0), v_bias))  # k masked
            out[key.replace("q_bias", "qkv.bias_mask")] = torch.cat((torch.ones_like(value), torch.zeros_like(value),
                                                                     torch.ones_like(value)))
        elif not key.endswith("attn.v_bias"):
            out[key] = value
    out["rope_embed.periods"] = torch.ones(8)
    return out

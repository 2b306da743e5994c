"""Every checkpoint format in one table, each with a marker only it carries: all are asked, two claims are an error."""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from vit_rope.encodings import FORMATS as KIND_FORMATS
from vit_rope.models import deepseek_vit, gemma4_vit, hf_dinov3, hf_gemma4, pixtral, qwen2_5_vl, qwen3_vit, swin
from vit_rope.models.dinov3 import DINOV3_QK, architecture, dinov3_name, from_dinov3
from vit_rope.models.dinov3 import SIZES as DINOV3_SIZES
from vit_rope.models.eva_families import EVA_LAYOUTS, from_eva, is_eva
from vit_rope.models.twins import ProjectorTwin
from vit_rope.models.widths import size_of
from vit_rope.weights import Converted, Description, Folder, Format, depth_of, mapped_file, read_weights

ROPE_VIT_SIZES = ("tiny", "small", "base", "large")  # vit_rope_<size>_patch16_{axial,mixed}[_ape]_224
KIND_SIZES = ("tiny", "small", "base")  # vit_rope_<size>_patch16_<kind>_224 of the other kinds


def model_name(size: str, kind: str, ape: bool = False) -> str:
    return f"vit_rope_{size}_patch16_{kind}{'_ape' if ape else ''}_224"


def _size(state_dict: Mapping[str, Any], sizes: tuple[str, ...]) -> str | None:
    """The size of ``sizes`` whose width is the file's patch embedding's, or ``None``."""
    weight = state_dict.get("patch_embed.proj.weight")
    return None if weight is None else size_of(int(weight.shape[0]), sizes)


def _shape(state_dict: Mapping[str, Any]) -> dict[str, int]:
    """The file's ``depth`` and ``num_classes``, where it has blocks and a classifier."""
    depth, head = depth_of(state_dict), state_dict.get("head.weight")
    return {**({"depth": depth} if depth else {}), **({"num_classes": int(head.shape[0])} if head is not None else {})}


def _dinov3_name(state_dict: Mapping[str, Any]) -> str | None:
    swiglu = any(re.search(r"\.mlp\.(w12|w1|fc1_g)\.", key) for key in state_dict)
    size = _size(state_dict, tuple(size for size in DINOV3_SIZES if architecture(size)["swiglu"] == swiglu))
    qkv_bias = any(key.endswith((".attn.q_bias", ".attn.qkv.bias")) for key in state_dict)
    return None if size is None else dinov3_name(size, qkv_bias)


def _rope_vit_name(state_dict: Mapping[str, Any]) -> str | None:
    """The RoPE-ViT model of a port or file; ``None`` for axial without APE, which a plain ViT cannot be told from."""
    mixed = any(key in state_dict for key in ("freqs", "rope.freqs"))
    ape = "pos_embed" in state_dict
    size = _size(state_dict, ROPE_VIT_SIZES)
    return None if size is None or not (mixed or ape) else model_name(size, "mixed" if mixed else "axial", ape)


def _dinov3(state_dict: dict[str, Any], model: nn.Module, source: str) -> Converted:
    converted = from_dinov3(state_dict, model.blocks[0].attn.num_heads)
    return converted, (f"{source}: q / v biases joined into the qkv bias", DINOV3_QK)


def _meta_dinov3(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    if (kind := getattr(model, "encoding_kind", None)) != "dinov3":
        raise ValueError(f"The checkpoint is Meta's DINOv3 (it has storage_tokens), which loads into the "
                         f"vit_rope_*_patch16_dinov3* and vit_rope_*_patch16_lingbot models; this model has "
                         f"encoding={kind!r}.")
    return _dinov3(state_dict, model, "Meta's DINOv3")


def _timm_eva(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    if isinstance(model, ProjectorTwin):  # not an Eva architecture
        family = model.FAMILY
        files = {"DeepSeek": "deepseek_vit_*", "Gemma 4": "gemma4_vit_*"}.get(family, "qwen3_vit_*")
        raise ValueError(f"The checkpoint is timm's Eva (keys ending in '.attn.q_bias' or '.gamma_1'), which a "
                         f"{family} twin ({type(model).__name__}) does not take: load it into its Eva family's twin "
                         f"(vit_rope.from_timm names it); {family} twins load timm's {files} files.")
    if getattr(model, "qk_layout", None) in EVA_LAYOUTS:  # a twin of timm's Eva (Sapiens2's layout is rotate-half)
        return from_eva(state_dict, model)
    if getattr(model, "encoding_kind", None) == "dinov3":  # DINOv3 and LingBot: timm's layout is DINOv3's rotate-half
        return _dinov3(state_dict, model, "timm's Eva DINOv3")
    return state_dict, ()  # timm's RoPE-ViT ports, DeiT-III: their q / k rows are ours


def _describe_eva(state_dict: Mapping[str, Any]) -> Description:
    """timm's DINOv3 (registers, no APE) or RoPE-ViT port; the other Eva families share their keys: not named."""
    dinov3 = "reg_token" in state_dict and "pos_embed" not in state_dict
    return (_dinov3_name if dinov3 else _rope_vit_name)(state_dict), _shape(state_dict)


def _transformers(model_types: Container[str], model: Callable[[dict[str, Any]], Description],
                  check_model: Callable[[dict[str, Any], nn.Module], None]) -> Folder:
    return Folder("config.json", "model.safetensors", lambda config: config.get("model_type") in model_types, model,
                  check_model)


FORMATS: tuple[Format, ...] = (
    *KIND_FORMATS,  # LookHere's, PaPE's and LieRE's official files
    Format(hf_dinov3.HF_FORMAT, "'embeddings.patch_embeddings.weight'",  # a bare Conv2d, not ViT's .projection
           lambda state_dict: "embeddings.patch_embeddings.weight" in state_dict, hf_dinov3.from_hf_dinov3,
           folder=Folder("config.json", "model.safetensors", lambda config: "model_type" in config  # but the others'
                         and config["model_type"] not in (*pixtral.MODEL_TYPES, *qwen2_5_vl.MODEL_TYPES,
                                                          *hf_gemma4.MODEL_TYPES),
                         hf_dinov3.dinov3_args_from_hf_config, hf_dinov3.check_hf_config)),
    Format("Hugging Face transformers' ViT or DINOv2", "'embeddings.patch_embeddings.projection.weight'",
           lambda state_dict: any(key.endswith("embeddings.patch_embeddings.projection.weight") for key in state_dict),
           hf_dinov3.refuse_other_hf),
    Format("Meta's DINOv3", "'storage_tokens'", lambda state_dict: "storage_tokens" in state_dict, _meta_dinov3,
           lambda state_dict: (_dinov3_name(state_dict), _shape(state_dict))),
    Format("timm's Eva", "keys ending in '.attn.q_bias', '.attn.q_proj.weight' or '.gamma_1'", is_eva, _timm_eva,
           _describe_eva),
    Format(qwen3_vit.SOURCE, "'encoder.pos_embed' (classifiers) or 'merger.fc1.weight' (encoders)",
           qwen3_vit.is_qwen3, qwen3_vit.from_qwen3, qwen3_vit.describe_qwen3),
    Format(deepseek_vit.SOURCE, "'encoder.patch_embed.proj.weight' without 'encoder.pos_embed' (classifiers), "
           "'aligner.fc1.weight' (encoders) or 'vision.*' keys (DeepSeek's own shards)", deepseek_vit.is_deepseek,
           deepseek_vit.from_deepseek, deepseek_vit.describe_deepseek),
    Format(gemma4_vit.SOURCE, "'patch_embed.position_embedding_table' (encoders) or 'encoder.patch_embed."
           "position_embedding_table' (classifiers)", gemma4_vit.is_gemma4, gemma4_vit.from_gemma4,
           gemma4_vit.describe_gemma4),
    Format(hf_gemma4.HF_FORMAT, "keys ending in 'patch_embedder.position_embedding_table'", hf_gemma4.is_hf_gemma4,
           hf_gemma4.from_hf_gemma4, hf_gemma4.describe_hf_gemma4,
           folder=_transformers(hf_gemma4.MODEL_TYPES, hf_gemma4.gemma4_args_from_hf_config,
                                hf_gemma4.check_hf_config)),
    Format(pixtral.SOURCE, "keys '(model.)(vision_tower.)patch_conv.weight'", pixtral.is_pixtral, pixtral.from_pixtral,
           pixtral.describe_pixtral,
           folder=_transformers(pixtral.MODEL_TYPES, pixtral.pixtral_args_from_config, pixtral.check_pixtral_config)),
    Format(qwen2_5_vl.SOURCE, "keys ending in 'merger.ln_q.weight'", qwen2_5_vl.is_qwen25, qwen2_5_vl.from_qwen25,
           qwen2_5_vl.describe_qwen25,
           folder=_transformers(qwen2_5_vl.MODEL_TYPES, qwen2_5_vl.args_from_config, qwen2_5_vl.check_model)),
    Format("RoPE-ViT's official RoPE-Swin", "keys ending in 'attn.rope_t_x' or 'attn.rope_freqs'", swin.is_official,
           swin.from_official, swin.describe),
    Format("timm's or Microsoft's Swin Transformer", "'layers.*.attn.qkv.weight' keys and no RoPE-Swin marker",
           lambda state_dict: swin.is_swin(state_dict) and not swin.is_official(state_dict), swin.from_swin,
           swin.describe),
)
# a file without any other format's marker: timm's VisionTransformer keys, which are ours
VIT = Format("timm's VisionTransformer (vit_rope's own, timm's ViT and DeiT-III)", "'patch_embed.*' or "
             "'blocks.*' keys and no marker of the formats above",
             lambda state_dict: any(key.startswith(("patch_embed.", "blocks.")) for key in state_dict),
             lambda state_dict, model: (state_dict, ()), lambda state_dict: (None, _shape(state_dict)))


def checkpoint_format(state_dict: Mapping[str, Any]) -> Format:
    """The format whose marker ``state_dict`` (unwrapped) carries; ``ValueError`` when two do, or none and no ViT."""
    claims = [fmt for fmt in FORMATS if fmt.carries(state_dict)]
    if len(claims) > 1:
        found = "; ".join(f"{fmt.name} ({fmt.marker})" for fmt in claims)
        raise ValueError(f"The checkpoint carries the markers of {len(claims)} formats: {found}. A file is in one "
                         "format: save it again from the model that wrote it, or remove the other format's keys.")
    if claims or VIT.carries(state_dict):
        return claims[0] if claims else VIT
    keys = list(state_dict)
    shown = ", ".join(map(str, keys[:5])) + (f", ... ({len(keys)} keys)" if len(keys) > 5 else "")
    known = "; ".join(f"{fmt.name}: {fmt.marker}" for fmt in (*FORMATS, VIT))
    raise ValueError(f"The checkpoint is in no format vit_rope reads: its keys are {shown or 'none'}. The formats and "
                     f"their markers: {known}.")


def folder_format(path: str | Path) -> tuple[Format, dict[str, Any]] | None:
    """The format whose config file the folder ``path`` holds (or its weights file sits beside), with the config."""
    found = [(fmt, config) for fmt in FORMATS if fmt.folder is not None
             and (config := fmt.folder.config(path)) is not None]
    if len(found) > 1:
        raise ValueError(f"{path} holds the config of {len(found)} formats ({', '.join(f.name for f, _ in found)}): "
                         "keep one model's files in a folder.")
    return found[0] if found else None


def weights_in(path: str | Path) -> Path:
    """The weights file of ``path``: itself, a folder format's weights file in it, or the index of its shards."""
    path = Path(path)
    if not path.is_dir():
        return path
    names = sorted({fmt.folder.weights_name for fmt in FORMATS if fmt.folder is not None})
    found = [path / file for name in names for file in (name, f"{name}.index.json") if (path / file).is_file()]
    if not found:
        raise FileNotFoundError(f"No weights file in the folder {path} (it holds "
                                f"{sorted(p.name for p in path.iterdir())}): give the weights file itself, or a folder "
                                f"with {' or '.join(names)} and its config.json.")
    return found[0]


def describe(path: str | Path) -> Description:
    """The model name (``None``: unsaid) and arguments of the weights in ``path``; a kind's arguments name its model."""
    path = weights_in(path)
    if (state := mapped_file(path)) is None:  # the full read gives the state dict or says what keeps it from it
        state = read_weights(path)
    name, args = checkpoint_format(state).describe(state)
    if name is None and "encoding" in args:
        size = size_of(args["embed_dim"], KIND_SIZES) if "embed_dim" in args else None
        if size is None and {"embed_dim", "depth", "num_heads"} <= set(args):  # the arguments set every width
            size = "base"
        name = None if size is None else model_name(size, args["encoding"])
    return name, args


def model_args(path: str | Path) -> dict[str, Any]:
    """The arguments any model needs to take the weights file ``path`` (``Format.model_args``: LookHere's), or none."""
    state = mapped_file(path) or {}
    fmt = next((fmt for fmt in FORMATS if fmt.model_args is not None and fmt.carries(state)), None)
    return {} if fmt is None else fmt.model_args(state)

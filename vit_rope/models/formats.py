"""Which format a checkpoint is in, each recognised by a marker that only it carries, and its conversion to our keys.

Every format's marker function is asked, so no format depends on being asked before another: one claim names the
format, two are an error naming both (a file is in one format), none leaves timm's ``VisionTransformer`` keys, which
are ours (``vit_rope``'s own files, timm's ViT and DeiT-III), and a file without those either is an error naming the
keys it has and the formats there are. The markers:

- LookHere's official file (``vit_rope.models.lookhere_weights``): ``weights`` and ``config`` at the top level;
- transformers' ``DINOv3ViTModel`` (``vit_rope.models.hf_dinov3``): ``embeddings.patch_embeddings.weight``;
- transformers' ViT / DINOv2, refused (no vit_rope model takes them): ``embeddings.patch_embeddings.projection``;
- Meta's DINOv3 (``vit_rope.models.dinov3``): ``storage_tokens``;
- timm's ``Eva`` (``vit_rope.models.eva_weights``): ``attn.q_bias``, ``attn.q_proj`` or LayerScale as ``gamma_1``;
- PaPE's official ``ImageClassifier`` (``vit_rope.models.pape_weights``): ``cls`` and ``encoder.layers.*``;
- LieRE's official ``RoPEViT`` (``vit_rope.models.liere_weights``): ``position_encoder.generator_raw_params``.

Where one format serves several models, the model decides the conversion, not the order of the checks: a timm
``Eva`` file goes through ``from_eva`` into a twin with an Eva q / k layout, through ``from_dinov3`` into a DINOv3
model, and is renamed only (``gamma_1``) into the others (timm's RoPE-ViT ports, which are ``Eva`` models too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from vit_rope.models import hf_dinov3, liere_weights, pape_weights
from vit_rope.models.dinov3 import from_dinov3, is_meta_dinov3
from vit_rope.models.eva_weights import EVA_LAYOUTS, check_family, from_eva, is_eva
from vit_rope.models.liere_weights import from_liere, is_liere_checkpoint
from vit_rope.models.lookhere_weights import from_lookhere, is_lookhere_checkpoint
from vit_rope.models.pape_weights import from_pape, is_pape_checkpoint
from vit_rope.models.weights_file import unwrap_state_dict

Converted = tuple[dict[str, Any], tuple[str, ...]]  # the state dict in our keys (but for generic renames), and notes
_DINOV3_QK = "DINOv3: q/k rows of every head permuted from rotate-half to interleaved pairs"


@dataclass(frozen=True)
class Format:
    """A checkpoint format: its name, its marker in words, whether a state dict carries it, and its conversion."""

    name: str
    marker: str
    carries: Callable[[Mapping[str, Any]], bool]
    convert: Callable[[dict[str, Any], nn.Module], Converted]


def _lookhere(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    return unwrap_state_dict(from_lookhere(state_dict, model)), ("LookHere's official file: keys renamed to ours",)


def _other_hf(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    raise hf_dinov3.other_hf_error()


def _hf_dinov3(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    notes = f"{hf_dinov3.HF_FORMAT}: keys renamed to timm's, separate q / k / v projections fused", _DINOV3_QK
    return hf_dinov3.from_hf_dinov3(state_dict, model), notes


def _dinov3(state_dict: dict[str, Any], model: nn.Module, source: str) -> Converted:
    converted = from_dinov3(state_dict, model.blocks[0].attn.num_heads)
    return converted, (f"{source}: q / v biases joined into the qkv bias", _DINOV3_QK)


def _meta_dinov3(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    kind = getattr(model, "encoding_kind", None)
    if kind != "dinov3":
        raise ValueError(f"The checkpoint is Meta's DINOv3 (it has storage_tokens), which loads into the "
                         f"vit_rope_*_patch16_dinov3* and vit_rope_*_patch16_lingbot models; this model has "
                         f"encoding={kind!r}.")
    return _dinov3(state_dict, model, "Meta's DINOv3")


def _timm_eva(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    if getattr(model, "qk_layout", None) in EVA_LAYOUTS:  # a twin of timm's Eva (Sapiens2's layout is rotate-half)
        return from_eva(state_dict, model)
    if getattr(model, "encoding_kind", None) == "dinov3":  # DINOv3 and LingBot: timm's layout is DINOv3's rotate-half
        return _dinov3(state_dict, model, "timm's Eva DINOv3")
    return state_dict, ()  # timm's RoPE-ViT ports, DeiT-III: their q / k rows are ours, gamma_1 renamed as all are


def _pape(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    return from_pape(state_dict, model), (f"{pape_weights.FORMAT}: keys renamed to ours",)


def _as_is(state_dict: dict[str, Any], model: nn.Module) -> Converted:
    return state_dict, ()


def _has_vit_keys(state_dict: Mapping[str, Any]) -> bool:
    return any(key.startswith(("patch_embed.", "blocks.")) for key in state_dict)


FORMATS: tuple[Format, ...] = (
    Format("LookHere's official file", "top-level 'weights' and 'config' (with 'head_directions')",
           is_lookhere_checkpoint, _lookhere),
    Format(hf_dinov3.HF_FORMAT, "'embeddings.patch_embeddings.weight'", hf_dinov3.is_hf_dinov3, _hf_dinov3),
    Format("Hugging Face transformers' ViT or DINOv2", "'embeddings.patch_embeddings.projection.weight'",
           hf_dinov3.is_other_hf, _other_hf),
    Format("Meta's DINOv3", "'storage_tokens'", is_meta_dinov3, _meta_dinov3),
    Format("timm's Eva", "keys ending in '.attn.q_bias', '.attn.q_proj.weight' or '.gamma_1'", is_eva, _timm_eva),
    Format(pape_weights.FORMAT, "'cls' and 'encoder.layers.*' keys", is_pape_checkpoint, _pape),
    Format(liere_weights.FORMAT, f"'{liere_weights.MARKER}'", is_liere_checkpoint, from_liere),
)
# what a file without any other format's marker must have: timm's VisionTransformer keys, which are ours
VIT = Format("timm's VisionTransformer (vit_rope's own, timm's ViT and DeiT-III)", "'patch_embed.*' or "
             "'blocks.*' keys and no marker of the formats above", _has_vit_keys, _as_is)


def checkpoint_format(state_dict: Mapping[str, Any]) -> Format:
    """The format whose marker ``state_dict`` carries (a training script's container already unwrapped).

    Raises:
        ValueError: two formats' markers are in it, or none is and it has no ViT keys either; the message names the
            markers found, or the keys found, and the formats with their markers.
    """
    claims = [fmt for fmt in FORMATS if fmt.carries(state_dict)]
    if len(claims) > 1:
        found = "; ".join(f"{fmt.name} ({fmt.marker})" for fmt in claims)
        raise ValueError(f"The checkpoint carries the markers of {len(claims)} formats: {found}. A file is in one "
                         "format: save it again from the model that wrote it, or remove the other format's keys.")
    if claims:
        return claims[0]
    if VIT.carries(state_dict):
        return VIT
    keys = list(state_dict)
    shown = ", ".join(map(str, keys[:5])) + (f", ... ({len(keys)} keys)" if len(keys) > 5 else "")
    known = "; ".join(f"{fmt.name}: {fmt.marker}" for fmt in (*FORMATS, VIT))
    raise ValueError(f"The checkpoint is in no format vit_rope reads: its keys are {shown or 'none'}. The formats and "
                     f"their markers: {known}.")


def convert_format(state_dict: dict[str, Any], model: nn.Module) -> tuple[dict[str, Tensor], tuple[str, ...]]:
    """``state_dict`` in the keys and q / k layout of ``model``, by its format (``checkpoint_format``), with notes on
    what was converted; the renames every format shares are ``vit_rope.models.checkpoint``'s.

    Raises:
        ValueError: the format is unknown or ambiguous, no vit_rope model takes it, or the checkpoint is of another
            family than the model (``vit_rope.models.eva_weights.check_family``, which names the model that fits).
    """
    fmt = checkpoint_format(state_dict)
    check_family(state_dict, model)
    return fmt.convert(state_dict, model)

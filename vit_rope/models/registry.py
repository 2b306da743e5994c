"""timm registration (by ``import vit_rope``) of every vit_rope model and twin (docs/models.md lists them), and the
models for every command: a bad ``model_kwargs`` entry is a ``UserError`` naming it, not a constructor's crash."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import product
from typing import Any

import timm
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import nn

from vit_rope.checks import check_model_name
from vit_rope.encodings import KINDS, REGISTRY
from vit_rope.errors import UserError
from vit_rope.models import deepseek_vit, dinov3, qwen3_vit
from vit_rope.models.checkpoint import checkpoint_filter_fn
from vit_rope.models.dinov3 import dinov3_name
from vit_rope.models.eva_families import FAMILIES, twin_cfgs, twin_name
from vit_rope.models.formats import KIND_SIZES, ROPE_VIT_SIZES, model_name
from vit_rope.models.gemma4_vit import GEMMA4, Gemma4VisionTransformer
from vit_rope.models.pixtral import PIXTRAL, PixtralVisionTransformer
from vit_rope.models.qwen2_5_vl import QWEN25, Qwen25VisionTransformer
from vit_rope.models.qwen3_vit import QWEN3, Qwen3VisionTransformer
from vit_rope.models.swin import SWIN_KINDS, SWIN_SIZES, RoPESwinTransformer, swin_name
from vit_rope.models.twins import tagged, timm_twin_cfgs
from vit_rope.models.vit import RoPEVisionTransformer
from vit_rope.models.widths import width

# name suffix -> model arguments of the kinds without published weights; STRING over axial or mixed
NEW_KINDS: dict[str, dict[str, str]] = {
    **{kind: dict(encoding=kind) for kind in KINDS if kind not in ("axial", "mixed", "dinov3", "string", "none")},
    "string": dict(encoding="string", rope_string_base="axial"),
    "string_mixed": dict(encoding="string", rope_string_base="mixed"),
}


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "interpolation": "bicubic",
        "crop_pct": 1.0,  # RoPE-ViT evaluates on the full center crop
        "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0", **kwargs,
    }  # fmt: skip


def _default_cfgs() -> dict[str, Any]:
    cfgs = {}
    for size, qkvb in product(dinov3.SIZES, (False, True)):  # Meta's LVD-1689M weights, as timm hosts them
        name = dinov3_name(size, qkvb)
        cfgs[f"{name}.lvd1689m"] = _cfg(hf_hub_id=f"timm/{name.replace('vit_rope_', 'vit_')}.lvd1689m", num_classes=0,
                                        input_size=(3, 256, 256), license="dinov3-license")
    for size, kind, ape in product(ROPE_VIT_SIZES, ("axial", "mixed"), (False, True)):
        name = model_name(size, kind, ape)
        if size == "tiny":
            cfgs[name] = _cfg()
        else:  # the published weights, as timm hosts them: vit_base_patch16_rope_mixed_ape_224
            port = "rope" + ("_mixed" if kind == "mixed" else "") + ("_ape" if ape else "")
            cfgs[f"{name}.naver_in1k"] = _cfg(hf_hub_id=f"timm/vit_{size}_patch16_{port}_224.naver_in1k", crop_pct=0.9)
    for size, kind in product(KIND_SIZES, NEW_KINDS):
        cfgs[model_name(size, kind)] = _cfg()
    for kind, size in product(SWIN_KINDS, SWIN_SIZES):  # RoPE-ViT's published RoPE-Swin weights, on its hub
        name = swin_name(kind, size)
        cfgs[name] = _cfg(hf_hub_id=f"naver-ai/{name}", hf_hub_filename="pytorch_model.bin", pool_size=(7, 7),
                          crop_pct=0.9, fixed_input_size=True, classifier="head.fc")
    for name in QWEN25:  # transformers' Qwen2.5-VL tower: its weights are a folder (config.json + model.safetensors)
        cfgs[name] = _cfg(num_classes=0, input_size=(3, 448, 448), mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD,
                          min_input_size=(3, 28, 28))
    for name, args in PIXTRAL.items():  # transformers' folders too; Pixtral's processor's CLIP mean and std
        side, patch = args["img_size"], args["patch_size"]
        cfgs[f"vit_rope_{name}"] = _cfg(num_classes=0, input_size=(3, side, side), mean=OPENAI_CLIP_MEAN,
                                        std=OPENAI_CLIP_STD, min_input_size=(3, 4 * patch, 4 * patch))
    deepseek = timm_twin_cfgs("deepseek_vit", deepseek_vit.DEEPSEEK, min_input_size=(3, 42, 42))  # the aligner pads
    return {**cfgs, **twin_cfgs(), **timm_twin_cfgs("qwen3_vit", QWEN3, min_input_size=(3, 64, 64)),
            **deepseek, **timm_twin_cfgs("gemma4_vit", GEMMA4)}


default_cfgs = generate_default_cfgs(_default_cfgs())


# registered ViT name -> its position encoding (what a checkpoint of one kind is checked against)
ENCODINGS: dict[str, str] = {}


def _entrypoint(name: str, model_args: dict[str, Any], model_cls: type[nn.Module] = RoPEVisionTransformer
                ) -> Callable[..., nn.Module]:
    """One timm entry point; the filter knows ``features_only`` (timm drops the head), so the load report says so."""
    swin = model_cls is RoPESwinTransformer
    if not swin:
        ENCODINGS[name] = model_args["encoding"]

    def create(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        kwargs = dict(model_args, **kwargs)
        if swin:  # timm's four feature stages
            stages = tuple(range(len(kwargs.get("depths", (1, 1, 3, 1)))))
            features = dict(flatten_sequential=True, out_indices=kwargs.pop("out_indices", stages))
        else:
            features = dict(out_indices=kwargs.pop("out_indices", 3), feature_cls="getter")
        filter_fn = partial(checkpoint_filter_fn, features_only=bool(kwargs.get("features_only")))
        return build_model_with_cfg(model_cls, name, pretrained, pretrained_filter_fn=filter_fn,
                                    feature_cfg=features, **kwargs)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    family = "RoPE-ViT's Swin Transformer" if swin else "ViT"
    encoding = model_args["encoding"] + (" RoPE" if REGISTRY[model_args["encoding"]].rope else "")
    create.__doc__ = f"{name}: {family} with {encoding} ({model_args})."
    return create


_DEIT3 = dict(patch_size=16, mlp_ratio=4, qkv_bias=True, init_values=1e-5,  # LayerScale, as RoPE-ViT / timm's ports
              class_token=True, global_pool="token")
_VITS: dict[str, dict[str, Any]] = {
    **{model_name(size, kind, ape): dict(_DEIT3, encoding=kind, pos_embed="learn" if ape else "none", **width(size))
       for size, kind, ape in product(ROPE_VIT_SIZES, ("axial", "mixed"), (False, True))},
    **{model_name(size, kind): dict(_DEIT3, **NEW_KINDS[kind], **width(size))
       for size, kind in product(KIND_SIZES, NEW_KINDS)},
    **{dinov3_name(size, qkvb): dinov3.model_args(size, qkvb) for size, qkvb in product(dinov3.SIZES, (False, True))},
    **{twin_name(timm_name): args for table in FAMILIES.values() for timm_name, args in table.items()},  # Eva twins
}
# the twins of timm's and transformers' VLM towers: table, class, and the projector's width argument and its width by
# the weights' tag (``twins.tagged``), or () for a fixed width
_VLMS = ((QWEN3, Qwen3VisionTransformer, ("merger_out_features", qwen3_vit.llm_width)),
         (PIXTRAL, PixtralVisionTransformer, ()), (GEMMA4, Gemma4VisionTransformer, ()),
         (deepseek_vit.DEEPSEEK, deepseek_vit.DeepseekVisionTransformer,
          ("aligner_out_features", deepseek_vit.llm_width)))
# name -> (model arguments, class, the width by tag as in _VLMS) of every entry point
_MODELS = {**{name: (args, RoPEVisionTransformer, ()) for name, args in _VITS.items()},
           **{name: (args, Qwen25VisionTransformer, ()) for name, args in QWEN25.items()},  # already named vit_rope_*
           **{swin_name(kind, size): (dict(window_size=7, encoding=kind, **SWIN_SIZES[size]), RoPESwinTransformer, ())
              for kind, size in product(SWIN_KINDS, SWIN_SIZES)},  # RoPE-ViT's RoPE-Swin (vit_rope.models.swin)
           **{f"vit_rope_{timm_name}": (args, cls, width) for table, cls, width in _VLMS
              for timm_name, args in table.items()}}
for _name, (_args, _cls, _width) in _MODELS.items():
    _create = _entrypoint(_name, _args, _cls)
    globals()[_name] = register_model(tagged(_create, *_width) if _width else _create)


# size arguments that models which run at any size (CNNs) lack: dropped for them rather than refused
_OPTIONAL_KWARGS = ("img_size", "dynamic_img_size")
# what a constructor raises for arguments it cannot build (depth=-1: RuntimeError from torch.linspace)
_BUILD_ERRORS = (ValueError, AssertionError, ArithmeticError, RuntimeError, KeyError, IndexError)


class PretrainedLoadError(UserError):
    """The architecture builds, but its pretrained weights do not load; ``__cause__`` holds what loading raised."""


def create_model(name: str, kwargs: dict[str, Any], setting: str = "model_kwargs") -> tuple[nn.Module, dict[str, Any]]:
    """Model ``name`` and the ``kwargs`` that built it (less size arguments a CNN lacks); errors name ``setting``."""
    check_model_name(name)
    try:
        return timm.create_model(name, **kwargs), kwargs
    except TypeError as err:
        if rejected := next((key for key in _OPTIONAL_KWARGS if f"'{key}'" in str(err) and key in kwargs), None):
            return create_model(name, {key: value for key, value in kwargs.items() if key != rejected}, setting)
        raise UserError(f"model '{name}' does not accept the arguments {kwargs} ({err}); fix {setting}") from None
    except Exception as err:  # loading weights raises any type (SafetensorError, FileNotFoundError, ...)
        detail = ": ".join([type(err).__name__, *str(err).strip().splitlines()[:1]])
        if kwargs.get("pretrained") and _builds(name, {**kwargs, "pretrained": False}):
            file = (kwargs.get("pretrained_cfg_overlay") or {}).get("file")
            raise PretrainedLoadError(f"model '{name}' builds, but its pretrained weights{f' ({file})' if file else ''}"
                                      f" do not load ({detail}); check the weights file, or fix {setting} to match "
                                      "it") from err
        if not isinstance(err, _BUILD_ERRORS):
            raise
        raise UserError(f"model '{name}' cannot be built with {kwargs} ({detail}); fix {setting}") from None


def _builds(name: str, kwargs: dict[str, Any]) -> bool:
    """Whether the architecture builds, i.e. a failure with ``pretrained=True`` came from loading the weights."""
    try:
        timm.create_model(name, **kwargs)
    except (TypeError, *_BUILD_ERRORS):
        return False
    return True

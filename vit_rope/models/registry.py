"""timm registration of the RoPE-ViT models (Heo et al., ECCV 2024, arXiv:2403.13298), every other kind and twin.

``import vit_rope`` runs this module, after which ``timm.create_model("vit_rope_small_patch16_mixed_224")`` works
like any timm model. Names are ``vit_rope_{tiny,small,base,large}_patch16_{axial,mixed}[_ape]_224`` (``_ape``: with
RoPE-ViT's learned absolute position embedding), pointing at the published ``naver_in1k`` weights (timm's copies,
converted on load; any local file works too: ``pretrained_cfg_overlay=dict(file=PATH)``); every other kind of
``vit_rope.encodings.KINDS`` is ``vit_rope_{tiny,small,base}_patch16_<kind>_224`` (``NEW_KINDS``: STRING twice, over
axial and mixed); DINOv3's backbones are ``vit_rope_{small,small_plus,base,large}_patch16_dinov3[_qkvb]``
(``vit_rope.models.dinov3``); twins of timm's other 2D-RoPE backbones are named by the same rule
(``vit_rope.models.eva_families``). docs/models.md lists them with their weights.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from itertools import product
from typing import Any

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from vit_rope.encodings import KINDS, REGISTRY
from vit_rope.models import dinov3
from vit_rope.models.checkpoint import checkpoint_filter_fn
from vit_rope.models.dinov3 import dinov3_name
from vit_rope.models.eva_families import FAMILIES, twin_cfgs, twin_name
from vit_rope.models.swin import SWIN_KINDS, SWIN_SIZES, RoPESwinTransformer, swin_name
from vit_rope.models.vit import RoPEVisionTransformer
from vit_rope.models.widths import width

SIZES = ("tiny", "small", "base", "large")  # RoPE-ViT's DeiT-III sizes (widths: vit_rope.models.widths)
# name suffix -> model arguments of the kinds without published weights (hence tiny, small and base only): every kind
# but those named with their weights (axial, mixed; DINOv3's backbones) and no encoding; STRING over axial and mixed
NEW_KINDS: dict[str, dict[str, str]] = {
    **{kind: dict(encoding=kind) for kind in KINDS if kind not in ("axial", "mixed", "dinov3", "string", "none")},
    "string": dict(encoding="string", rope_string_base="axial"),
    "string_mixed": dict(encoding="string", rope_string_base="mixed"),
}
NEW_SIZES = ("tiny", "small", "base")
_TIMM_PORT_SUFFIX = {("axial", False): "rope", ("mixed", False): "rope_mixed", ("axial", True): "rope_ape",
                     ("mixed", True): "rope_mixed_ape"}  # fmt: skip


def model_name(size: str, kind: str, ape: bool) -> str:
    return f"vit_rope_{size}_patch16_{kind}{'_ape' if ape else ''}_224"


def _cfg(**kwargs: Any) -> dict[str, Any]:
    return {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": None,
        "crop_pct": 1.0,  # RoPE-ViT evaluates on the full center crop
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": "apache-2.0",
        **kwargs,
    }


def _default_cfgs() -> dict[str, Any]:
    cfgs = {}
    for size, qkvb in product(dinov3.SIZES, (False, True)):  # Meta's LVD-1689M weights, as timm hosts them
        name = dinov3_name(size, qkvb)
        cfgs[f"{name}.lvd1689m"] = _cfg(hf_hub_id=f"timm/{name.replace('vit_rope_', 'vit_')}.lvd1689m", num_classes=0,
                                        input_size=(3, 256, 256), license="dinov3-license")
    for size, kind, ape in product(SIZES, ("axial", "mixed"), (False, True)):
        name = model_name(size, kind, ape)
        if size == "tiny":
            cfgs[name] = _cfg()
        else:  # the published weights, as timm hosts them
            hub_id = f"timm/vit_{size}_patch16_{_TIMM_PORT_SUFFIX[kind, ape]}_224.naver_in1k"
            cfgs[f"{name}.naver_in1k"] = _cfg(hf_hub_id=hub_id, crop_pct=0.9)
    for size, kind in product(NEW_SIZES, NEW_KINDS):
        cfgs[model_name(size, kind, False)] = _cfg()
    for kind, size in product(SWIN_KINDS, SWIN_SIZES):  # RoPE-ViT's published RoPE-Swin weights, on its hub
        name = swin_name(kind, size)
        cfgs[name] = _cfg(hf_hub_id=f"naver-ai/{name}", hf_hub_filename="pytorch_model.bin", pool_size=(7, 7),
                          crop_pct=0.9, fixed_input_size=True, classifier="head.fc")
    return {**cfgs, **twin_cfgs()}


default_cfgs = generate_default_cfgs(_default_cfgs())


def _create(variant: str, pretrained: bool = False, **kwargs: Any) -> RoPEVisionTransformer:
    """timm's builder; the checkpoint filter is told about ``features_only``, whose classifier timm drops, so that
    ``model.load_report`` says what timm's loader then does with the checkpoint's classifier."""
    out_indices = kwargs.pop("out_indices", 3)
    return build_model_with_cfg(
        RoPEVisionTransformer,
        variant,
        pretrained,
        pretrained_filter_fn=partial(checkpoint_filter_fn, features_only=bool(kwargs.get("features_only"))),
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **kwargs,
    )


# registered name -> its position encoding (what a checkpoint of one kind is checked against)
ENCODINGS: dict[str, str] = {}


def _entrypoint(name: str, model_args: dict[str, Any]) -> Callable[..., RoPEVisionTransformer]:
    """One timm entry point: the named architecture, where any keyword argument overrides the defaults."""
    ENCODINGS[name] = model_args["encoding"]

    def create(pretrained: bool = False, **kwargs: Any) -> RoPEVisionTransformer:
        return _create(name, pretrained=pretrained, **dict(model_args, **kwargs))

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    encoding = model_args["encoding"] + (" RoPE" if REGISTRY[model_args["encoding"]].rope else "")
    create.__doc__ = f"{name}: ViT with {encoding} ({model_args})."
    return create


_DEIT3 = dict(patch_size=16, mlp_ratio=4, qkv_bias=True, init_values=1e-5,  # LayerScale, as RoPE-ViT / timm's ports
              class_token=True, global_pool="token")
for _size, _kind, _ape in product(SIZES, ("axial", "mixed"), (False, True)):
    _name = model_name(_size, _kind, _ape)
    _args = dict(_DEIT3, encoding=_kind, pos_embed="learn" if _ape else "none", **width(_size))
    globals()[_name] = register_model(_entrypoint(_name, _args))

for _size, _kind in product(NEW_SIZES, NEW_KINDS):
    _name = model_name(_size, _kind, False)
    globals()[_name] = register_model(_entrypoint(_name, dict(_DEIT3, **NEW_KINDS[_kind], **width(_size))))

for _size, _qkvb in product(dinov3.SIZES, (False, True)):
    _name = dinov3_name(_size, _qkvb)
    globals()[_name] = register_model(_entrypoint(_name, dinov3.model_args(_size, _qkvb)))

for _table in FAMILIES.values():  # twins of timm's Eva backbones (vit_rope.models.eva_families)
    for _timm_name, _args in _table.items():
        _name = twin_name(_timm_name)
        globals()[_name] = register_model(_entrypoint(_name, _args))


def _create_swin(variant: str, pretrained: bool = False, **kwargs: Any) -> RoPESwinTransformer:
    """timm's Swin builder (its four feature stages) with our checkpoint filter: every format, a load report."""
    out_indices = kwargs.pop("out_indices", tuple(range(len(kwargs.get("depths", (1, 1, 3, 1))))))
    return build_model_with_cfg(
        RoPESwinTransformer, variant, pretrained,
        pretrained_filter_fn=partial(checkpoint_filter_fn, features_only=bool(kwargs.get("features_only"))),
        feature_cfg=dict(flatten_sequential=True, out_indices=out_indices), **kwargs)


def _swin_entrypoint(name: str, model_args: dict[str, Any]) -> Callable[..., RoPESwinTransformer]:
    def create(pretrained: bool = False, **kwargs: Any) -> RoPESwinTransformer:
        return _create_swin(name, pretrained=pretrained, **dict(model_args, **kwargs))

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = f"{name}: RoPE-ViT's Swin Transformer with {model_args['encoding']} RoPE ({model_args})."
    return create


for _kind, _size in product(SWIN_KINDS, SWIN_SIZES):  # RoPE-ViT's RoPE-Swin (vit_rope.models.swin)
    _name = swin_name(_kind, _size)
    _args = dict(window_size=7, encoding=_kind, **SWIN_SIZES[_size])
    globals()[_name] = register_model(_swin_entrypoint(_name, _args))

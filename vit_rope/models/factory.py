"""Models for every command: a bad ``model_kwargs`` entry is a ``UserError`` naming it, not a constructor's crash."""

from __future__ import annotations

from typing import Any

import timm
from torch import nn

from vit_rope.checks import check_model_name
from vit_rope.errors import UserError

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

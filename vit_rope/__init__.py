"""vit-rope: 2D rotary position embeddings (RoPE-ViT, Heo et al., ECCV 2024) for timm Vision Transformers.

Importing the package registers the ``vit_rope_*`` models with timm.
"""

from . import _requires, registry  # noqa: F401  (checks timm's version, then registers the models with timm)
from .checkpoint import LoadReport, WeightsNotLoadedWarning, convert_state_dict, load_weights
from .fused import rotate_qk
from .model import RoPEVisionTransformer
from .rope import RoPE2D, apply_rope, grid_positions

__all__ = ["LoadReport", "RoPE2D", "RoPEVisionTransformer", "WeightsNotLoadedWarning", "apply_rope",
           "convert_state_dict", "grid_positions", "load_weights", "rotate_qk"]
__version__ = "0.1.0"

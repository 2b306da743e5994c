"""vit-rope: 2D RoPE (RoPE-ViT, Heo et al., ECCV 2024) for timm ViTs; importing it registers ``vit_rope_*`` with timm.

Subpackages import only those before them: ``layers``, ``encodings``, ``models``, ``data``, ``train``, ``eval``."""

from vit_rope import _requires  # noqa: F401  (checks timm's version before anything imports timm's models)
from vit_rope.encodings.rope.tables import RoPE2D
from vit_rope.eval.loading import create_from_checkpoint
from vit_rope.layers.fused import rotate_qk
from vit_rope.layers.rotary import apply_rope, grid_positions
from vit_rope.models import registry  # noqa: F401  (registers the models with timm)
from vit_rope.models.checkpoint import LoadReport, WeightsNotLoadedWarning, convert_state_dict, load_weights
from vit_rope.models.from_timm import from_timm
from vit_rope.models.vit import RoPEVisionTransformer

__all__ = ["LoadReport", "RoPE2D", "RoPEVisionTransformer", "WeightsNotLoadedWarning", "apply_rope",
           "convert_state_dict", "create_from_checkpoint", "from_timm", "grid_positions", "load_weights", "rotate_qk"]
__version__ = "0.1.0"

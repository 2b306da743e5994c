"""The models: ``RoPEVisionTransformer`` on timm's ``VisionTransformer``, the ``vit_rope_*`` registry, DINOv3's
backbones, the factory every command builds models with, and weights: checkpoint conversion and weights files."""

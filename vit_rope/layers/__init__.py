"""The maths and the blocks: 2D RoPE tables (axial, mixed, DINOv3), resolution policies and coordinate augmentation,
the fused rotation (PyTorch and Triton), the attention and block that rotate q and k, and the absolute position
embedding of the +APE models. Imports nothing above it in the package."""

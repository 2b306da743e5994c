"""Shared maths and the blocks, with no position encoding's name in them: the attention and block with one door for
every encoding (``BlockInput``), the fused rotation (PyTorch and Triton) and the reference rotation, the matrix
exponential, rotations of q and k from tables (shared, paired, in a folded basis), the NaFlex lattice, timm Eva's
pieces. Imports nothing above it in the package."""

"""Rotations from learned generators: ComRoPE (-AP, -LD) and LieRE, over one block-rotation machinery."""

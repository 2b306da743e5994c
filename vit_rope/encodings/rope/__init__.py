"""RoPE: the tables of axial, mixed, golden and DINOv3 RoPE, and Cayley-STRING over them."""

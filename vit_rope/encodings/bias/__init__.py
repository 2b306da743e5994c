"""Attention-bias encodings: LookHere and 2D-ALiBi."""

"""Attention-bias encodings: LookHere, 2D-ALiBi and FIRE, and their shared offset attention."""

"""Shared maths and the blocks, with no position encoding's name in them; imports nothing above it in the package."""

"""``make gpu-check`` and ``make gpu-bench`` (``scripts/gpu_check.py``): what a GPU machine must confirm, in steps that
each run with a time limit and go on past a failure, judged against the targets of docs/gpu.md.

``preflight`` refuses what no step could run with (no GPU, no bf16, old timm, no data), each in one line; ``parity``
is the correctness step (every family's bf16 logits on the device against fp32 on the CPU); ``steps`` holds the two
suites' steps, their commands at full and at tiny (``--device cpu``) sizes, and how each is judged; ``summary``
prints and saves the table.
"""

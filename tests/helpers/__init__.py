"""What the tests share across their folders: tiny image folders and training runs (``training``), DDP ranks forked
from the test (``ddp``), checkpoints and weights files (``checkpoints``), small models and output checks
(``models``), NaFlex batches (``naflex``), tensor stores of random images (``stores``), study folders (``studies``),
and the official code of LookHere and RoPE-Swin (``lookhere_official``, ``rope_swin_official``). Tests import them as
``from helpers.<module> import ...`` (pyproject puts tests/ on the pythonpath); fixtures stay in conftest.py."""

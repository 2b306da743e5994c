"""What the tests share across their folders: tiny image folders and training runs (``training``), DDP ranks forked
from the test (``ddp``), checkpoints and weights files (``checkpoints``), small models and output checks
(``models``), NaFlex batches (``naflex``), study folders (``studies``), and LookHere's official code
(``lookhere_official``). Tests import them as ``from helpers.<module> import ...`` (pyproject puts tests/ on the
pythonpath); fixtures stay in conftest.py."""

"""Training: the config (file chain, command line, checks), the loaders it asks for, the process's device and rank,
the epoch loop and the resumable state. ``train.py`` at the repository root reads these top to bottom."""

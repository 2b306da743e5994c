"""Training: the config, the loaders, the process's device and rank, the epoch loop and the resumable state."""

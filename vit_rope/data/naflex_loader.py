"""Native aspect-ratio (NaFlex) batches for training and validation, from timm's NaFlex data pipeline (NaViT, Dehghani
et al., NeurIPS 2023), with draws seeded by (seed, epoch, rank, step, position) so that a run resumes at any step to the
same batches whatever the workers (docs/training.md, "Native aspect ratio")."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from timm.data.naflex_dataset import NaFlexMapDatasetWrapper
from timm.data.naflex_loader import NaFlexPrefetchLoader
from timm.data.naflex_random_erasing import PatchRandomErasing
from timm.data.readers.shared_count import SharedCount
from torch import Tensor
from torch.utils.data import DataLoader

from vit_rope.data.folders import Images
from vit_rope.data.steps import global_rng_kept, sample_seeds, seed_globals

NaFlexBatch = tuple[dict[str, Any], Tensor, Tensor]  # timm's NaFlex dict, targets [B] or soft [B, classes], skipped [B]
_ERASE_TAG = 0xE7A5E  # a last SeedSequence entry: the erasing seeds differ from the images' and Mixup's


class NaFlexSteps(NaFlexMapDatasetWrapper):
    """timm's ``NaFlexMapDatasetWrapper`` over a split's images, with per-image seeds and a mid-epoch start: only the
    iteration is ours, so that step k of an epoch is the same batch however the run got there."""

    def __init__(self, images: Images, transform_factory: Callable[..., Any], mixup: Any = None, **kwargs: Any) -> None:
        super().__init__(images, transform_factory=transform_factory, mixup_fn=mixup,
                         distributed=kwargs.get("world_size", 1) > 1, **kwargs)
        self.shared_start = SharedCount(0)  # as timm's shared_epoch: set here, read by persistent loader workers

    @property
    def schedule(self) -> list[tuple[int, int]]:
        """``(sequence length, images)`` of every step of an epoch, in timm's canonical order."""
        return list(self._canonical_batch_schedule)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        if not 0 <= start_step <= len(self):
            raise ValueError(f"start_step {start_step} is outside the epoch's {len(self)} steps")
        super().set_epoch(epoch)
        self.shared_start.value = start_step

    def __iter__(self) -> Iterator[tuple[dict[str, Any], Tensor]]:
        """This worker's steps from ``start_step``: step i to worker ``(i - start_step) % workers``, in step order."""
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        epoch, start = self.shared_epoch.value, self.shared_start.value
        if self.mixup_fn is not None:
            self.mixup_fn.set_epoch(epoch)
        steps = self._prepare_epoch_batches(epoch)
        for step in range(start + worker, len(steps), workers):
            with global_rng_kept():  # workers=0: the training process's own draws stay its own
                batch = self._batch(epoch, step, *steps[step])
            yield batch

    def _batch(self, epoch: int, step: int, seq_len: int, patch_idx: int, indices: list[int]
               ) -> tuple[dict[str, Any], Tensor]:
        """One step: each image transformed under its own seed, Mixup under the step's, then patchified and padded."""
        transform, patchify = self.transforms[seq_len, patch_idx], self.patchifiers[patch_idx]
        *image_seeds, mix_seed = sample_seeds(self.seed, epoch, self.rank, step, len(indices) + 1)
        images, targets, skipped = [], [], []
        for index, seed in zip(indices, image_seeds, strict=True):
            image, target, skips = self.base_dataset.load(index)
            seed_globals(seed)
            images.append(transform(image))
            targets.append(target)
            skipped.append(skips)
        if self.mixup_fn is not None:
            seed_globals(mix_seed)
            images, targets = self.mixup_fn(images, targets)
        inputs, targets = self.collate_fns[seq_len]([(patchify(image), target)
                                                     for image, target in zip(images, targets, strict=True)])
        inputs["skipped"] = torch.tensor(skipped)  # [B]; a tensor, so the prefetcher moves it with the rest
        return inputs, targets


class NaFlexLoader:
    """Batches ``(inputs, targets, skipped)`` from timm's ``NaFlexPrefetchLoader``, patch erasing seeded per step."""

    def __init__(self, loader: DataLoader, mean: tuple[float, ...], std: tuple[float, ...], device: torch.device,
                 erasing: PatchRandomErasing | None = None, seed: int = 0, rank: int = 0) -> None:
        self.loader, self.erasing, self.seed, self.rank = loader, erasing, seed, rank
        self.prefetch = NaFlexPrefetchLoader(loader, mean=mean, std=std, device=device)
        self.steps = loader.dataset if isinstance(loader.dataset, NaFlexSteps) else None  # None: a validation loader
        self.epoch, self.start = 0, 0

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.steps.set_epoch(epoch, start_step)
        self.epoch, self.start = epoch, start_step

    def __iter__(self) -> Iterator[NaFlexBatch]:
        for step, (inputs, targets) in enumerate(self.prefetch, self.start):
            skipped = inputs.pop("skipped", torch.zeros(len(targets), dtype=torch.long))  # validation: no count
            if self.erasing is not None:
                inputs["patches"] = self._erase(step, inputs)
            yield inputs, targets, skipped

    def _erase(self, step: int, inputs: dict[str, Any]) -> Tensor:
        """timm's patch erasing of step ``step``, its draws from a seed of (seed, epoch, rank, step) alone."""
        patches = inputs["patches"]  # [B, N, P*P*C], channels last within a patch
        seed = int(np.random.SeedSequence([self.seed, self.epoch, self.rank, step, _ERASE_TAG]).generate_state(1)[0])
        devices = [patches.device] if patches.device.type == "cuda" else []
        with global_rng_kept(), torch.random.fork_rng(devices=devices, device_type=patches.device.type):
            random.seed(seed)
            torch.manual_seed(seed)
            erased = self.erasing(patches.view(*patches.shape[:2], -1, 3),  # [B, N, P*P, C]
                                  patch_coord=inputs["patch_coord"], patch_valid=inputs.get("patch_valid"))
        return erased.view(patches.shape)

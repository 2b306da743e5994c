"""The per-image pipeline with ``train_sizes`` under DDP: 2 gloo ranks on the CPU (``torch.multiprocessing``), 2 loader
workers each. The ranks must agree on every step's size and batch length without talking, take disjoint shards of
the data and refuse to start when their size settings differ (a DDP run resumed mid-epoch: test_train_datasets)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from helpers.ddp import WORLD, free_port, run_ranks
from helpers.training import PER_IMAGE, indexed_loaders
from vit_rope.errors import UserError
from vit_rope.train import loaders
from vit_rope.train.config_checks import check_ranks_agree


def _loader_steps(rank: int, root: Path, port: int) -> dict[str, Any]:
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo")
    try:
        loader, _ = indexed_loaders(root, *PER_IMAGE, "batch_size=4", "train_sizes=[16, 24, 32]", "workers=2",
                                    rank=rank, world_size=WORLD)
        steps = {}
        for epoch in (0, 1):
            loaders.set_epoch(loader, epoch)
            steps[epoch] = [(images.shape[-1], targets.tolist()) for images, targets, _ in loader]
        shard, refusal = list(loader.batch_sampler.order), None
        try:  # a rank launched with other sizes: both must refuse before any step
            check_ranks_agree({"train_sizes": [16, 32, 48] if rank == 0 else [16, 32, 64], "seed": 0}, WORLD)
        except UserError as err:
            refusal = str(err)
        return {"steps": steps, "shard": shard, "refusal": refusal}
    finally:
        dist.destroy_process_group()


def test_ranks_with_two_workers_each_agree_on_sizes_and_batches_and_split_the_data(image_root: Path,
                                                                                   tmp_path: Path) -> None:
    ranks = run_ranks(_loader_steps, tmp_path, image_root, free_port())
    for epoch in (0, 1):
        shapes = [[(size, len(targets)) for size, targets in rank["steps"][epoch]] for rank in ranks]
        assert shapes[0] == shapes[1] and len(shapes[0]) == 3  # 24 images / 2 ranks / 4: 3 steps per epoch
        seen = [{i for _, targets in rank["steps"][epoch] for i in targets} for rank in ranks]
        assert not seen[0] & seen[1]  # each image on one rank only
    assert len({size for epoch in (0, 1) for size, _ in ranks[0]["steps"][epoch]}) > 1
    assert not set(ranks[0]["shard"]) & set(ranks[1]["shard"])  # the shards are disjoint and cover the data
    assert sorted(ranks[0]["shard"] + ranks[1]["shard"]) == list(range(24))
    for rank in ranks:  # each step takes its shard's order, as one process would
        flat = [i for _, targets in rank["steps"][1] for i in targets]
        assert flat == [rank["shard"][i % 12] for i in range(len(flat))]
    assert ranks[0]["refusal"] == ranks[1]["refusal"] == (
        "the DDP ranks do not agree on train_sizes (rank 0: [16, 32, 48], rank 1: [16, 32, 64]); each rank derives "
        "every step's size, images and checkpoints from these, so launch every rank with the same config, "
        "command-line overrides and data")

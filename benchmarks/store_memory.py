"""Memory of the decoded store when several processes of one machine train from it (DDP ranks).

    python benchmarks/store_memory.py -c configs/imagenette_cpu.yaml --processes 1 2 [--json out.json] [key=value ...]

For each process count N, N processes (rank r of N, as torchrun starts them) build the config's loaders and draw one
training epoch and one validation pass through them, then read their memory from ``/proc/self/smaps_rollup``:

- RSS counts every page a process maps, shared or not, so pages of a memory-mapped store count once per process;
- PSS divides each shared page among the processes that map it: the sum over processes is what the machine holds;
  its file-backed part is the memory-mapped store (and shared libraries), its anonymous part each process's own
  memory (model, batches, allocator pools, and a store decoded in memory).

With ``cache_dir`` set the store file is memory-mapped (one copy in the page cache for all processes); with
``cache_dir=null`` each process decodes into its own memory. The figures are the processes' memory after the epoch
minus that of a process that only imported the same modules, so model and store dominate.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vit_rope.eval.report import table  # noqa: E402  (after the path set-up, as the script runs from anywhere)


def memory_mib() -> dict[str, float]:
    """This process's RSS, PSS and PSS split into file-backed (the memory-mapped store) and anonymous memory, MiB."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss", "Pss_File", "Pss_Anon"):
            fields[name.lower()] = int(rest.split()[0]) / 1024
    return fields


def one_process(config: str, overrides: list[str], rank: int, world_size: int, queue: mp.Queue,
                barrier: mp.Barrier) -> None:
    """Build the loaders as rank ``rank`` of ``world_size``, draw an epoch and a validation pass, report memory.

    Every process measures while all of them are alive (two barriers), since PSS shares a page only among the
    processes that map it at the time.
    """
    import timm
    import torch
    from timm.data import resolve_data_config

    import vit_rope  # noqa: F401  (registers the models)
    from vit_rope.data import folders
    from vit_rope.train import loaders
    from vit_rope.train.command_line import build_config

    torch.set_num_threads(1)
    baseline = memory_mib()
    cfg = build_config(config, overrides)
    data_dir = folders.resolve_data_dir(cfg.data_dir, cfg.download_size)
    train_samples, classes = folders.find_images(data_dir / "train")
    val_samples, _ = folders.find_images(data_dir / cfg.val_split, classes, split_key="val_split")
    model = timm.create_model(cfg.model, num_classes=len(classes), img_size=cfg.img_size, **cfg.model_kwargs)
    data_config = resolve_data_config({"input_size": (3, cfg.img_size, cfg.img_size), "crop_pct": cfg.crop_pct,
                                       "interpolation": cfg.interpolation}, model=model)
    train_loader, val_loader = loaders.build_loaders(cfg, train_samples, val_samples, data_config, rank, world_size)
    loaders.set_epoch(train_loader, 0)
    for _ in train_loader:
        pass
    for _ in val_loader:
        pass
    barrier.wait()
    now = memory_mib()
    barrier.wait()
    queue.put({key: now[key] - baseline[key] for key in now})


def measure(config: str, overrides: list[str], processes: int) -> list[dict[str, float]]:
    context = mp.get_context("spawn")  # fresh interpreters, as torchrun's ranks
    queue, barrier = context.Queue(), context.Barrier(processes)
    workers = [context.Process(target=one_process, args=(config, overrides, rank, processes, queue, barrier))
               for rank in range(processes)]
    for worker in workers:
        worker.start()
    results = [queue.get() for _ in workers]
    for worker in workers:
        worker.join()
        if worker.exitcode:
            raise SystemExit(f"a process failed with exit code {worker.exitcode}")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True, help="train.py YAML config")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, as for train.py")
    args = parser.parse_intermixed_args(argv)
    measure(args.config, args.overrides, 1)  # builds the cache file first, so every count reads the same store
    rows = []
    for count in args.processes:
        results = measure(args.config, args.overrides, count)
        rows.append({"processes": count, **{f"{key}_mib_sum": sum(r[key] for r in results) for key in results[0]},
                     "per_process": results})
    print(f"# {args.config} {' '.join(args.overrides)}: memory added by building the loaders and drawing one epoch")
    print(table(["processes", "RSS sum (MiB)", "PSS sum (MiB): what the machine holds", "of which file-backed",
                 "anonymous"],
                [(r["processes"], *(f"{r[key]:.0f}" for key in ("rss_mib_sum", "pss_mib_sum", "pss_file_mib_sum",
                                                                 "pss_anon_mib_sum"))) for r in rows]))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

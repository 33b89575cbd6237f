"""Train with DistributedDataParallel under torchrun, and resume on a different number of ranks.

::

    torchrun --nproc_per_node=2 examples/ddp_train.py --checkpoint /tmp/ddp.pt
    torchrun --nproc_per_node=3 examples/ddp_train.py --checkpoint /tmp/ddp.pt   # resumes

The loader partitions each epoch across the ranks itself (``distributed=True``): no
``DistributedSampler``, no ``set_epoch``. Every rank gets the same number of batches, so the
gradient all-reduce never waits on a rank that ran out. Rank 0 saves model, optimiser and
loader together every ``--save-every`` steps; the loader's state describes the global position
(ranks step together), so the job resumes mid-epoch at any world size: the new ranks share
what the epoch had left, each sample once. ``--stop-after N`` ends the run after N steps (a
preemption, for trying that out).

The data is a map-style source with ``async def __getitem__`` and 5 ms of latency per sample
(a stand-in for an object store): a noisy linear problem a small MLP learns, so the loss
falls. Backend: NCCL on GPUs (one per rank, ``LOCAL_RANK``), gloo on CPU. Run with plain
``python`` it is a job of one rank.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from asyncloader import AsyncLoader

FEATURES, LATENCY_S = 32, 0.005


class RemoteRegression:
    """Sample ``i``: features drawn from ``i`` and the noisy linear target they imply."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.weights = torch.randn(FEATURES, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        await asyncio.sleep(LATENCY_S)
        x = torch.randn(FEATURES, generator=torch.Generator().manual_seed(i))
        return x, (x @ self.weights + 0.1 * torch.randn(())).reshape(1)


def init() -> torch.device:
    """Joins the torchrun job (or makes a job of one rank); returns this rank's device."""
    if "RANK" not in os.environ:  # plain python: a single rank on 127.0.0.1
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--stop-after", type=int, default=None)
    args = parser.parse_args()
    device = init()
    rank, world = dist.get_rank(), dist.get_world_size()

    loader = AsyncLoader(
        RemoteRegression(args.samples),
        batch_size=args.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(42),  # the same permutation on every rank
        distributed=True,  # rank and world size from the process group
        io_concurrency=256,
        device=device,
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])  # saved at any world size
        step = saved["step"]
        if rank == 0:
            print(f"resumed at step {step} (saved by {saved['world_size']} ranks, now {world})")

    epoch = loader.state_dict()["epoch"]
    while epoch < args.epochs:
        start, losses = time.perf_counter(), []
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()  # DDP all-reduces the gradients: every rank takes this step
            opt.step()
            step += 1
            losses.append(loss.item())
            if args.checkpoint and rank == 0 and step % args.save_every == 0:
                save(args.checkpoint, model, opt, loader, step, world)
            if step == args.stop_after:
                break
        if rank == 0 and losses:
            rate = len(losses) * args.batch_size * world / (time.perf_counter() - start)
            print(
                f"epoch {epoch}: {len(losses)} steps per rank, loss {losses[0]:.3f} -> "
                f"{losses[-1]:.3f}, {rate:,.0f} samples/s over {world} ranks, rank 0 waited "
                f"for data {loader.stats.stall_fraction:.0%} of the time"
            )
            print(loader.report())  # which stage set the pace, and the knob for it
        if step == args.stop_after:
            break
        epoch += 1
    if args.checkpoint and rank == 0:
        save(args.checkpoint, model, opt, loader, step, world)
    loader.close()
    dist.destroy_process_group()


def save(path: str, model, opt, loader: AsyncLoader, step: int, world: int) -> None:
    """Model, optimiser and loader together, written atomically."""
    state = {
        "model": model.module.state_dict(),
        "optimizer": opt.state_dict(),
        "loader": loader.state_dict(),
        "step": step,
        "world_size": world,
    }
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()

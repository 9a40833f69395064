"""Runs under ``torchrun --nproc-per-node 2``: one Lightning Trainer per commsched policy under
CommschedStrategy, then the same Trainer under Lightning's DDPStrategy (Gloo), all in this one
process. Rank 0 writes what test_lightning_torchrun.py checks to the JSON path given as the one
argument: per policy, the largest difference from DDP's final parameters and between ranks,
the loss before and after training, and how many steps deferred their update."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, Strategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import commsched
from commsched.lightning import CommschedStrategy

# Each run: "policy", or "policy/net" where training_step calls self.net itself (the root
# LightningModule, passed as model=, then never runs its forward in training).
RUNS = ("horovod", "dear", "dear/net", "bytescheduler/net")
EPOCHS = 3
BATCH = 16
BATCHES_PER_RANK = 7  # odd: with accumulate_grad_batches=2 each epoch ends mid-accumulation


def dataset(world: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(BATCH * BATCHES_PER_RANK * world, 8, generator=gen)
    y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return TensorDataset(x, y)


class Regression(pl.LightningModule):
    def __init__(self, call_net: bool = False) -> None:
        super().__init__()
        self.call_net = call_net
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(),
                                 nn.Linear(32, 1))
        self.deferred_steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x) if self.call_net else self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        session = getattr(self.trainer.strategy.optimizers[0], "session", None)
        self.deferred_steps += bool(session is not None and session.mode.defers_updates)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}


def full_loss(model: nn.Module, data: TensorDataset) -> float:
    with torch.no_grad():
        x, y = data.tensors
        return float(nn.functional.mse_loss(model(x), y))


def train(strategy: Strategy, world: int, call_net: bool = False
          ) -> tuple[Regression, float, float]:
    pl.seed_everything(3, verbose=False)
    model = Regression(call_net)
    data = dataset(world)
    before = full_loss(model, data)
    trainer = pl.Trainer(accelerator="cpu", devices=world, num_nodes=1, strategy=strategy,
                         max_epochs=EPOCHS, accumulate_grad_batches=2, limit_val_batches=2,
                         num_sanity_val_steps=0, enable_progress_bar=False,
                         enable_model_summary=False, logger=False, enable_checkpointing=False)
    trainer.fit(model, DataLoader(data, batch_size=BATCH, shuffle=True),
                DataLoader(data, batch_size=BATCH))
    return model, before, full_loss(model, data)


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main() -> int:
    torch.set_num_threads(1)
    out = sys.argv[1]
    world = int(__import__("os").environ["WORLD_SIZE"])
    runs: dict[str, Any] = {}
    for run in RUNS:  # first: CommschedStrategy makes the world (commsched's bootstrap)
        started = time.monotonic()
        policy, _, how = run.partition("/")
        model, before, after = train(CommschedStrategy(policy=policy, profile_steps=2), world,
                                     call_net=how == "net")
        runs[run] = {"params": flat(model), "before": before, "after": after,
                        "deferred_steps": model.deferred_steps,
                        "seconds": time.monotonic() - started}
    started = time.monotonic()
    reference, before, after = train(DDPStrategy(process_group_backend="gloo"), world)
    ddp_seconds = time.monotonic() - started
    expected = flat(reference)
    results: dict[str, Any] = {"world": world, "ddp": {"before": before, "after": after,
                                                       "seconds": ddp_seconds}}
    for policy, run in runs.items():
        every_rank: list[Any] = [None] * world
        dist.all_gather_object(every_rank, run["params"])
        results[policy] = {
            "max_diff_vs_ddp": float((run["params"] - expected).abs().max()),
            "max_diff_across_ranks": max(float((p - every_rank[0]).abs().max())
                                         for p in every_rank),
            "before": run["before"], "after": run["after"],
            "deferred_steps": run["deferred_steps"], "seconds": run["seconds"]}
    if dist.get_rank() == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    print(f"rank {dist.get_rank()}: {json.dumps(results)}", flush=True)
    commsched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a small conv net with this machine's torch-autotune profile.

    python examples/train.py [--steps 50]

The same script runs unchanged on a CPU, an NVIDIA or AMD GPU, or Apple MPS: every
machine-specific choice (device, AMP dtype and GradScaler, TF32, cuDNN autotuner, memory
format, torch.compile, DataLoader workers and pinning, fused optimizer, batch size, gradient
accumulation) comes from the profile. Run `autotune` once on the machine first to have a
measured batch size; without it recommend() gives the rules-only profile and this script uses a
batch of 32.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torch_autotune


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()

    profile = torch_autotune.recommend(mode="speed")  # cheap: no torch import, no CUDA
    profile.apply()  # before the first CUDA call: allocator and cuBLAS settings, TF32, threads
    device = profile.device
    batch_size = profile.batch_size or 32
    accumulate = profile.grad_accum_steps  # above 1 where autotune --target-batch asked

    images = torch.randn(1024, 3, 32, 32)
    labels = torch.randint(0, 10, (1024,))
    # The profile's workers, pinning, ... with this script's own arguments merged in: no argument
    # twice, whatever the profile sets (drop_last=True too, where its model's batch 1 raised).
    loader = DataLoader(
        TensorDataset(images, labels),
        **profile.dataloader_kwargs(batch_size=batch_size, shuffle=True, drop_last=True),
    )
    model = profile.prepare_model(make_model().to(device))  # channels_last, torch.compile
    adamw = torch.optim.AdamW  # its class: the profile's arguments that it takes (fused)
    optimizer = adamw(model.parameters(), lr=1e-3, **profile.optimizer_kwargs(adamw))
    scaler = profile.grad_scaler()  # enabled only for fp16
    channels_last = profile.settings.memory_format == "channels_last"

    step, batches, started = 0, 0, time.perf_counter()
    while step < args.steps:
        for batch_images, batch_labels in loader:
            x = batch_images.to(device, non_blocking=True)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = batch_labels.to(device, non_blocking=True)
            with profile.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss / accumulate).backward()
            batches += 1
            if batches % accumulate:
                continue  # gradients add up until `accumulate` batches have run
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == args.steps:
                break
    seconds = time.perf_counter() - started
    print(
        f"{step} steps of batch {batch_size} x {accumulate} on {device} "
        f"({profile.settings.precision.dtype}, {'measured' if profile.measured else 'rules-only'}"
        f" profile) in {seconds:.1f} s; last loss {loss.item():.3f}"
    )


if __name__ == "__main__":  # DataLoader workers may start with spawn: keep the guard
    main()

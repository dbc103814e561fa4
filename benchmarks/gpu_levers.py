"""Which switches speed up a UNet step on a GPU: cuDNN autotuning, fused AdamW, torch.compile.

    python benchmarks/gpu_levers.py [--encoder resnet34] [--size 448] [--batch-size 64] [--windows 2]

Model-only images/s (tensors already on the GPU, bf16 autocast, channels_last) of a training
step (forward, BCE, backward, AdamW) and of an inference forward, for each switch added in
turn, the settings alternated window by window (benchmarks/harness.py). The answer decides
what crackseg turns on by itself; docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from harness import median_rates

from crackseg.model.networks import build_model

TRAIN = {"plain": (False, False, False), "+ cudnn.benchmark": (True, False, False),
         "+ fused AdamW": (True, True, False), "+ torch.compile": (True, True, True)}
INFER = {"plain": (False, False), "+ cudnn.benchmark": (True, False), "+ torch.compile": (True, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", default="resnet34")
    parser.add_argument("--size", type=int, default=448)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=15, help="steps per timed window")
    parser.add_argument("--windows", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(2, "gpu_levers.py: no CUDA device\n")
    device = torch.device("cuda")
    images = torch.rand(args.batch_size, 3, args.size, args.size, device=device).contiguous(memory_format=torch.channels_last)
    masks = (torch.rand(args.batch_size, 1, args.size, args.size, device=device) < 0.02).float()

    def model(compiled: bool) -> torch.nn.Module:
        torch.manual_seed(0)
        net = build_model(args.encoder).to(device).to(memory_format=torch.channels_last)
        if compiled:
            net.compile()
        return net

    def train_window(autotune: bool, fused: bool, compiled: bool):
        net = model(compiled)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=fused)

        def window(index: int) -> None:
            torch.backends.cudnn.benchmark = autotune
            for _ in range(args.steps):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = net(images)
                F.binary_cross_entropy_with_logits(logits.float(), masks).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
        return window

    def infer_window(autotune: bool, compiled: bool):
        net = model(compiled).eval()

        @torch.inference_mode()
        def window(index: int) -> None:
            torch.backends.cudnn.benchmark = autotune
            for _ in range(args.steps):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    net(images)
            torch.cuda.synchronize()
        return window

    count = args.steps * args.batch_size
    paths = {("train", name): (train_window(*flags), count) for name, flags in TRAIN.items()}
    paths |= {("inference", name): (infer_window(*flags), count) for name, flags in INFER.items()}
    rates = median_rates(paths, args.windows)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, UNet-{args.encoder}, {args.size} px, "
          f"batch {args.batch_size}, bf16, channels_last\n\n| step | switches | images/s |\n|---|---|---|")
    for (step, name), (rate, _) in rates.items():
        print(f"| {step} | {name} | {rate:.0f} |")


if __name__ == "__main__":
    main()

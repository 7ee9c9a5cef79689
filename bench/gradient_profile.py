"""The gradient each layer receives at initialisation, post-norm and pre-norm, at six depths.

    python bench/gradient_profile.py    # writes transformer_lib/data/gradient_profile.json

Chapter 4's measurement, repeated for more depths: for each depth (layers per stack, encoder
and decoder), placement and seed, a freshly initialised reversal model
(``reversal_config(n_layers=depth, norm_first=…, final_norm=norm_first)``, seeded with
Python's, NumPy's and PyTorch's generators) runs one batch of 32 sequences of 8 symbols
forward and backward under ``LabelSmoothingLoss(0.1)``; the norm of the gradient of each
layer's parameters, layer 1 first, is kept for the decoder and the encoder. Nothing is
trained. The chapter's 8-layer figure is the depth-8 slice of this file, and the chapter
checks that it is. ``gradient_explorer()`` (``transformer_lib.widgets``) draws the file.
A few seconds of processor time on one thread.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import random
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from transformer_lib.encoder_decoder import EncoderDecoder, LabelSmoothingLoss
from transformer_lib.tasks import reversal_batch, reversal_config
from transformer_lib.widgets.norms import GRADIENT_PROFILE_FILE, PLACEMENTS, STACKS

OUT = Path(__file__).resolve().parents[1] / "transformer_lib" / "data" / GRADIENT_PROFILE_FILE
DEPTHS = (2, 4, 6, 8, 12, 16)
SEEDS = (0, 1, 2, 3, 4)
BATCH, SEQ_LEN, SMOOTHING = 32, 8, 0.1


def layer_gradients(depth: int, norm_first: bool, seed: int) -> dict[str, list[float]]:
    """Gradient norm of each layer of a fresh reversal model, after one batch.

    Args:
        depth: layers per stack.
        norm_first: pre-norm (with the final norm) if True, else post-norm.
        seed: seeds the weights and the batch.

    Returns:
        stack name -> ``depth`` norms, layer 1 first.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    config = reversal_config(n_layers=depth, norm_first=norm_first, final_norm=norm_first)
    model = EncoderDecoder(config)
    src, tgt_in, tgt_out = reversal_batch(BATCH, SEQ_LEN, config.tgt_vocab_size,
                                          torch.Generator().manual_seed(seed))  # (B, T) each
    LabelSmoothingLoss(SMOOTHING)(model(src, tgt_in), tgt_out).backward()
    return {stack: [torch.cat([p.grad.flatten() for p in layer.parameters()]).norm().item()
                    for layer in getattr(model, stack).layers] for stack in STACKS}


def main() -> int:
    torch.set_num_threads(1)
    start = time.process_time()
    profiles = {placement: {stack: {} for stack in STACKS} for placement in PLACEMENTS}
    for placement in PLACEMENTS:
        for depth in DEPTHS:
            runs = [layer_gradients(depth, placement == "pre-norm", seed) for seed in SEEDS]
            for stack in STACKS:
                profiles[placement][stack][str(depth)] = [run[stack] for run in runs]
            ratios = [run["decoder"][0] / run["decoder"][-1] for run in runs]
            print(f"{placement:9s} {depth:2d} layers: decoder layer 1 / layer {depth} "
                  + ", ".join(f"{r:.3f}" for r in ratios))
    data = {
        "description": "Gradient norm of each layer's parameters (layer 1 first) of freshly "
                       "initialised reversal models after one batch, post-norm and pre-norm, "
                       "decoder and encoder, every depth and seed: "
                       "profiles[placement][stack][depth][seed][layer].",
        "settings": {"depths": list(DEPTHS), "seeds": list(SEEDS), "batch_size": BATCH,
                     "seq_len": SEQ_LEN, "loss": f"LabelSmoothingLoss({SMOOTHING})",
                     "model": "reversal_config(n_layers=depth, norm_first=placement == "
                              "'pre-norm', final_norm=norm_first)"},
        "profiles": profiles,
        "command": "python bench/gradient_profile.py",
        "cpu_seconds": round(time.process_time() - start, 1),
        "machine": f"{platform.machine()} CPU, 1 thread, torch {torch.__version__}, "
                   f"Python {platform.python_version()}",
        "date": datetime.date.today().isoformat(),
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} in {data['cpu_seconds']:.0f} s of processor time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

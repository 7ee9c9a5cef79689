"""Peak memory of one attention call on the CPU: naive vs tiled (online softmax) vs PyTorch SDPA.

Run by hand (``python bench/attention_memory.py``); it is not a test. Each (method, length) is
measured in a fresh process (``transformer_lib.measure``): the rise of the process's peak RSS
during the call above its RSS with the inputs created, i.e. every temporary and the output.
One head, batch 1, head dim 64, float32, T = S; one thread.

- ``naive``: ``transformer_lib.attention.scaled_dot_product_attention``, the readable path,
  which forms the (T, S) scores and weights;
- ``tiled``: ``transformer_lib.flash.flash_attention`` (key tiles of ``--block`` with an
  online softmax), pure PyTorch;
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, PyTorch's fused kernel.

Prints a Markdown table (MB = 10^6 bytes, and ms per call), then the ratio naive / tiled at
the longest length. The naive path at T = 16384 needs about 2.2 GB.
"""
from __future__ import annotations

import argparse

import torch

from transformer_lib.measure import ATTENTION_METHODS, attention_peak_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[512, 1024, 2048, 4096, 8192], help="sequence lengths T = S")
    parser.add_argument("--block", type=int, default=64, help="key tile of the tiled path")
    parser.add_argument("--causal", action="store_true", help="causal attention")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = parser.parse_args()
    found = attention_peak_memory(args.lengths, ATTENTION_METHODS, threads=args.threads,
                                  block_size=args.block, causal=args.causal)
    print(f"attention, 1 head, D = 64, float32, {'causal' if args.causal else 'no mask'}; "
          f"tiles of {args.block} keys; {args.threads} thread(s); torch {torch.__version__}")
    print()
    print("| T = S | one T x S matrix (MB) | naive (MB) | tiled (MB) | SDPA (MB) "
          "| naive / tiled | naive (ms) | tiled (ms) | SDPA (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, L in enumerate(args.lengths):
        naive, tiled, sdpa = (found[m][i] for m in ATTENTION_METHODS)
        print(f"| {L} | {4 * L * L / 1e6:.1f} | {naive.rise / 1e6:.1f} | {tiled.rise / 1e6:.1f} "
              f"| {sdpa.rise / 1e6:.1f} | {naive.rise / tiled.rise:.1f}x "
              f"| {naive.seconds * 1e3:.1f} | {tiled.seconds * 1e3:.1f} "
              f"| {sdpa.seconds * 1e3:.1f} |")
    naive, tiled = found["naive"][-1], found["tiled"][-1]
    print()
    print(f"at T = S = {args.lengths[-1]}: tiled needs {tiled.rise / naive.rise:.3f} of the "
          f"naive path's memory ({naive.rise / tiled.rise:.0f}x less)")


if __name__ == "__main__":
    main()

"""Memory of one attention call on the CPU: naive vs tiled (online softmax) vs PyTorch SDPA.

Run by hand (``python bench/attention_memory.py``); it is not a test. Two measurements:

1. The peak memory of a forward call (no autograd), without and with a causal mask. Each
   (method, length) is measured in a fresh process (``transformer_lib.measure``): the rise of
   the process's peak RSS during the call above its RSS with the inputs created, i.e. every
   temporary and the output. One head, batch 1, head dim 64, float32, T = S; one thread.
2. The bytes autograd saves for the backward pass (``torch.autograd.graph.saved_tensors_hooks``,
   each storage counted once, the inputs included), for causal attention with q, k, v
   requiring gradients.

- ``naive``: ``transformer_lib.attention.scaled_dot_product_attention``, the readable path,
  which forms the (T, S) scores and weights;
- ``tiled``: ``transformer_lib.flash.flash_attention`` (key tiles of ``--block`` with an
  online softmax), pure PyTorch; its backward pass recomputes the tiles;
- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, PyTorch's fused kernel.

Prints Markdown tables (MB = 10^6 bytes, and ms per call). The naive path at T = 16384 needs
about 2.2 GB.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.flash import flash_attention
from transformer_lib.measure import ATTENTION_METHODS, attention_peak_memory


def saved_bytes(fn, *args, **kwargs) -> int:
    """Bytes of the distinct storages autograd saves for the backward pass of
    ``fn(*args, **kwargs)``."""
    storages = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args, **kwargs)
    return sum(storages.values())


def peak_table(lengths: list[int], block: int, causal: bool, threads: int) -> None:
    """The forward pass's peak memory per method and length, as a Markdown table."""
    found = attention_peak_memory(lengths, ATTENTION_METHODS, threads=threads,
                                  block_size=block, causal=causal)
    print(f"Peak memory of one forward call above its inputs: 1 head, D = 64, float32, "
          f"{'causal' if causal else 'no mask'}; tiles of {block} keys; {threads} thread(s); "
          f"torch {torch.__version__}")
    print()
    print("| T = S | one T x S matrix (MB) | naive (MB) | tiled (MB) | SDPA (MB) "
          "| naive / tiled | naive (ms) | tiled (ms) | SDPA (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, L in enumerate(lengths):
        naive, tiled, sdpa = (found[m][i] for m in ATTENTION_METHODS)
        print(f"| {L} | {4 * L * L / 1e6:.1f} | {naive.rise / 1e6:.1f} | {tiled.rise / 1e6:.1f} "
              f"| {sdpa.rise / 1e6:.1f} | {naive.rise / tiled.rise:.1f}x "
              f"| {naive.seconds * 1e3:.1f} | {tiled.seconds * 1e3:.1f} "
              f"| {sdpa.seconds * 1e3:.1f} |")
    naive, tiled = found["naive"][-1], found["tiled"][-1]
    print()
    print(f"at T = S = {lengths[-1]}: tiled needs {tiled.rise / naive.rise:.3f} of the "
          f"naive path's memory ({naive.rise / tiled.rise:.0f}x less)")
    print()


def saved_table(lengths: list[int], block: int) -> None:
    """Bytes saved for the backward pass of causal attention, as a Markdown table."""
    print(f"Saved for the backward pass (causal, 1 head, D = 64, float32, q, k, v included); "
          f"tiles of {block} keys")
    print()
    print("| T = S | one T x S matrix (MB) | naive (MB) | tiled, recomputing (MB) | SDPA (MB) "
          "| naive / tiled |")
    print("|---|---|---|---|---|---|")
    for L in lengths:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 1, L, 64, generator=g, requires_grad=True) for _ in range(3))
        mask = causal_mask(L, L)
        naive = saved_bytes(scaled_dot_product_attention, q, k, v, mask)
        tiled = saved_bytes(flash_attention, q, k, v, causal=True, block_size=block)
        sdpa = saved_bytes(F.scaled_dot_product_attention, q, k, v, is_causal=True)
        print(f"| {L} | {4 * L * L / 1e6:.1f} | {naive / 1e6:.1f} | {tiled / 1e6:.2f} "
              f"| {sdpa / 1e6:.2f} | {naive / tiled:.0f}x |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[512, 1024, 2048, 4096, 8192], help="sequence lengths T = S")
    parser.add_argument("--saved-lengths", type=int, nargs="+", default=[1024, 2048, 4096],
                        help="sequence lengths of the saved-for-backward table")
    parser.add_argument("--block", type=int, default=64, help="key tile of the tiled path")
    parser.add_argument("--causal", choices=["both", "no", "yes"], default="both",
                        help="forward tables without a mask, with a causal one, or both")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    args = parser.parse_args()
    for causal in {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]:
        peak_table(args.lengths, args.block, causal, args.threads)
    torch.set_num_threads(args.threads)
    saved_table(args.saved_lengths, args.block)


if __name__ == "__main__":
    main()

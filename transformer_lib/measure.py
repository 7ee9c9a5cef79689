"""Peak memory of a piece of CPU code, measured from outside: how far a fresh process's peak
resident set size (RSS) rises above its RSS just before the code runs.

PyTorch keeps allocator statistics on the GPU (``torch.cuda.max_memory_allocated``) but none
on the CPU, where tensors come straight from the C library's ``malloc``. What the operating
system does keep is each process's *peak RSS*: the largest amount of physical memory it ever
held (``getrusage``'s ``ru_maxrss``, ``VmHWM`` in ``/proc/self/status`` on Linux). A peak only
ever grows, so a measurement needs a process of its own, started for it and thrown away after.

How a measurement runs. :func:`peak_memory_rise` starts one worker process
(``python -m transformer_lib.measure``), which imports torch and the job's module once (about
1.5 s) and runs nothing else. On Linux it then forks one child per job: a copy of that idle
process, whose peak starts where the copy's RSS is. Forking a process that has imported torch
is safe only while no thread of torch has started in it: the worker runs no tensor work before
it forks, and must stay that way. Elsewhere (macOS, Windows) each job gets a worker of its own.
In its process a job is prepared (``job(**kwargs)`` creates the inputs, warms up, and returns
a function of no arguments), then the current RSS is read, the function is called, and the
peak RSS is read. The rise, peak minus before, is the memory the call
needed *above its inputs*: every temporary it created, and its output.

What it counts, and its noise:

- Pages that were touched. ``torch.empty`` of a gigabyte that nobody writes costs nothing
  here; a tensor whose every element is written costs its size.
- Granularity: one page (4 KiB on Linux x86), and Linux updates its page counters lazily
  (by tens of pages per thread), so the current and the peak readings can disagree by a few
  hundred KB. Below about a megabyte the number is noise.
- The allocator. glibc's ``malloc`` maps a large block from the system when it is allocated
  and returns it when it is freed, so two large temporaries that are not alive at the same
  time are not counted together. Smaller blocks come from its heap, which keeps freed memory
  for reuse, and by default "large" moves (from 128 KiB up to 32 MiB) as blocks are freed:
  the same code then measured 19 to 28 MB in different runs. The measuring process fixes the
  threshold at 128 KiB (``MALLOC_MMAP_THRESHOLD_``, unless it is already set), which makes
  runs agree within about 2 %. Other C libraries (macOS) ignore the variable.
- Everything else the process does in between, e.g. a BLAS library's first work buffers;
  the jobs warm up on a small input first so that those land before the "before" reading.
- Without ``/proc`` (macOS), the current RSS is not available from the standard library and
  the "before" reading is the peak so far instead; the rise can then only be smaller.
  ``ru_maxrss`` is in KiB on Linux and in bytes on macOS; both are converted to bytes.

Measured on Linux: a job that writes 200 MB rises by 200 MB within 1 %; attention that
forms a ``(T, S)`` float32 matrix rises by at least ``T · S · 4`` bytes.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

try:
    import resource  # Unix only
except ImportError:  # Windows: no getrusage
    resource = None

__all__ = ["PeakMemory", "peak_memory_rise", "attention_peak_memory", "current_rss_bytes",
           "peak_rss_bytes", "touch_bytes", "attention_job", "ATTENTION_METHODS"]

ATTENTION_METHODS = ("naive", "tiled", "sdpa")  #: see attention_job


@dataclass(frozen=True)
class PeakMemory:
    """One measurement: the rise of the peak RSS during the call, and how long the call took."""

    rise: int  #: bytes: the process's peak RSS after the call minus its RSS just before it
    seconds: float  #: wall-clock time of the call (not of the preparation)
    before: int  #: bytes: the process's RSS just before the call (inputs included)


# Reading the process's memory -----------------------------------------------------------------


def peak_rss_bytes() -> int:
    """The largest resident set size this process has had so far, in bytes."""
    if resource is None:
        raise RuntimeError("peak_rss_bytes needs the resource module (Linux or macOS)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS: bytes; Linux: KiB


def current_rss_bytes() -> int | None:
    """This process's resident set size now, in bytes; None where ``/proc`` is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            resident_pages = int(f.read().split()[1])
    except OSError:
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


# Jobs: prepare the inputs, return the call to measure --------------------------------------------


def touch_bytes(n_bytes: int) -> Callable[[], Any]:
    """A job that writes ``n_bytes`` of fresh memory: its rise should be ``n_bytes``.

    The returned function allocates a buffer of ``n_bytes`` bytes, writes every page of it,
    and returns it (so it is alive when the peak is read).

    Args:
        n_bytes: the size of the buffer.

    Returns:
        The job, a function of no arguments.
    """
    def run() -> bytearray:
        buffer = bytearray(n_bytes)  # zero pages: mapped, not yet resident
        buffer[::4096] = b"\x01" * len(range(0, n_bytes, 4096))  # one write per page
        return buffer
    return run


def attention_job(method: str, length: int, *, head_dim: int = 64, batch: int = 1,
                  heads: int = 1, causal: bool = False, block_size: int = 64,
                  dtype: str = "float32", seed: int = 0) -> Callable[[], Any]:
    """A job: one attention call on random q, k, v of ``(batch, heads, length, head_dim)``.

    Args:
        method: ``"naive"``, the library's readable
            :func:`transformer_lib.attention.scaled_dot_product_attention`, which forms the
            ``(T, S)`` scores and weights; ``"tiled"``,
            :func:`transformer_lib.flash.flash_attention` (key/value tiles of ``block_size``,
            online softmax); ``"sdpa"``, PyTorch's fused
            ``torch.nn.functional.scaled_dot_product_attention``.
        length: T = S, the number of queries and of keys.
        head_dim: D.
        batch: B.
        heads: H.
        causal: a causal mask (top-left and bottom-right agree when T = S).
        block_size: keys per tile of ``"tiled"``.
        dtype: the name of a torch dtype, e.g. ``"float32"``.
        seed: seeds q, k and v.

    Returns:
        The call to measure, with the inputs already created and one small call made (the
        warm-up).
    """
    import torch
    import torch.nn.functional as F

    if method not in ATTENTION_METHODS:
        raise ValueError(f"method must be one of {ATTENTION_METHODS}, got {method!r}")
    if method == "naive":
        from transformer_lib.attention import causal_mask, scaled_dot_product_attention

        def attend(q, k, v):
            mask = causal_mask(q.shape[-2], k.shape[-2]) if causal else None
            return scaled_dot_product_attention(q, k, v, mask)  # (out, weights)
    elif method == "tiled":
        from transformer_lib.flash import flash_attention

        def attend(q, k, v):
            return flash_attention(q, k, v, causal=causal, block_size=block_size)
    else:
        def attend(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, length, head_dim, generator=g,
                           dtype=getattr(torch, dtype)) for _ in range(3))
    warm = min(length, 2 * block_size)
    attend(q[..., :warm, :], k[..., :warm, :], v[..., :warm, :])  # first-call buffers
    return lambda: attend(q, k, v)


# Running jobs in fresh processes --------------------------------------------------------------


def _measure_here(job: Callable[..., Callable[[], Any]], kwargs: dict, threads: int) -> dict:
    """Prepare ``job(**kwargs)`` and measure its call in this process."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    run = job(**kwargs)
    before = current_rss_bytes()
    if before is None:  # no /proc: the peak so far, an upper bound of the RSS now
        before = peak_rss_bytes()
    start = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - start
    peak = peak_rss_bytes()
    del result
    return {"rise": max(peak - before, 0), "seconds": seconds, "before": before}


def _resolve(target: str) -> Callable[..., Callable[[], Any]]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _fork_and_measure(job, kwargs: dict, threads: int) -> dict:
    """Measure one job in a child forked from this (idle) process."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: measure, send the result, leave without cleaning up
        os.close(read_end)
        try:
            result = _measure_here(job, kwargs, threads)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if not chunks:
        return {"error": f"the measuring process ended without a result (status {status}; "
                         "out of memory?)"}
    return json.loads(b"".join(chunks))


def _worker(request: dict) -> list[dict]:
    """What ``python -m transformer_lib.measure`` does with one request (read from stdin)."""
    for module in request.get("preload", []):
        importlib.import_module(module)
    job = _resolve(request["target"])
    jobs, threads = request["kwargs_list"], request["threads"]
    if hasattr(os, "fork") and sys.platform.startswith("linux"):
        return [_fork_and_measure(job, kwargs, threads) for kwargs in jobs]
    if len(jobs) != 1:
        raise ValueError(f"without fork, a worker measures one job at a time, got {len(jobs)}")
    return [_measure_here(job, jobs[0], threads)]


MMAP_THRESHOLD = 128 * 1024  # bytes: glibc's default, fixed (see the module's docstring)


def _start_worker(request: dict, timeout: float) -> list[dict]:
    env = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), **os.environ}
    done = subprocess.run([sys.executable, "-m", "transformer_lib.measure"],
                          input=json.dumps(request), capture_output=True, text=True,
                          timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def peak_memory_rise(job: Callable[..., Callable[[], Any]] | str,
                     kwargs_list: Sequence[dict], *, threads: int = 1,
                     timeout: float = 600.0) -> list[PeakMemory]:
    """Measure each job in a fresh process: the rise of the peak RSS during its call.

    Args:
        job: a module-level function (or its ``"module:name"``); ``job(**kwargs)`` prepares
            the inputs and returns a function of no arguments, the call that is measured.
            The fresh process imports it, so it must be importable (not defined in a
            notebook).
        kwargs_list: one dict of keyword arguments per measurement (JSON values only).
        threads: ``torch.set_num_threads`` in the measuring process.
        timeout: seconds allowed for all the measurements together.

    Returns:
        One :class:`PeakMemory` per dict of ``kwargs_list``, in order.
    """
    target = job if isinstance(job, str) else f"{job.__module__}:{job.__qualname__}"
    module, _, name = target.partition(":")
    if not name or "." in name or module in ("__main__", "__mp_main__"):
        raise ValueError(f"job must be a module-level function of an importable module, got "
                         f"{target!r}")
    request = {"target": target, "threads": threads, "preload": ["torch", module]}
    if sys.platform.startswith("linux") and hasattr(os, "fork"):
        results = _start_worker({**request, "kwargs_list": list(kwargs_list)}, timeout)
    else:  # one fresh process per measurement
        results = [_start_worker({**request, "kwargs_list": [kwargs]}, timeout)[0]
                   for kwargs in kwargs_list]
    errors = [f"{kwargs}: {r['error']}" for kwargs, r in zip(kwargs_list, results)
              if "error" in r]
    if errors:
        raise RuntimeError("measurement failed for " + "; ".join(errors))
    return [PeakMemory(r["rise"], r["seconds"], r["before"]) for r in results]


def attention_peak_memory(lengths: Sequence[int], methods: Sequence[str] = ("naive", "tiled"),
                          *, threads: int = 1, **options: Any) -> dict[str, list[PeakMemory]]:
    """The peak-memory rise of one attention call at each sequence length T = S.

    Args:
        lengths: the sequence lengths; each (method, length) is measured in a fresh process.
        methods: some of ``"naive"``, ``"tiled"``, ``"sdpa"`` (see :func:`attention_job`).
        threads: ``torch.set_num_threads`` in the measuring process.
        options: passed to :func:`attention_job` (``head_dim``, ``batch``, ``heads``,
            ``causal``, ``block_size``, ``dtype``, ``seed``).

    Returns:
        method -> one :class:`PeakMemory` per length: the bytes above the inputs, and the
        call's time.
    """
    unknown = [m for m in methods if m not in ATTENTION_METHODS]
    if unknown:
        raise ValueError(f"methods must be among {ATTENTION_METHODS}, got {unknown}")
    jobs = [dict(method=m, length=int(L), **options) for m in methods for L in lengths]
    results = iter(peak_memory_rise(attention_job, jobs, threads=threads))
    return {m: [next(results) for _ in lengths] for m in methods}


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.stdin.read()))))

"""transformer_lib.measure: the rise of a fresh process's peak RSS measures what a call holds.

Calibrated on known allocations; attention that forms a (T, S) matrix must show at least its
size, and tiled attention far less. Each test starts one measuring process (about 1.5 s)."""
from __future__ import annotations

import sys

import pytest

from transformer_lib import measure
from transformer_lib.measure import (
    PeakMemory,
    attention_peak_memory,
    current_rss_bytes,
    peak_memory_rise,
    peak_rss_bytes,
    touch_bytes,
)

MB = 10 ** 6
# Resident memory as Linux and glibc report it (page granularity, the mmap threshold): the
# calibrated readings below are checked where the chapters measure them, on Linux.
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="calibrated for resident memory as Linux reports it")


@linux_only
def test_known_allocations_are_measured_within_ten_percent():
    """Writing 200 MB (and 50 MB, in another process) rises by that much, ± 10 %; an
    allocation that is never written costs (almost) nothing."""
    r200, r50 = peak_memory_rise(touch_bytes, [{"n_bytes": 200 * MB}, {"n_bytes": 50 * MB}])
    assert isinstance(r200, PeakMemory)
    assert abs(r200.rise - 200 * MB) <= 0.1 * 200 * MB, r200
    assert abs(r50.rise - 50 * MB) <= 0.1 * 50 * MB, r50
    assert r200.before > 10 * MB and r200.seconds >= 0


@pytest.fixture(scope="module")
def attention_rises():
    """One measuring process for the attention tests: naive at 1024, 2048, 4096; tiled twice
    at 4096."""
    jobs = [dict(method="naive", length=L) for L in (1024, 2048, 4096)]
    jobs += [dict(method="tiled", length=4096)] * 2
    r = peak_memory_rise(measure.attention_job, jobs)
    return {"naive": {1024: r[0], 2048: r[1], 4096: r[2]}, "tiled": [r[3], r[4]]}


@linux_only
def test_naive_attention_holds_the_score_matrix_and_tiled_attention_does_not(attention_rises):
    """At T = S = 4096 the (T, S) float32 matrix is 67 MB: the naive path (scores and weights)
    rises by at least that; the tiled path by less than a tenth of what the naive one needs."""
    L = 4096
    matrix = L * L * 4
    naive, tiled = attention_rises["naive"][L], attention_rises["tiled"][0]
    assert naive.rise >= matrix, (naive, matrix)
    assert tiled.rise <= naive.rise / 10, (tiled, naive)


@linux_only
def test_memory_of_naive_attention_grows_with_the_square_of_the_length(attention_rises):
    naive = attention_rises["naive"]
    # Linear growth would double; a fixed overhead weighs more at the shorter length.
    assert 2.5 < naive[2048].rise / naive[1024].rise < 5.0
    assert 3.5 < naive[4096].rise / naive[2048].rise < 4.5


@linux_only
def test_repeated_measurements_agree(attention_rises):
    """With glibc's mmap threshold fixed, the same call measures the same within 5 %."""
    first, second = attention_rises["tiled"]
    assert abs(first.rise - second.rise) <= 0.05 * first.rise, (first, second)


@linux_only
def test_attention_peak_memory_measures_each_method_at_each_length():
    found = attention_peak_memory([256, 512], ("tiled", "sdpa"), causal=True, block_size=32)
    assert list(found) == ["tiled", "sdpa"] and all(len(v) == 2 for v in found.values())
    assert all(r.rise < 4 * 512 * 512 * 4 for v in found.values() for r in v)


@linux_only
def test_readings_of_this_process_are_consistent():
    now, peak = current_rss_bytes(), peak_rss_bytes()
    assert peak > 10 * MB  # bytes, not KiB: a Python process with torch is far above 10 MB
    if now is not None:  # Linux
        assert 0 < now <= peak + MB  # the kernel syncs its page counters lazily


def test_one_process_per_job_where_fork_is_not_used(monkeypatch):
    """Off Linux the caller starts one measuring process per job: same results."""
    monkeypatch.setattr(measure.sys, "platform", "darwin-like")
    r = peak_memory_rise("transformer_lib.measure:touch_bytes", [{"n_bytes": 30 * MB}])
    assert abs(r[0].rise - 30 * MB) <= 0.1 * 30 * MB
    with pytest.raises(ValueError, match="one job at a time, got 2"):
        measure._worker({"target": "transformer_lib.measure:touch_bytes", "threads": 1,
                         "kwargs_list": [{"n_bytes": 1}, {"n_bytes": 1}]})


def test_bad_jobs_are_refused_or_reported():
    def local_job():
        return lambda: None

    with pytest.raises(ValueError, match="module-level function"):
        peak_memory_rise(local_job, [{}])
    with pytest.raises(ValueError, match="module-level function"):
        peak_memory_rise(lambda: None, [{}])
    with pytest.raises(ValueError, match="methods must be among"):
        attention_peak_memory([16], ("fast",))
    with pytest.raises(RuntimeError, match="measurement failed.*ValueError: method must be"):
        peak_memory_rise(measure.attention_job, [{"method": "fast", "length": 16}])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss units of Linux")
def test_peak_is_read_in_bytes_on_linux():
    import resource

    assert peak_rss_bytes() >= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


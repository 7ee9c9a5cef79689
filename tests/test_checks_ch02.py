"""Chapter 2's checkers (``transformer_lib/checks/ch02_qkv_roles.py``) name the usual mistakes
in words a student can act on. The contract every checker keeps is in
``test_checks_contract.py``."""
from __future__ import annotations

import torch

from transformer_lib.checks import (
    ch02_qkv_roles,
    check_first_future_leak,
    check_head_bilinear_forms,
    check_teacher_forcing,
)

from chapter_solutions import references
from conftest import mistake_tests

first_future_leak, head_bilinear_forms, teacher_forcing = references(
    "02_qkv_roles", "first_future_leak", "head_bilinear_forms", "teacher_forcing")


def forcing_wrong(*, shift=True, bos_zero=False, ignore=-100, pad_in_input=False):
    """teacher_forcing with one of the usual mistakes."""

    def wrong(tgt, bos, pad):
        start = torch.full_like(tgt[:, :1], 0 if bos_zero else bos)  # (B, 1)
        dec_in = torch.cat([start, tgt[:, :-1]], dim=1) if shift else tgt.clone()
        labels = tgt if ignore is None else tgt.masked_fill(tgt == pad, ignore)
        if pad_in_input:
            dec_in = dec_in.masked_fill(dec_in == pad, -100)
        return dec_in, labels

    return wrong


def forms_by_columns(q_weight, k_weight, n_heads):
    """Heads as blocks of input columns: the (in, out) reading of nn.Linear's weight."""
    C = q_weight.shape[1]
    Wq = q_weight.view(C, n_heads, C // n_heads).permute(1, 0, 2)  # (H, C, D)
    Wk = k_weight.view(C, n_heads, C // n_heads).permute(1, 0, 2)  # (H, C, D)
    return Wq @ Wk.transpose(1, 2)


def forms_interleaved(q_weight, k_weight, n_heads):
    """Head h taken as rows h, h + H, h + 2H, ...: the wrong split of the output rows."""
    C = q_weight.shape[1]
    Wq = q_weight.view(C // n_heads, n_heads, C).transpose(0, 1)  # (H, D, C)
    Wk = k_weight.view(C // n_heads, n_heads, C).transpose(0, 1)  # (H, D, C)
    return Wq.transpose(1, 2) @ Wk


def leak_including_own_token(decode, tgt):
    """Compares the positions up to and including the changed one."""
    base, V = decode(tgt), decode(tgt).shape[-1]
    for j in range(tgt.shape[1]):
        changed = tgt.clone()
        changed[:, j] = (tgt[:, j] + 1) % V
        moved = (decode(changed)[:, :j + 1] != base[:, :j + 1]).any(dim=(0, 2))
        if moved.any():
            return int(moved.nonzero()[0])
    return -1


def leak_only_last_token(decode, tgt):
    """Changes only the last token."""
    base, V, T = decode(tgt), decode(tgt).shape[-1], tgt.shape[1]
    changed = tgt.clone()
    changed[:, -1] = (tgt[:, -1] + 1) % V
    moved = (decode(changed)[:, :T - 1] != base[:, :T - 1]).any(dim=(0, 2))
    return int(moved.nonzero()[0]) if moved.any() else -1


def leak_first_changed_position(decode, tgt):
    """Stops at the first changed position that moves anything: misses longer leaks."""
    base, V = decode(tgt), decode(tgt).shape[-1]
    for j in range(1, tgt.shape[1]):
        changed = tgt.clone()
        changed[:, j] = (tgt[:, j] + 1) % V
        moved = (decode(changed)[:, :j] != base[:, :j]).any(dim=(0, 2))
        if moved.any():
            return int(moved.nonzero()[0])
    return -1


def leak_returns_changed_position(decode, tgt):
    base, V = decode(tgt), decode(tgt).shape[-1]
    for j in range(1, tgt.shape[1]):
        changed = tgt.clone()
        changed[:, j] = (tgt[:, j] + 1) % V
        if (decode(changed)[:, :j] != base[:, :j]).any():
            return j
    return -1


def leak_in_place(decode, tgt):
    """Right answer, but writes into the caller's tensor."""
    answer = first_future_leak(decode, tgt)
    tgt[:, 0] = (tgt[:, 0] + 1) % decode(tgt).shape[-1]
    return answer


WRONG = [
    # (checker, wrong solution, fragments that the verdict must contain)
    (check_teacher_forcing, forcing_wrong(shift=False),
     ["wrong values in dec_in", "is not shifted"]),
    (check_teacher_forcing, forcing_wrong(bos_zero=True),
     ["1 of 4 checks passed", "the `bos` argument (here 11)"]),
    (check_teacher_forcing, forcing_wrong(ignore=None),
     ["wrong values in labels", "would train the model to predict padding"]),
    (check_teacher_forcing, forcing_wrong(ignore=0), ["0 is a token id like any other"]),
    (check_teacher_forcing, forcing_wrong(pad_in_input=True),
     ["wrong values in dec_in", "-100 belongs in the labels only"]),
    (check_teacher_forcing, lambda tgt, bos, pad: teacher_forcing(tgt, bos, pad)[0],
     ["return the pair (dec_in, labels)"]),
    (check_teacher_forcing,
     lambda tgt, bos, pad: tuple(t.float() for t in teacher_forcing(tgt, bos, pad)),
     ["wrong dtype for dec_in: expected torch.int64, got torch.float32"]),
    (check_head_bilinear_forms, lambda q, k, h: head_bilinear_forms(q, k, h).transpose(1, 2),
     ["does not give the layer's scores", "each form is transposed"]),
    (check_head_bilinear_forms, lambda q, k, h: (q.T @ k).expand(h, *q.T.shape),
     ["1 of 3 checks passed", "the sum of all the heads' forms"]),
    (check_head_bilinear_forms, forms_by_columns, ["not of input columns"]),
    (check_head_bilinear_forms, forms_interleaved, ["not every H-th row"]),
    (check_head_bilinear_forms,
     lambda q, k, h: head_bilinear_forms(q, k, h) / (q.shape[1] // h) ** 0.5,
     ["leave out the 1/√D scale"]),
    (check_head_bilinear_forms,
     lambda q, k, h: q.view(h, -1, q.shape[1]) @ k.view(h, -1, q.shape[1]).transpose(1, 2),
     ["wrong shape for the forms: expected (H, C, C) = (4, 8, 8), got (4, 2, 2)",
      "put the transpose on the other factor"]),
    (check_first_future_leak, leak_including_own_token,
     ["returned 0, expected -1 (a causal decoder)", "every position may read its own token"]),
    (check_first_future_leak, leak_only_last_token,
     ["returned -1, expected 3 (position 3 already sees a later token)", "not only the last"]),
    (check_first_future_leak, leak_first_changed_position,
     ["returned 3, expected 1", "a later token can leak further back"]),
    (check_first_future_leak, leak_returns_changed_position,
     ["returned 5, expected 3", "that is the position you changed"]),
    (check_first_future_leak, leak_in_place, ["changed its input `tgt` in place"]),
    (check_first_future_leak, lambda decode, tgt: float(first_future_leak(decode, tgt)),
     ["return one int, a position or -1"]),
]


test_wrong_solution_is_rejected_with_the_reason, test_every_checker_knows_at_least_two_mistakes = (
    mistake_tests(WRONG, ch02_qkv_roles))

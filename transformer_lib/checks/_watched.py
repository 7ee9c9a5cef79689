"""What the guard (:mod:`._guard`) watches besides the calls: the operators under the
framework's ready-made answers, and its own state, which a submission must not change."""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

_CHECKS = "transformer_lib.checks"

# The operators under the framework's ready-made answers: refusing the answer refuses these too,
# however they are reached (``torch.ops.aten._softmax``, ``F.softmin``, ``torch.group_norm``).
_SOFTMAX_OPS = ("_softmax", "_safe_softmax", "softmax", "_log_softmax", "log_softmax",
                "special_softmax", "special_log_softmax")
_ATTENTION_OPS = ("scaled_dot_product_attention", "_scaled_dot_product_attention_math",
                  "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_cudnn_attention",
                  "_scaled_dot_product_fused_attention_overrideable")
_NORM_OPS = ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm",
             "native_group_norm", "instance_norm", "batch_norm", "native_batch_norm",
             "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
             "_batch_norm_impl_index", "cudnn_batch_norm")
_OPS = {"torch.softmax": _SOFTMAX_OPS, "torch.nn.functional.softmax": _SOFTMAX_OPS,
        "torch.nn.functional.scaled_dot_product_attention": _ATTENTION_OPS,
        "torch.nn.MultiheadAttention": _ATTENTION_OPS,
        "torch.nn.functional.layer_norm": _NORM_OPS, "torch.nn.functional.rms_norm": _NORM_OPS}


def _snapshot(owners: list[Any]) -> list[tuple[Any, dict]]:
    """What a submission must not change while it runs, with copies of it: the namespaces of
    ``owners`` (the guard's module and classes), and every checker module's ``RULES``."""
    spaces: list[tuple[Any, dict]] = [(owner, dict(vars(owner))) for owner in owners]
    for name, module in sorted(sys.modules.items()):
        rules = getattr(module, "RULES", None) if name.startswith(_CHECKS + ".") else None
        if isinstance(rules, dict):
            spaces += [(module, {"RULES": rules}), (rules, dict(rules))]
    return spaces


def _restore(snapshot: list[tuple[Any, dict]]) -> bool:
    """Put back what changed since ``snapshot``; whether anything had. A checker module's
    entry holds only its ``RULES``: its other names are left alone."""
    changed = False
    for owner, saved in snapshot:
        current = owner if isinstance(owner, dict) else vars(owner)
        whole = not (isinstance(owner, ModuleType) and set(saved) == {"RULES"})
        added = set(current) - set(saved) if whole else set()
        if not added and all(k in current and current[k] is v for k, v in saved.items()):
            continue
        changed = True
        if isinstance(owner, dict):
            owner.clear()
            owner.update(saved)
            continue
        for key in added:
            delattr(owner, key)
        for key, value in saved.items():
            if current.get(key) is not value:
                setattr(owner, key, value)
    return changed

"""The guard of the "write it yourself" exercises (``transformer_lib.checks._guard``): while a
checker runs the student's function, a call that the student's own code makes to a checker,
to a private or unlisted library function, or to a refused framework function fails the check,
whatever route the code takes to it; the library's own calls and the student's own code pass.
"""
from __future__ import annotations

import threading

import pytest
import torch

from transformer_lib.checks import _harness
from transformer_lib.checks._guard import Refused, Rules, guard

NOTHING = Rules()
SOFTMAX = Rules(refuse=("torch.softmax", "torch.Tensor.softmax", "torch.nn.functional.softmax"))


def _student(source: str, name: str = "f"):
    """Define ``name`` from ``source`` in a fresh namespace, as a notebook cell would."""
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace[name]


def _attempt(fn, rules: Rules, *args):
    """``_harness._call(fn, args)`` as a checker with ``rules`` would run it."""
    token = _harness._RULES.set(rules)
    try:
        return _harness._call(fn, args, [f"arg{i}" for i in range(len(args))])
    finally:
        _harness._RULES.reset(token)


def _refused(fn, rules: Rules, *args) -> str:
    """The failure message: the call must be refused."""
    with pytest.raises(_harness._Failure) as caught:
        _attempt(fn, rules, *args)
    message = caught.value.message
    assert message.startswith("this exercise asks you to write it yourself: `")
    assert message.endswith("` is not allowed here")
    return message


X = torch.randn(2, 3, 4)

ROUTES = {
    "by name": "from transformer_lib.attention import scaled_dot_product_attention\n"
               "def f(q):\n    return scaled_dot_product_attention(q, q, q)[0]\n",
    "alias": "from transformer_lib.attention import scaled_dot_product_attention as attend\n"
             "def f(q):\n    return attend(q, q, q)[0]\n",
    "module attribute": "import transformer_lib.attention as A\n"
                        "def f(q):\n    return A.scaled_dot_product_attention(q, q, q)[0]\n",
    "fetched before the call": "import transformer_lib.attention as A\n"
                               "saved = A.scaled_dot_product_attention\n"
                               "def f(q):\n    return saved(q, q, q)[0]\n",
    "import inside": "def f(q):\n"
                     "    from transformer_lib.attention import scaled_dot_product_attention\n"
                     "    return scaled_dot_product_attention(q, q, q)[0]\n",
    "importlib and getattr": "import importlib\n"
                             "def f(q):\n"
                             "    m = importlib.import_module('transformer_lib.attention')\n"
                             "    return getattr(m, 'scaled_dot_product_attention')(q, q, q)[0]\n",
    "functools.partial": "import functools\n"
                         "from transformer_lib.attention import scaled_dot_product_attention\n"
                         "def f(q):\n"
                         "    return functools.partial(scaled_dot_product_attention, q)(q, q)[0]\n",
    "map": "from transformer_lib.attention import scaled_dot_product_attention as a\n"
           "def f(q):\n    return list(map(a, [q], [q], [q]))[0][0]\n",
    "exec": "def f(q):\n    ns = {'q': q}\n"
            "    exec('from transformer_lib.attention import scaled_dot_product_attention as a\\n"
            "r = a(q, q, q)[0]', ns)\n    return ns['r']\n",
    "exception caught": "from transformer_lib.attention import scaled_dot_product_attention\n"
                        "def f(q):\n    try:\n        scaled_dot_product_attention(q, q, q)\n"
                        "    except Exception:\n        pass\n    return q\n",
}


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_to_an_unlisted_library_function_is_refused(route):
    fn = _student(ROUTES[route])
    assert "transformer_lib.attention.scaled_dot_product_attention" in _refused(fn, NOTHING, X)
    # The same function outside a check runs as usual.
    assert isinstance(fn(X), torch.Tensor)


def test_a_listed_function_is_allowed_and_may_call_private_helpers():
    fn = _student(ROUTES["by name"])
    allowed = Rules(allow=("scaled_dot_product_attention",))
    assert torch.allclose(_attempt(fn, allowed, X), fn(X))
    layer = _student("from transformer_lib.attention import MultiHeadAttention\n"
                     "def f(x):\n    return MultiHeadAttention(4, 2)(x)\n")
    assert _attempt(layer, Rules(allow=("MultiHeadAttention",)), X).shape == X.shape
    assert "attention.MultiHeadAttention" in _refused(layer, NOTHING, X)


def test_one_method_may_be_listed_without_the_others():
    from transformer_lib.decoder import Decoder, DecoderConfig
    model = Decoder(DecoderConfig(vocab_size=8, d_model=8, n_layers=1, n_heads=2, d_ff=8,
                                  max_seq_len=16))
    tokens = torch.zeros(1, 3, dtype=torch.long)
    forward = _student("def f(m, t):\n    return m(t)\n")
    generate = _student("def f(m, t):\n    return m.generate(t, 2)\n")
    rules = Rules(allow=("Decoder.forward",))
    assert _attempt(forward, rules, model, tokens).shape == (1, 3, 8)
    assert "decoder.Decoder.generate" in _refused(generate, rules, model, tokens)


def test_a_subclass_of_a_library_class_runs_the_librarys_code_and_is_refused():
    fn = _student("from transformer_lib.attention import MultiHeadAttention\n"
                  "class Mine(MultiHeadAttention):\n    pass\n"
                  "def f(x):\n    return Mine(4, 2)(x)\n")
    assert "attention.MultiHeadAttention" in _refused(fn, NOTHING, X)


def test_private_library_functions_are_refused_even_in_an_allowed_module():
    fn = _student("from transformer_lib import validation\n"
                  "def f(x):\n    return validation.zero_rows_without_keys\n"
                  "def g(x):\n    return [n for n in dir(validation) if n.startswith('_c')]\n")
    assert _attempt(fn, NOTHING, X) is not None  # fetching is not calling
    private = _student("from transformer_lib.attention import _heads_per_kv_head\n"
                       "def f(x):\n    return _heads_per_kv_head(x, x, x)\n")
    message = _refused(private, Rules(allow=("scaled_dot_product_attention",)), X)
    assert "transformer_lib.attention._heads_per_kv_head" in message


def test_the_checkers_and_their_references_are_refused():
    fn = _student("from transformer_lib.checks import ch01_attention as c\n"
                  "def f(lengths):\n    return c._left_padded(lengths, 3, 4)\n")
    assert "checks.ch01_attention._left_padded" in _refused(
        fn, Rules(allow=("causal_mask",)), torch.tensor([2, 3]))
    checker = _student("from transformer_lib.checks import check_score_scale\n"
                       "def f(x):\n    check_score_scale(lambda d, s: 1.0)\n    return x\n")
    assert "check_score_scale" in _refused(checker, NOTHING, X)


def test_the_guard_itself_cannot_be_called_or_switched_off():
    given = _student("from transformer_lib.checks import _guard, ch01_attention as c\n"
                     "def f(x):\n    _guard.given(c._left_padded)\n    return x\n")
    assert "_guard.given" in _refused(given, NOTHING, X)
    off = _student("import sys\nfrom transformer_lib.attention import causal_mask\n"
                   "def f(x):\n    sys.setprofile(None)\n    causal_mask(3)\n    return x\n")
    assert "sys.setprofile" in _refused(off, NOTHING, X)
    modes_off = _student("import torch\nimport torch.nn.functional as F\n"
                         "def f(q):\n    with torch._C.DisableTorchFunction():\n"
                         "        return F.scaled_dot_product_attention(q, q, q)\n")
    assert "scaled_dot_product_attention" in _refused(
        modes_off, Rules(refuse=("torch.nn.functional.scaled_dot_product_attention",)), X)


@pytest.mark.parametrize("call", ["torch.softmax(x, -1)", "x.softmax(-1)",
                                  "torch.nn.functional.softmax(x, -1)",
                                  "functools.partial(torch.softmax, dim=-1)(x)",
                                  "torch.Tensor.softmax(x, -1)"])
def test_the_frameworks_ready_made_answer_is_refused_however_it_is_reached(call):
    fn = _student(f"import functools\nimport torch\ndef f(x):\n    return {call}\n")
    assert "softmax" in _refused(fn, SOFTMAX, X)
    own = _student("def f(x):\n    e = (x - x.amax(-1, keepdim=True)).exp()\n"
                   "    return e / e.sum(-1, keepdim=True)\n")
    assert torch.allclose(_attempt(own, SOFTMAX, X), torch.softmax(X, -1))


def test_a_framework_class_and_a_whole_package_can_be_refused():
    mha = _student("from torch import nn\ndef f(x):\n    return nn.MultiheadAttention(4, 2)\n")
    assert "torch.nn.MultiheadAttention" in _refused(
        mha, Rules(refuse=("torch.nn.MultiheadAttention",)), X)
    json_dump = _student("import json\ndef f(x):\n    return json.dumps([1])\n")
    assert "json." in _refused(json_dump, Rules(refuse=("json.*",)), X)


def test_the_librarys_own_use_of_a_refused_framework_function_is_allowed():
    """F.softmax is refused to the student; the library's attention, when allowed, uses it."""
    fn = _student(ROUTES["by name"])
    rules = Rules(allow=("scaled_dot_product_attention",),
                  refuse=("torch.softmax", "torch.Tensor.softmax", "torch.nn.functional.softmax",
                          "torch.nn.functional.scaled_dot_product_attention"))
    assert torch.allclose(_attempt(fn, rules, X), fn(X))


def test_framework_code_in_any_package_folder_on_the_path_is_the_frameworks(tmp_path,
                                                                           monkeypatch):
    """A package folder that a ``.pth`` file (or Colab's ``dist-packages``) puts on the path
    holds the framework too: its own switching of torch function modes is not the student's."""
    folder = tmp_path / "site-packages"
    folder.mkdir()
    (folder / "framework_like.py").write_text(
        "import torch\ndef plus_one(x):\n    with torch._C.DisableTorchFunction():\n"
        "        return x + 1\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    fn = _student("import framework_like\ndef f(x):\n    return framework_like.plus_one(x)\n")
    assert torch.equal(_attempt(fn, NOTHING, X), X + 1)
    own = _student("import torch\ndef f(x):\n    with torch._C.DisableTorchFunction():\n"
                   "        return x + 1\n")
    assert "DisableTorchFunction" in _refused(own, NOTHING, X)
    assert torch._C._is_torch_function_enabled()  # refused, yet its exit ran: modes are back


def test_a_notebooks_own_function_with_a_library_name_is_its_own_code():
    fn = _student("def scaled_dot_product_attention(q, k, v):\n    return q + k + v, None\n"
                  "def f(q):\n    return scaled_dot_product_attention(q, q, q)[0]\n")
    assert torch.equal(_attempt(fn, NOTHING, X), 3 * X)


def test_a_freshly_imported_copy_of_the_library_is_still_the_library():
    """The grader imports the checkers afresh: the notebook's module objects are other ones."""
    import importlib.util

    import transformer_lib.positional as real
    spec = importlib.util.spec_from_file_location("transformer_lib.positional", real.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    fn = _student("def f(n):\n    return P.sinusoidal_encoding(n, 4)\n")
    fn.__globals__["P"] = copy
    assert "positional.sinusoidal_encoding" in _refused(fn, NOTHING, 3)


def test_refusals_do_not_leak_out_of_the_check():
    fn = _student(ROUTES["by name"])
    _refused(fn, NOTHING, X)
    assert fn(X).shape == X.shape  # no guard left behind
    import sys
    assert sys.getprofile() is None and threading.getprofile() is None


def test_the_guard_raises_into_the_students_code_and_records_the_refusal():
    fn = _student(ROUTES["by name"])
    with guard(NOTHING) as watch:
        with pytest.raises(Refused, match="scaled_dot_product_attention"):
            fn(X)
    assert watch.refusals == ["transformer_lib.attention.scaled_dot_product_attention"]


@pytest.mark.parametrize("bad", ["Decoder._private", "_private", "a.b.c", ""])
def test_rules_name_public_library_names(bad):
    with pytest.raises(ValueError, match=repr(bad)):
        Rules(allow=(bad,))


def test_the_submission_itself_may_not_be_a_library_or_checker_function():
    import functools

    from transformer_lib.attention import masked_softmax
    from transformer_lib.checks import ch01_attention
    assert "attention.masked_softmax" in _refused(masked_softmax, NOTHING, X)
    assert "_left_padded" in _refused(functools.partial(ch01_attention._left_padded),
                                      Rules(allow=("causal_mask",)), torch.tensor([2]), 3, 3)


def test_a_tensor_or_number_subclass_is_refused_as_a_result():
    liar = _student("import torch\n"
                    "class Liar(torch.Tensor):\n    pass\n"
                    "def f(x):\n    return (x.clone().as_subclass(Liar), 1)\n")
    with pytest.raises(_harness._Failure, match="`Liar`, a subclass"):
        _attempt(liar, NOTHING, X)
    yes = _student("class Yes(int):\n    def __eq__(self, other):\n        return True\n"
                   "    __hash__ = int.__hash__\ndef f(x):\n    return Yes(0)\n")
    with pytest.raises(_harness._Failure, match="`Yes`"):
        _attempt(yes, NOTHING, X)
    assert isinstance(_attempt(_student("def f(x):\n    return x * 2, 3, {'a': 1.5}\n"),
                               NOTHING, X), tuple)

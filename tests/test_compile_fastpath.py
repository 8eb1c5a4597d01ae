"""The fast path of a compiled call (`compiler/fastpath.py`) against the general one: for every
pair of argument structures below, the matcher generated for the first accepts the second
exactly when the signature of their prepared forms is the same, and then gives the same arrays
in the same order; a replay through it gives the general path's answer."""

import dataclasses
import itertools

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim
from tracker_gpu.compiler import _prepared
from tracker_gpu.compiler.fastpath import matcher
from tracker_gpu.compiler.signature import signature_and_arrays


@dataclasses.dataclass
class Pair:
    a: object
    b: object


@dataclasses.dataclass
class Other:
    a: object
    b: object


def prepared(args):
    memo = {}
    return tuple(_prepared(a, memo) for a in args)


def adam_state(model, steps):
    state = optim.setup(optim.Adam(0.01), model)
    for _ in range(steps):
        grads = tg.gradient(lambda m: tg.sum(m(np.ones((2, 3))) ** 2), model)[0]
        state, model = optim.update(state, model, grads)
    return state


def with_attributes(x, **attributes):
    """`x` with attributes that are not fields of its dataclass."""
    for name, value in attributes.items():
        setattr(x, name, value)
    return x


def variants():
    """Argument tuples that differ from one another in one way each (and some not at all)."""
    w, v = np.ones((2, 3)), np.zeros(3, np.float32)
    model = nn.Dense(3, 2)
    shared = np.ones(4)
    unhashable = [1]
    return {
        "arrays": (w, v),
        "arrays, new objects": (np.zeros((2, 3)), np.ones(3, np.float32)),
        "another shape": (np.ones((3, 2)), v),
        "another dtype": (w, np.zeros(3)),
        "a 0-d array": (np.asarray(2.0), v),
        "a NumPy scalar": (np.float64(2.0), v),
        "one array twice": (shared, shared),
        "two arrays": (np.ones(4), np.ones(4)),
        "a dict": ({"x": w, "n": 3},),
        "a dict, another number": ({"x": w, "n": 4},),
        "a dict, a bool": ({"x": w, "n": True},),
        "a dict, keys reordered": ({"n": 3, "x": w},),
        "a dict, a float": ({"x": w, "n": 3.0},),
        "a dict, minus zero": ({"x": w, "n": -0.0},),
        "a dict, zero": ({"x": w, "n": 0.0},),
        "a dict, nan": ({"x": w, "n": float("nan")},),
        "a dict, a string": ({"x": w, "n": "3"},),
        "a dict, None": ({"x": w, "n": None},),
        "a dict, complex": ({"x": w, "n": 1j},),
        "a list": ([w, v],),
        "a tuple": ((w, v),),
        "a longer tuple": ((w, v, v),),
        "a dataclass": (Pair(w, 1.5),),
        "another dataclass": (Other(w, 1.5),),
        "a dataclass, another value": (Pair(w, 2.5),),
        "an unhashable object": (Pair(w, unhashable),),
        "another unhashable object": (Pair(w, [1]),),
        "a dataclass with a non-field": (with_attributes(Pair(w, 1.5), k=2.0),),
        "a dataclass, another non-field value": (with_attributes(Pair(w, 1.5), k=3.0),),
        "a dataclass, a non-field array": (with_attributes(Pair(w, 1.5), k=shared),),
        "a dataclass, another non-field array": (with_attributes(Pair(w, 1.5), k=np.ones(4)),),
        "a dataclass, two non-fields": (with_attributes(Pair(w, 1.5), k=2.0, j="a"),),
        "a dataclass, non-fields reordered": (with_attributes(Pair(w, 1.5), j="a", k=2.0),),
        "a function": (Pair(w, np.sin),),
        "another function": (Pair(w, np.cos),),
        "a model": (model,),
        "a model, other weights": (nn.Dense(3, 2),),
        "a model and its Adam state": (model, adam_state(model, 0)),
        "a model and its Adam state, later": (model, adam_state(model, 2)),
        "a model and its Adam state, later still": (model, adam_state(model, 3)),
        "a state twice": (lambda s: (s, s))(adam_state(model, 1)),
        "two states": (adam_state(model, 1), adam_state(model, 1)),
        "a model and another rule's state": (model, optim.setup(optim.Descent(0.1), model)),
        "three arguments": (w, v, v),
    }


CASES = variants()


@pytest.mark.parametrize("first", list(CASES))
def test_the_matcher_accepts_what_the_signature_does_and_nothing_else(first):
    args = CASES[first]
    made = matcher(args, prepared(args))
    key = signature_and_arrays(prepared(args))[0]
    for second, other in CASES.items():
        other_key, arrays = signature_and_arrays(prepared(other))
        found = None if made is None else made(other)
        if made is None:  # no fast path: the general one, always
            continue
        if other_key == key:
            assert found is not None, f"{first!r} does not accept {second!r}"
            assert len(found) == len(arrays), (first, second)
            for got, expected in zip(found, arrays):
                same = got is expected or (  # an optimiser's counts are made anew each call
                    got.shape == () and np.array_equal(got, expected)
                )
                assert same, (first, second)
        else:
            assert found is None, f"{first!r} accepts {second!r}, whose signature differs"


def test_every_case_but_a_shared_state_gets_a_matcher():
    made = {name: matcher(args, prepared(args)) is not None for name, args in CASES.items()}
    assert [name for name, ok in made.items() if not ok] == ["a state twice"]


def counting_signatures(monkeypatch):
    from tracker_gpu import compiler

    calls = []
    real = compiler.signature_and_arrays

    def counted(args):
        calls.append(1)
        return real(args)

    monkeypatch.setattr(compiler, "signature_and_arrays", counted)
    return calls


def train_step(model, state, x, y):
    loss, (grads,) = tg.withgradient(lambda m: tg.mean((m(x) - y) ** 2), model)
    state, model = optim.update(state, model, grads)
    return loss, state, model


def test_a_training_step_takes_the_fast_path_and_replays_as_the_general_path(monkeypatch):
    calls = counting_signatures(monkeypatch)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3)), rng.standard_normal((8, 2))
    model = nn.Chain(nn.Dense(3, 4, tg.tanh), nn.Dense(4, 2))
    fast, general = tg.compile(train_step, gradient=False), tg.compile(train_step, gradient=False)
    runs = {"fast": (model, optim.setup(optim.Adam(0.01), model)),
            "general": (model, optim.setup(optim.Adam(0.01), model))}  # fmt: skip
    for step in range(6):
        for name, compiled in (("fast", fast), ("general", general)):
            if name == "general":
                compiled._matcher = None  # every call through the signature
            loss, state, new = compiled(*runs[name], x, y)
            runs[name] = (new, state)
        leaves = [tg.pytree.tree_leaves(runs[name]) for name in ("fast", "general")]
        for a, b in zip(*leaves):
            assert np.array_equal(np.asarray(a), np.asarray(b)), step
    assert fast.cache_info().hits == 5 and fast.cache_info().misses == 1
    # the general function described all 6 calls; the fast one its first two only
    assert len(calls) == 6 + 2


def test_a_changed_shape_leaves_the_fast_path_for_a_new_recording():
    f = tg.compile(lambda x: tg.sum(x * x))
    for n in (3, 3, 3, 4, 4, 3):
        val, (grad,) = f(np.arange(n, dtype=float))
        assert np.array_equal(grad, 2 * np.arange(n))
    info = f.cache_info()
    assert (info.misses, info.currsize) == (2, 2)


def test_a_global_that_changes_is_guarded_on_the_fast_path_too():
    namespace = {"tg": tg, "FACTOR": 2.0}  # a module's globals, as a user's script has them
    exec("def f(x):\n    return tg.sum(x * FACTOR)\n", namespace)  # noqa: S102
    f, x = tg.compile(namespace["f"]), np.ones(3)
    for _ in range(3):
        assert f(x).val == 6.0
    namespace["FACTOR"] = 5.0
    assert f(x).val == 15.0


@pytest.mark.parametrize("order", list(itertools.permutations(["a", "b"])))
def test_alternating_signatures_each_keep_their_program(order):
    f = tg.compile(lambda x: tg.sum(tg.sin(x)))
    inputs = {"a": np.linspace(-1, 1, 3), "b": np.linspace(-1, 1, 5)}
    for name in order * 3:
        val, (grad,) = f(inputs[name])
        assert np.allclose(grad, np.cos(inputs[name]))
    assert f.cache_info().misses == 2


def test_fast_hits_count_as_uses_when_the_cache_evicts():
    """The fast path does not reorder the cache at each hit; the next call that is not fast
    does, so that the least recently used signature is the one evicted, as without it."""
    f = tg.compile(lambda x: tg.sum(x * x), maxsize=2)
    a, b, c = (np.ones(n) for n in (2, 3, 4))
    f(a)
    f(a)  # a hit by the general path: the next call with a's signature is fast
    f(b)
    f(a)  # fast: a is now used after b
    f(c)  # evicts the least recently used: b
    assert f.cache_info().misses == 3
    f(a)
    assert f.cache_info().misses == 3  # a was kept
    f(b)
    assert f.cache_info().misses == 4  # b was not


def test_a_signature_evicted_leaves_no_fast_path_behind():
    f = tg.compile(lambda x: tg.sum(x * x), maxsize=1)
    a, b = np.ones(2), np.ones(3)
    f(a)
    f(a)  # fast from now on
    f(b)  # evicts a: its fast path goes with it
    val, (grad,) = f(a)
    assert f.cache_info().misses == 3
    assert np.array_equal(grad, 2 * a)


def test_keyword_arguments_take_the_fast_path_and_keep_their_values(monkeypatch):
    calls = counting_signatures(monkeypatch)

    def f(x, y, scale=1.0, shift=None):
        out = tg.sum(x * y) * scale
        return out if shift is None else out + tg.sum(shift)

    compiled, x, y = tg.compile(f), np.arange(3.0), np.ones(3)
    for shift in (np.ones(2), np.ones(2) * 2, np.ones(2) * 3):
        for scale in (2.0, 2.0, 3.0, 2.0):
            got = compiled(x, y, shift=shift, scale=scale)  # the names in another order
            want = tg.withgradient(lambda x, y, s=scale, h=shift: f(x, y, s, h), x, y)
            assert float(got.val) == float(want.val)
            assert all(np.array_equal(a, b) for a, b in zip(got.grad, want.grad))
    assert compiled.cache_info().misses == 2  # scale 2.0 and 3.0: a number is in the signature
    assert len(calls) < 12  # most calls matched without describing the arguments


def test_a_positional_call_shaped_like_a_keyword_call_is_not_taken_for_it():
    """A keyword call is matched as (mark, args, keywords): a positional call whose arguments
    are a tuple and a dict of the same shapes is another signature."""
    f = tg.compile(lambda a, b=None, k=None: tg.sum(a[0] if isinstance(a, tuple) else a) * 2.0)
    x = np.ones(2)
    for _ in range(3):
        f(x, k=np.ones(1))
    f((x,), {"k": np.ones(1)})
    assert f.cache_info().misses == 2


def _job_steps():
    """`{name: (step, model, state, x, y)}`: the main job's compiled steps, each model's (the
    digits job's MLP, CNN and LSTM, with their scheduled Adam, and the text job's transformer
    with AdamW), on a small batch of their data."""
    from tracker_gpu.train.loop import compiled_step, schedule_for
    from tracker_gpu.train.models import RECIPES
    from tracker_gpu.train.text_loop import TextConfig, build, compiled_text_step, rule

    rng = np.random.default_rng(5)
    images, labels = rng.random((8, 1, 8, 8)), rng.integers(0, 10, 8)
    found = {}
    for name, recipe in RECIPES.items():
        model = recipe.build(rng=np.random.default_rng(0))
        state = optim.setup(schedule_for(recipe.lr, 2, 10), model)
        found[name] = (compiled_step(), model, state, images, labels)
    config = TextConfig(layers=1, width=16, heads=2, context=8, batch_size=4, steps=10)
    model, _ = build(config, 12)
    tokens = rng.integers(0, 12, (4, 8))
    found["text"] = (compiled_text_step(), model, optim.setup(rule(config), model), tokens, tokens)
    return found


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "text"])
def test_the_jobs_steps_take_the_fast_path_from_their_third_call(name, monkeypatch):
    """A structure the matcher cannot check would send every call through the signature's
    walk, silently slower: each of the main job's compiled steps describes its arguments at
    its first two calls only (the recording, then the replay that makes the matcher)."""
    step, model, state, x, y = _job_steps()[name]
    calls = counting_signatures(monkeypatch)
    for _ in range(5):
        _, *rest = step(model, state, x, y)
        model, state = rest[-2:]
    assert len(calls) == 2, f"{name}: {len(calls)} of 5 calls described their arguments"

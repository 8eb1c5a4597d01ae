"""tg.compile against eager, call by call (issue 28): for each of the library's functions that
computes from a traced array's value, a compiled function gives on every replay what the same
call gives eagerly (values and gradients), or its recording is refused with a RecordingError
naming the call; never a value frozen at the recording."""

import dataclasses
import itertools
import re

import numpy as np
import pytest

import tracker_gpu as tg
from tests.compiling import CALLS, LAYERS, RNG, differential, equal, floats, layer_classes, total
from tracker_gpu import nn


# --- the table of issue 28: each call inside a compiled function
def _negative_det_matrix():
    a = floats(3, 3) + 3 * np.eye(3)
    a[0] *= -1 if RNG.random() < 0.5 else 1
    return a


TABLE = {
    "leakyrelu": (lambda x: tg.sum(nn.leakyrelu(x, 0.2) * x), lambda: (floats(5),)),
    "elu": (lambda x: tg.sum(nn.elu(x) * x), lambda: (floats(5),)),
    "selu": (lambda x: tg.sum(nn.selu(x) * x), lambda: (floats(5),)),
    "celu": (lambda x: tg.sum(nn.celu(x, 0.5) * x), lambda: (floats(5),)),
    "stop_gradient": (
        lambda x: tg.max(tg.stop_gradient(x) * 3.0) * tg.sum(x),
        lambda: (floats(6),),
    ),
    "notrack": (lambda x: _with_notrack(x), lambda: (floats(4),)),
    "slogdet": (
        lambda a: tg.linalg.slogdet(a).sign * tg.linalg.slogdet(a).logabsdet,
        lambda: (_negative_det_matrix(),),
    ),
    "logdet": (
        lambda a: tg.sum(tg.where(tg.isnan(tg.logdet(a)), 0.0, tg.logdet(a))) + tg.sum(a),
        lambda: (_negative_det_matrix(),),
    ),
    "matrix_rank": (
        lambda a: tg.sum(a) * tg.astype(tg.linalg.matrix_rank(a), a.dtype),
        lambda: (floats(3, 3) * (RNG.random(3) < 0.5),),
    ),
    "full": (
        lambda x: tg.sum(tg.full((3,), tg.sum(x), dtype=x.dtype) * x),
        lambda: (floats(3),),
    ),
    "forward": (lambda x: _with_forward(x), lambda: (floats(3),)),
}


def _with_notrack(x):
    with tg.notrack():
        c = tg.sum(x * x)
    return tg.sum(x) * c


def _with_forward(x):
    y, _ = tg.forward(lambda v: v * v, x)
    return tg.sum(x * (y * 2.0 + 1.0))


REFUSED = {"notrack"}  # refused while recording, by design: fallback=True runs them eagerly


@pytest.mark.parametrize("name", sorted(TABLE))
def test_table_call(name):
    f, make = TABLE[name]
    expected = "refused" if name in REFUSED else "replayed"
    assert differential(f, [make() for _ in range(CALLS)], name, gradient=True) == expected


# --- layers
def test_embedding_indices():
    layer = nn.Embedding(7, 3, rng=np.random.default_rng(1), dtype="float64")
    f = lambda m, i: tg.sum(m(i) ** 2 * tg.arange(3, dtype=tg.float64))
    inputs = [(layer, RNG.integers(0, 7, size=(4,))) for _ in range(CALLS)]
    assert differential(f, inputs, "Embedding") == "replayed"


@pytest.mark.parametrize("bad", [[1, -1], [2, 7]])
def test_embedding_replay_checks_indices(bad):
    layer = nn.Embedding(7, 3, rng=np.random.default_rng(1), dtype="float64")
    f = lambda m, i: tg.sum(m(i) ** 2)
    step = tg.compile(f)
    step(layer, np.array([1, 2]))
    for run in (tg.withgradient, step):
        with pytest.raises(ValueError, match="indices must lie in"):
            run(f, layer, np.array(bad)) if run is tg.withgradient else run(layer, np.array(bad))
    equal(step(layer, np.array([3, 4])), tg.withgradient(f, layer, np.array([3, 4])))
    assert step.cache_info().misses == 1


def test_batchnorm_eval_reads_running_statistics():
    layer = nn.BatchNorm(3, active=False, dtype="float64")
    f = lambda m, x: tg.sum(m(x) * x)
    step = tg.compile(f)
    for k in range(CALLS):
        layer.running_var[...] = RNG.random(3) + 0.5 + k
        layer.running_mean[...] = RNG.standard_normal(3)
        x = floats(4, 3)
        eager = tg.withgradient(f, layer, x)
        compiled = step(layer, x)
        equal(eager[0], compiled[0])
        equal(eager[1], compiled[1])


def test_attention_causal_with_mask():
    layer = nn.MultiHeadAttention(4, 2, causal=True, rng=np.random.default_rng(2), dtype="float64")
    f = lambda m, x, mask: tg.sum(m(x, mask=mask)[0] ** 2)
    inputs = [(layer, floats(2, 3, 4), (RNG.random((3, 3)) < 0.7) | np.eye(3, dtype=bool))
              for _ in range(CALLS)]  # fmt: skip
    assert differential(f, inputs, "MultiHeadAttention", wrt=(0, 1)) == "replayed"


# --- every layer class of nn, train and eval mode: built from a small table of inputs
@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", layer_classes())
def test_every_layer(name, mode):
    assert name in LAYERS, f"nn.{name} has no entry in LAYERS: add how to build it and its input"
    make, make_input = LAYERS[name]
    layer = make(np.random.default_rng(3))
    layer = nn.trainmode(layer) if mode == "train" else nn.testmode(layer)
    f = lambda m, x: total(m(x))
    inputs = []
    for _ in range(CALLS):
        for field in ("running_mean", "running_var"):  # eval mode reads them: change them
            if getattr(layer, field, None) is not None:
                layer = dataclasses.replace(layer, **{field: RNG.random(3) + 0.5})
        inputs.append((layer, make_input()))
    differential(f, inputs, name, wrt=(0,) if name == "Embedding" else None)


# --- second-order passes recorded (nest=True): the pullbacks' masks are traced, not frozen
NESTED = {
    "relu": lambda x: tg.sum(nn.relu(x) * x),
    "maximum": lambda x: tg.sum(tg.maximum(x, 0.1) * x),
    "minimum": lambda x: tg.sum(tg.minimum(x, -0.1) * x),
    "abs": lambda x: tg.sum(tg.abs(x) * x),
    "clip": lambda x: tg.sum(tg.clip(x, -0.5, 0.5) * x),
    "pow": lambda x: tg.sum(tg.abs(x) ** x),
    "max": lambda x: tg.sum(tg.max(x * x, axis=0)) * tg.sum(x),
    "vector_norm": lambda x: tg.linalg.vector_norm(x * (x > 0), ord=3) * tg.sum(x),
}


@pytest.mark.parametrize("name", sorted(NESTED))
def test_nested_pullback(name):
    inner = NESTED[name]
    f = lambda x: tg.sum(tg.gradient(inner, x, nest=True)[0] ** 2)
    differential(f, [(floats(4, 3),) for _ in range(CALLS)], name)


# --- conversions of a traced array while recording: refused, naming the call
@pytest.mark.parametrize(
    "convert, name",
    [
        (lambda x: np.asarray(x), "__array__"),
        (lambda x: np.from_dlpack(x), "__dlpack__"),
    ],
)
def test_conversion_refused(convert, name):
    f = lambda x: tg.sum(x) * float(np.sum(convert(x)))
    with pytest.raises(tg.RecordingError, match=name):
        tg.compile(f)(floats(3))


def test_full_like_traced_fill():
    f = lambda x: tg.sum(tg.full_like(x, tg.max(x)) * x)
    assert differential(f, [(floats(3),) for _ in range(CALLS)], "full_like") == "replayed"


@pytest.mark.parametrize(
    "name, inner",
    [
        ("getitem", lambda x, i: tg.sum(x[i] ** 3)),
        ("take", lambda x, i: tg.sum(tg.take(x, i) ** 3)),
    ],
)
def test_nested_pullback_traced_indices(name, inner):
    f = lambda x, i: tg.sum(tg.gradient(lambda v: inner(v, i), x, nest=True)[0] ** 2)
    inputs = [(floats(6), RNG.integers(0, 3, 4)) for _ in range(CALLS)]
    differential(f, inputs, name, wrt=(0,))


# --- the audit of issue 28: every other place where a value computed from a traced array's
# plain data could reach the program as a constant; each replays as the eager call computes
def _labels(high, *shape):
    return RNG.integers(0, high, shape)


_RTOLS = itertools.cycle([0.05, 0.3, 0.7])  # each call another rank


def _singular_values_1_05_01():
    q1, _ = np.linalg.qr(floats(3, 3))
    q2, _ = np.linalg.qr(floats(3, 3))
    return q1 @ np.diag([1.0, 0.5, 0.1]) @ q2


AUDIT = {  # name -> (f, make the arguments, wrt)
    "ndarray < x": (lambda x: tg.sum(x * (np.zeros(4) < x)), lambda: (floats(4),), None),
    "ndarray >= x": (lambda x: tg.sum(x * (np.full(4, 0.2) >= x)), lambda: (floats(4),), None),
    "ndarray == labels": (
        lambda x, i: tg.sum(x * (np.array([0, 1, 2, 0]) == i)),
        lambda: (floats(4), _labels(3, 4)),
        (0,),
    ),
    "ndarray & mask": (
        lambda x: tg.sum(x * (np.array([True, False, True, True]) & (x > 0))),
        lambda: (floats(4),),
        None,
    ),
    "np.invert(mask)": (lambda x: tg.sum(x * np.invert(x > 0)), lambda: (floats(4),), None),
    "np.left_shift(labels)": (
        lambda x, i: tg.sum(x * tg.astype(np.left_shift(np.array([1, 2, 3, 1]), i), x.dtype)),
        lambda: (floats(4), _labels(3, 4)),
        (0,),
    ),
    "at[mask].set": (lambda x: tg.sum(tg.at(x)[x > 0].set(0.5) * x), lambda: (floats(5),), None),
    "at[mask].add": (
        lambda x: tg.sum(tg.at(x)[x > 0].add(x[0]) ** 2),
        lambda: (floats(5),),
        None,
    ),
    "at[mask].multiply": (
        lambda x: tg.sum(tg.at(x)[x < 0].multiply(3.0) * x),
        lambda: (floats(5),),
        None,
    ),
    "at[mask].min": (lambda x: tg.sum(tg.at(x)[x > 0].min(0.3) * x), lambda: (floats(5),), None),
    "at[mask].max": (lambda x: tg.sum(tg.at(x)[x < 0].max(-0.3) * x), lambda: (floats(5),), None),
    "at[labels].add": (
        lambda x, i: tg.sum(tg.at(x)[i].add(x[:3] * 2.0) * x),
        lambda: (floats(5), _labels(5, 3)),
        (0,),
    ),
    "at[:, labels].subtract": (
        lambda x, i: tg.sum(tg.at(x)[:, i].subtract(1.5) ** 2),
        lambda: (floats(2, 5), _labels(5, 3)),
        (0,),
    ),
    "at(counts)[labels].add": (
        lambda x, i: tg.sum(x * tg.at(np.zeros(5))[i].add(1.0)),
        lambda: (floats(5), _labels(5, 6)),
        (0,),
    ),
    "fft.fftfreq(d=traced)": (
        lambda x, d: tg.sum(x * tg.fft.fftfreq(3, d=d)),
        lambda: (floats(3), np.asarray(0.5 + RNG.random())),
        (0,),
    ),
    "fft.rfftfreq(d=traced)": (
        lambda x, d: tg.sum(x * tg.fft.rfftfreq(4, d=d)),
        lambda: (floats(3), np.asarray(0.5 + RNG.random())),
        (0,),
    ),
    "pinv(rtol=traced)": (
        lambda a, r: tg.sum(tg.linalg.pinv(a, rtol=r) ** 2),
        lambda: (_singular_values_1_05_01(), np.asarray(next(_RTOLS))),
        (0,),
    ),
    "take(labels)": (
        lambda x, i: tg.sum(tg.take(x, i, axis=1) ** 3),
        lambda: (floats(2, 5), _labels(5, 4)),
        (0,),
    ),
    "logitcrossentropy(labels)": (
        lambda s, y: nn.logitcrossentropy(s, y),
        lambda: (floats(4, 3), _labels(3, 4)),
        (0,),
    ),
    "crossentropy(labels)": (
        lambda s, y: nn.crossentropy(nn.softmax(s), y),
        lambda: (floats(4, 3), _labels(3, 4)),
        (0,),
    ),
    "hardtanh": (lambda x: tg.sum(nn.hardtanh(x * 2.0) * x), lambda: (floats(5),), None),
    "sort": (lambda x: tg.sum(tg.sort(x) * tg.arange(5.0)), lambda: (floats(5),), None),
}


@pytest.mark.parametrize("name", sorted(AUDIT))
def test_audited_call(name):
    f, make, wrt = AUDIT[name]
    step = tg.compile(f) if wrt is None else tg.compile(f, wrt=wrt)
    for _ in range(CALLS):
        args = make()
        eager = tg.withgradient(f, *args) if wrt is None else tg.withgradient(f, *args, wrt=wrt)
        compiled = step(*args)
        equal(eager[0], compiled[0])
        equal(eager[1], compiled[1])
    assert step.cache_info().misses == 1


@pytest.mark.parametrize(
    "name, f",
    [
        ("repeat", lambda x, r: tg.sum(tg.repeat(x, r))),
        ("tg.at(x)[idx].set", lambda x, r: tg.sum(tg.at(x)[r].set(1.0))),
        ("tg.at(x)[mask].set", lambda x, r: tg.sum(tg.at(x)[x > 0].set(x[:2]))),
    ],
)
def test_audited_call_refused(name, f):
    """What depends on the data beyond the values (a shape, which repeated index wins)."""
    args = (np.array([0.5, -1.0, 2.0]), np.array([1, 0, 1]))  # two positive values
    with pytest.raises(tg.RecordingError, match=re.escape(name)):
        tg.compile(f, wrt=(0,))(*args)
    equal(tg.compile(f, wrt=(0,), fallback=True)(*args), tg.withgradient(f, *args, wrt=(0,)))


# --- the public ways to a traced array's plain value: refused while recording, naming the
# call; fallback=True then runs f eagerly, with eager's answer
PUBLIC = {  # name -> f(x, labels), differentiated in x
    "tg.data(x)": lambda x, i: tg.sum(x) * float(np.sum(tg.data(x))),
    "tg.data(x) of labels": lambda x, i: tg.sum(x * np.eye(3)[tg.data(i)][:, 0]),
    "tg.data(x).item()": lambda x, i: tg.sum(x) * tg.data(x)[0].item(),
    "nn.to_numpy(x)": lambda x, i: tg.sum(x) * float(np.sum(nn.to_numpy(x))),
    "__array__ of labels": lambda x, i: tg.sum(x * np.asarray(i)),
    "__array__ (np.eye(3)[labels])": lambda x, i: tg.sum(x * np.eye(3)[i][:, 1]),
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_public_escape_refused(name):
    f = PUBLIC[name]
    call = name.split(" of ")[0].split(" (")[0].replace(".item()", "")
    with pytest.raises(tg.RecordingError, match=re.escape(call)):
        tg.compile(f, wrt=(0,))(floats(3), _labels(3, 3))
    step = tg.compile(f, wrt=(0,), fallback=True)
    for _ in range(CALLS):
        args = (floats(3), _labels(3, 3))
        equal(step(*args), tg.withgradient(f, *args, wrt=(0,)))


@pytest.mark.parametrize("convert", [np.asarray, np.from_dlpack])
def test_public_escape_of_tracked_array_raises_as_eagerly(convert):
    """np.asarray and DLPack of an array on the tape raise eagerly too: with fallback=True, the
    eager error."""
    f = lambda x: tg.sum(x) * float(np.sum(convert(x)))
    step = tg.compile(f, fallback=True)
    with pytest.raises((TypeError, BufferError)) as eager:
        tg.withgradient(f, floats(3))
    with pytest.raises(eager.type):
        step(floats(3))


def test_item_is_no_method_of_tracked_arrays():
    """Eagerly an AttributeError naming float(x); recording refuses naming it too."""
    f = lambda x: tg.sum(x) * x[0].item()
    with pytest.raises(AttributeError, match=re.escape("'item': ")):
        tg.withgradient(f, floats(3))
    with pytest.raises((AttributeError, tg.RecordingError), match=re.escape("float(x)")):
        tg.compile(f)(floats(3))
    with pytest.raises(AttributeError, match=re.escape("'item': ")):
        tg.compile(f, fallback=True)(floats(3))


def test_data_of_constant_is_plain():
    f = lambda x: tg.sum(x * np.asarray(tg.data(tg.arange(3.0))))
    assert differential(f, [(floats(3),) for _ in range(CALLS)], "arange") == "replayed"


def test_data_attribute_is_frozen_by_design():
    """`x.data` is the attribute the library itself reads (unchecked, for speed): what user code
    computes from it is fixed at the recording (the README's compile section)."""
    f = lambda x: tg.sum(x) * float(np.sum(x.data))
    step = tg.compile(f)
    step(np.ones(3))
    assert float(step(np.full(3, 2.0))[0]) == 6.0 * 3.0  # eager: 6 * 6


@pytest.mark.parametrize("fuse", [False, "exact"])
def test_traced_flags_of_one_value_keep_their_own_slots(fuse):
    """NumPy's booleans are two objects: `finite` and `grow`, both False at the recording, once
    shared a slot, and the replay chose by `grow` where `f` chooses by `finite`."""

    def f(scale, g):
        finite = tg.all(tg.isfinite(g))
        grow = tg.logical_and(finite, scale > 1e9)
        return tg.where(finite, tg.where(grow, scale * 2.0, scale), scale / 2.0)

    compiled = tg.compile(f, gradient=False, fuse=fuse)
    scale = np.asarray(1024.0, np.float32)
    for g in ([np.inf], [1.0], [1.0], [np.nan], [2.0]):
        g = np.asarray(g)
        assert float(compiled(scale, g)) == float(f(scale, g)), g
    assert compiled.cache_info().misses == 1


def test_a_numpy_scalar_passed_through_comes_back_as_eagerly():
    """A NumPy scalar the function returns as it was given came back a 0-d array, so the next
    call, given it, recorded anew."""
    f = lambda m, x: {"s": m["s"], "y": tg.sum(x * m["w"])}  # noqa: E731
    compiled = tg.compile(f, gradient=False)
    model = {"w": np.ones(3), "s": np.float64(1.5)}
    for _ in range(3):
        out = compiled(model, np.ones(3))
        assert type(out["s"]) is type(f(model, np.ones(3))["s"]) is np.float64
        model = {"w": model["w"], "s": out["s"]}
    assert compiled.cache_info().misses == 1


@pytest.mark.parametrize("name", layer_classes())
def test_every_layer_predicts_compiled_without_a_gradient_as_eagerly(name):
    """`tg.compile(predict, gradient=False)`: the layer in its automatic mode sees plain
    arguments, as eagerly: inference (a BatchNorm once normalised by the batch and wrote its
    statistics into the running ones, a Dropout dropped), and Python numbers stay numbers."""
    make, make_input = LAYERS[name]
    eager, replayed = make(np.random.default_rng(3)), make(np.random.default_rng(3))
    predict = lambda m, x, scale: total(m(x)) * scale  # noqa: E731
    compiled = tg.compile(predict, gradient=False)
    for _ in range(CALLS):
        x = make_input()
        expected, found = predict(eager, x, 0.5), compiled(replayed, x, 0.5)
        assert type(found) is type(expected) and found.dtype == expected.dtype, name
        np.testing.assert_array_equal(found, expected, err_msg=name)
    for field in ("running_mean", "running_var", "count"):
        if getattr(eager, field, None) is not None:
            np.testing.assert_array_equal(getattr(replayed, field), getattr(eager, field))


def test_a_number_given_without_a_gradient_stays_a_number():
    step = lambda w, lr: w - lr * w  # noqa: E731
    compiled = tg.compile(step, gradient=False)
    w = np.ones(3, np.float32)
    for lr in (0.1, 0.2, 0.1):
        found = compiled(w, lr)
        assert found.dtype == step(w, lr).dtype == np.float32 and np.array_equal(found, step(w, lr))


def test_a_traced_array_prints_without_its_value():
    """str(x) of a traced value gave the recording's value, which a string test then froze
    into every replay; it shows the shape and dtype, as JAX's tracers do."""
    seen = []

    def f(x):
        seen.append((str(tg.sum(x)), f"{x}", repr(x * 2.0)))
        return tg.sum(x)

    tg.compile(f)(np.array([1.0, -2.0]))
    for text in seen[0]:
        assert "traced" in text and "1." not in text and "-2" not in text, text
    assert "shape=(2,), dtype=float64" in seen[0][1]


def test_a_loss_of_data_alone_is_returned_as_eagerly_even_when_not_finite():
    """Nothing differentiated (`wrt=()`, integers): eagerly the loss is a plain value and no
    pass runs; the recording traced it and its pass refused the infinite loss."""
    f = lambda x, n: tg.sum(x * n) * 1e308  # noqa: E731
    x, n = np.array([1.0, 2.0]), np.array([3, 4])
    with np.errstate(over="ignore"):
        expected = tg.withgradient(f, x, n, wrt=())
        found = tg.compile(f, wrt=())(x, n)
    assert found.val == expected.val == np.inf and found.grad == expected.grad == (None, None)

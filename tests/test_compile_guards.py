"""tg.compile's guards and keyword arguments: a global, a closure variable, or an attribute of a
hashable argument that `f` reads and that changes between calls makes a new recording, whose
answers are eager's; keyword arguments are part of the signature, as positional ones are."""

import argparse
import copy
import dataclasses
import functools
import random
import types
import warnings

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.compiler.guards import guards_of

SCALE = 2.0
MODE = "sin"
WEIGHTS = np.array([1.0, 2.0, 3.0])
SETTINGS = {"lr": 0.5, "shift": np.zeros(3)}
RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _globals_restored():
    kept = SCALE, MODE, WEIGHTS, SETTINGS.copy()
    yield
    globals().update(SCALE=kept[0], MODE=kept[1], WEIGHTS=kept[2])
    SETTINGS.clear()
    SETTINGS.update(kept[3])


def _scaled(x):
    return tg.sum(tg.sin(x) * SCALE)


def _branching(x):
    return tg.sum(tg.sin(x) if MODE == "sin" else tg.cos(x))


def _weighted(x):
    return tg.sum(x * x * WEIGHTS)


def _helper(x):
    return x * SCALE


def _through_a_helper(x):
    return tg.sum(_helper(x) ** 2)


def _from_settings(x):
    return tg.sum((x - SETTINGS["shift"]) ** 2 * SETTINGS["lr"])


def _same(compiled, f, *args, **kwargs):
    """The compiled call's value and gradients equal `withgradient`'s."""
    got = compiled(*args, **kwargs)
    expected = tg.withgradient(lambda *a: f(*a, **kwargs), *args)
    np.testing.assert_allclose(np.asarray(got.val), np.asarray(expected.val), rtol=1e-12)
    for g, e in zip(got.grad, expected.grad):
        assert (g is None) == (e is None)
        if g is not None:
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-12)
    return got


X = np.array([0.5, -1.0, 2.0])


# --- globals
@pytest.mark.parametrize("new", [5.0, 2, -0.0, np.float32(2.5)])
def test_a_global_number_rebound_records_anew(new):
    global SCALE
    step = tg.compile(_scaled)
    _same(step, _scaled, X)
    SCALE = new
    _same(step, _scaled, X)
    assert step.cache_info().misses == 2
    _same(step, _scaled, X)
    assert step.cache_info().hits == 1


CALLS_SO_FAR = 0


def _counting(x):
    global CALLS_SO_FAR
    CALLS_SO_FAR += 1  # f changes what it reads: guarded as it was before f ran
    return tg.sum(x) * min(1.0, CALLS_SO_FAR / 4)


def test_a_global_that_f_itself_changes_is_warned_about_and_each_call_runs_as_eagerly():
    """A replay runs none of f's Python code: it would leave the counter as the recording left
    it, and the factor computed from it the recording's. Guarded as the recording read it,
    each call records anew: the counter and the values are eager's."""
    global CALLS_SO_FAR
    CALLS_SO_FAR, step = 0, tg.compile(_counting)
    with pytest.warns(RuntimeWarning, match="f changed CALLS_SO_FAR while recording"):
        step(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for calls in (2, 3, 4, 5):
            assert float(step(X).val) == float(np.sum(X)) * min(1.0, calls / 4)
            assert CALLS_SO_FAR == calls


def test_a_global_changed_by_another_thread_while_f_records_makes_the_next_call_record():
    """The guards were taken after the recording: a value another thread changed meanwhile
    was stored as the guard of a program recorded with the old one, replayed for good."""
    import threading

    global SCALE
    SCALE = 2.0
    read, changed = threading.Event(), threading.Event()
    first = [True]

    def f(x):
        y = tg.sum(tg.tanh(x) * SCALE)  # the recording reads 2.0
        if first[0]:
            first[0] = False
            read.set()
            changed.wait(10)
        return y

    step = tg.compile(f)
    worker = threading.Thread(target=step, args=(X,))
    worker.start()
    read.wait(10)
    SCALE = 3.0  # while f records
    changed.set()
    worker.join(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert float(step(X).val) == float(tg.withgradient(f, X).val)
    SCALE = 2.0


def test_a_global_number_rebound_on_every_backend(backend):
    global SCALE
    step, x = tg.compile(_scaled), backend.asarray(X)
    first = backend.to_numpy(step(x).grad[0])
    SCALE = 3.0
    np.testing.assert_allclose(backend.to_numpy(step(x).grad[0]), first * 1.5, rtol=1e-12)


def test_an_equal_value_replays():
    global SCALE
    step = tg.compile(_scaled)
    step(X)
    SCALE = float("2.0")  # another object, the same value
    step(X)
    assert (step.cache_info().misses, step.cache_info().hits) == (1, 1)


def test_a_float_is_guarded_by_its_bits():
    global SCALE
    SCALE = 0.0
    guards = guards_of(_scaled, (X,))
    assert guards.names == ["SCALE"] and guards.holds()
    SCALE = -0.0
    assert not guards.holds() and guards.failing() == "SCALE"
    SCALE = float("nan")
    guards = guards_of(_scaled, (X,))
    SCALE = float("nan")  # another nan: the same bits
    assert guards.holds()


class Settings:
    scale = None


CONFIG = Settings()


def test_an_attribute_of_a_global_object_rebound_records_anew():
    def f(x):
        return tg.sum(x * CONFIG.scale)

    CONFIG.scale = 2.0
    step = tg.compile(f)
    _same(step, f, X)
    CONFIG.scale = 7.0
    _same(step, f, X)
    assert step.cache_info().misses == 2


def test_a_global_string_rebound_records_anew():
    global MODE
    step = tg.compile(_branching)
    _same(step, _branching, X)
    MODE = "cos"
    _same(step, _branching, X)
    assert step.cache_info().misses == 2


def test_a_global_array_rebound_records_anew():
    global WEIGHTS
    step = tg.compile(_weighted)
    _same(step, _weighted, X)
    WEIGHTS = np.array([-1.0, 0.5, 4.0])  # the same shape and dtype: another array
    _same(step, _weighted, X)
    WEIGHTS = WEIGHTS.astype(np.float32)
    _same(step, _weighted, X)
    assert step.cache_info().misses == 3


def test_an_array_written_in_place_is_read_by_the_replay():
    step = tg.compile(_weighted)
    _same(step, _weighted, X)
    WEIGHTS[...] = [7.0, -2.0, 0.25]  # the program reads the array itself
    _same(step, _weighted, X)
    assert step.cache_info().hits == 1


def _pulled_to_weights(w):
    return tg.sum((w - WEIGHTS) ** 2)  # a penalty towards the starting point


def _weights_in_a_dict(d):
    return tg.sum(d["w"] * WEIGHTS)


def _indexed_by_a_global(x, i):
    return tg.sum(x[i] * x[INDEX])


INDEX = np.array([0, 2])

# A first call given the very array that f also reads as a global: the recording could not tell
# the two apart and read the argument for both in every replay (the penalty stayed 0).
ALIASED = {
    "global": (_pulled_to_weights, lambda: (WEIGHTS,), lambda: (X,)),
    "inside a dict argument": (_weights_in_a_dict, lambda: ({"w": WEIGHTS},), lambda: ({"w": X},)),
    "an index argument": (_indexed_by_a_global, lambda: (X, INDEX), lambda: (X, np.array([1, 1]))),
}


@pytest.mark.parametrize("fuse", [None, False])
@pytest.mark.parametrize("name", ALIASED)
def test_an_argument_that_is_a_global_array_when_recorded_is_not_read_for_it(name, fuse):
    f, aliased, other = ALIASED[name]
    step = tg.compile(f) if fuse is None else tg.compile(f, fuse=fuse)
    for args in (aliased(), other(), aliased(), other()):
        got, expected = step(*args), tg.withgradient(f, *args)
        assert float(got.val) == float(expected.val)
        for g, e in zip(got.grad, expected.grad):  # a dict argument's gradient is a dict
            g, e = (g["w"], e["w"]) if isinstance(g, dict) else (g, e)
            assert (g is None) == (e is None)
            if g is not None:
                np.testing.assert_array_equal(g, e)
    assert step.cache_info().misses == 2  # one recording each way, replayed after


def test_an_argument_that_is_a_closed_over_array_when_recorded_is_not_read_for_it():
    start = np.array([1.0, 2.0, 3.0])
    f = lambda w: tg.hvp(lambda z: tg.sum(z**2 * start), w, np.ones(3))  # noqa: E731
    step = tg.compile(f, gradient=False)
    for w in (start, X, start, X * 2.0):
        np.testing.assert_array_equal(step(w), f(w))


def test_what_f_computes_from_a_global_array_alone_is_frozen():
    """As the README says: tg.exp(WEIGHTS) involves no traced value, so the recording
    computes it once; a write into WEIGHTS in place is not seen there (pass it as an
    argument to have it read anew)."""

    def f(x):
        return tg.sum(x * tg.exp(WEIGHTS))

    step = tg.compile(f)
    first = step(X).grad[0]
    WEIGHTS[...] = 0.0
    np.testing.assert_array_equal(step(X).grad[0], first)
    as_argument = tg.compile(lambda x, w: tg.sum(x * tg.exp(w)), wrt=0)
    assert float(as_argument(X, WEIGHTS).val) == pytest.approx(float(np.sum(X)))


def test_a_global_dict_entry_changed_records_anew():
    step = tg.compile(_from_settings)
    _same(step, _from_settings, X)
    SETTINGS["lr"] = 3.0
    _same(step, _from_settings, X)
    SETTINGS["shift"] = np.ones(3)
    _same(step, _from_settings, X)
    assert step.cache_info().misses == 3


def test_the_globals_of_a_function_f_calls_are_guarded():
    global SCALE
    step = tg.compile(_through_a_helper)
    _same(step, _through_a_helper, X)
    SCALE = -4.0
    _same(step, _through_a_helper, X)
    assert step.cache_info().misses == 2


def test_a_global_function_rebound_records_anew():
    global _helper
    step, kept = tg.compile(_through_a_helper), _helper
    _same(step, _through_a_helper, X)
    _helper = tg.sin
    try:
        _same(step, _through_a_helper, X)
    finally:
        _helper = kept
    assert step.cache_info().misses == 2


def test_values_going_back_and_forth_keep_both_recordings():
    global SCALE
    step = tg.compile(_scaled)
    for scale in [2.0, 3.0, 2.0, 3.0, 2.0]:
        SCALE = scale
        _same(step, _scaled, X)
    assert (step.cache_info().misses, step.cache_info().currsize) == (2, 2)


def test_a_value_that_changes_every_call_is_reported():
    global SCALE
    step = tg.compile(_scaled)
    with pytest.warns(RuntimeWarning, match="'SCALE'"):
        for k in range(12):
            SCALE = float(k)
            _same(step, _scaled, X)
    assert step.cache_info().currsize <= 8


# --- closures, methods, arguments
def _closure():
    k = 2.0

    def f(x):
        return tg.sum(tg.exp(x) * k)

    def set_k(value):
        nonlocal k
        k = value

    return f, set_k


def test_a_closure_cell_rebound_records_anew():
    f, set_k = _closure()
    step = tg.compile(f)
    _same(step, f, X)
    set_k(-3.0)
    _same(step, f, X)
    set_k(np.float64(0.5))
    _same(step, f, X)
    assert step.cache_info().misses == 3


def test_a_closed_over_array_rebound_records_anew():
    w = np.array([1.0, 2.0, 3.0])
    f = lambda x: tg.sum(x * w)  # noqa: E731
    step = tg.compile(f)
    _same(step, f, X)
    w = np.array([4.0, 5.0, 6.0])  # noqa: F841 (read by f, through its cell)
    _same(step, f, X)
    assert step.cache_info().misses == 2


class Model:
    """A plain object: hashable, keyed by identity in a signature."""

    def __init__(self, scale, weights):
        self.scale, self.weights = scale, weights

    def loss(self, x):
        return tg.sum(tg.tanh(x * self.weights) * self.scale)


def test_an_attribute_of_a_bound_methods_self_rebound_records_anew():
    model = Model(2.0, np.ones(3))
    step = tg.compile(model.loss)
    _same(step, model.loss, X)
    model.scale = 0.5
    _same(step, model.loss, X)
    model.weights = np.array([1.0, -1.0, 2.0])
    _same(step, model.loss, X)
    assert step.cache_info().misses == 3


def _loss_of(x, model):
    return tg.sum(tg.tanh(x * model.weights) * model.scale)


def test_an_attribute_of_a_hashable_argument_rebound_records_anew():
    model = Model(2.0, np.ones(3))
    step = tg.compile(_loss_of)
    _same(step, _loss_of, X, model)
    model.scale = -1.5
    _same(step, _loss_of, X, model)
    model.weights = np.full(3, 0.25)
    _same(step, _loss_of, X, model)
    assert step.cache_info().misses == 3
    _same(step, _loss_of, X, model)
    assert step.cache_info().hits == 1


class Scaled:
    scale = 2.0  # a class attribute, read through the instance

    def __call__(self, x):
        return tg.sum(tg.tanh(x) * self.scale)


class Helper:
    @staticmethod
    def act(x):
        return tg.tanh(x) * SCALE


def _helped(x):
    return tg.sum(Helper.act(x))


def test_a_class_attribute_read_through_self_rebound_records_anew():
    """`M.scale = 5.0` replayed the old 2.0: a class attribute was not guarded."""
    model = Scaled()
    step = tg.compile(model)
    _same(step, model, X)
    Scaled.scale = 5.0
    try:
        _same(step, model, X)
        model.scale = -1.0  # the instance's own, shadowing the class's
        _same(step, model, X)
    finally:
        Scaled.scale = 2.0
    assert step.cache_info().misses == 3


def test_a_static_methods_global_rebound_records_anew():
    global SCALE
    step = tg.compile(_helped)
    _same(step, _helped, X)
    SCALE, before = 5.0, SCALE
    try:
        _same(step, _helped, X)
    finally:
        SCALE = before
    assert step.cache_info().misses == 2


def test_a_user_modules_function_reading_its_own_global_records_anew(tmp_path, monkeypatch):
    """`mymod.act(x)` with `mymod.scale` rebound replayed the old value: the functions of a
    user's module were not looked into."""
    (tmp_path / "guarded_settings.py").write_text(
        "import tracker_gpu as tg\nscale = 2.0\n\ndef act(x):\n    return tg.tanh(x) * scale\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import guarded_settings as mymod

    def f(x):
        return tg.sum(mymod.act(x))

    step = tg.compile(f)
    _same(step, f, X)
    mymod.scale = 5.0
    _same(step, f, X)
    assert step.cache_info().misses == 2


def test_a_function_argument_is_looked_into():
    global SCALE
    step = tg.compile(lambda x, g: tg.sum(g(x)))
    got = step(X, _helper).grad[0]
    SCALE = 10.0
    np.testing.assert_allclose(step(X, _helper).grad[0], got * 5, rtol=1e-12)


def test_the_library_is_not_looked_into():
    guards = guards_of(lambda x: tg.sum(nn.relu(x) * np.pi), (X,))
    assert len(guards) == 0 and guards.holds()


# --- keyword arguments
def _with_keywords(x, *, k=1.0, w=None, mode="sin"):
    y = tg.sin(x) if mode == "sin" else tg.cos(x)
    return tg.sum(y * k * (1.0 if w is None else w))


def test_keyword_arguments_are_taken():
    step = tg.compile(_with_keywords)
    _same(step, _with_keywords, X, k=3.0)
    _same(step, _with_keywords, X, k=3.0, w=np.array([1.0, 2.0, 3.0]))
    _same(step, _with_keywords, X, w=np.array([1.0, 2.0, 3.0]), k=3.0)  # order: one signature
    assert (step.cache_info().misses, step.cache_info().hits) == (2, 1)


def test_keywords_are_part_of_the_signature():
    step = tg.compile(_with_keywords)
    for kw in [{"k": 2.0}, {"k": 3.0}, {"mode": "cos"}, {}, {"k": 2.0}]:
        _same(step, _with_keywords, X, **kw)
    assert (step.cache_info().misses, step.cache_info().hits) == (4, 1)


def test_a_keyword_array_is_read_anew_without_a_gradient():
    step = tg.compile(_with_keywords)
    for w in [np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.0, 5.0])]:
        got = _same(step, _with_keywords, X, w=w)
        assert len(got.grad) == 1
    assert step.cache_info().hits == 1


def test_a_positional_dict_is_not_a_keyword():
    f = lambda x, *rest, **kw: tg.sum(x * (rest[0]["k"] if rest else kw["k"]))  # noqa: E731
    step = tg.compile(f, wrt=0)
    assert float(step(X, {"k": 2.0}).val) == pytest.approx(2 * float(np.sum(X)))
    assert float(step(X, k=3.0).val) == pytest.approx(3 * float(np.sum(X)))
    assert step.cache_info().misses == 2


def test_wrt_names_positions_with_keywords():
    f = lambda x, y, k=1.0: tg.sum(x * y * k)  # noqa: E731
    step, y = tg.compile(f, wrt=1), np.array([1.0, 2.0, 3.0])
    got = step(X, y, k=2.0)
    assert got.grad[0] is None
    np.testing.assert_allclose(got.grad[1], 2.0 * X)


def test_keywords_of_a_function_that_takes_its_own_gradient():
    def train(x, *, lr):
        val, (g,) = tg.withgradient(lambda x: tg.sum(x**2), x)
        return val, x - lr * g

    step = tg.compile(train, gradient=False)
    for lr in [0.1, 0.1, 0.5]:
        val, new = step(X, lr=lr)
        np.testing.assert_allclose(new, X - lr * 2 * X)
    assert step.cache_info().misses == 2


# --- NumPy's random functions: frozen by a replay, and warned
def test_a_numpy_generator_read_by_f_warns_once():
    def noisy(x):
        return tg.sum(x * RNG.normal(size=3))

    step = tg.compile(noisy)
    with pytest.warns(RuntimeWarning, match="'RNG'.*repeats"):
        step(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(X)


def test_numpy_random_module_read_by_f_warns():
    with pytest.warns(RuntimeWarning, match="np.random"):
        tg.compile(lambda x: tg.sum(x * np.random.uniform(size=3)))(X)


class _Noise:
    def __init__(self):
        self.rng = np.random.default_rng(0)

    def draw(self):
        return self.rng.normal(size=3)


_NOISE, _DRAWING = _Noise(), {"rng": np.random.default_rng(1)}

DRAWN_ELSEWHERE = {  # f and its arguments, drawing from a generator the recording repeats
    "an argument": (lambda x, r: tg.sum(x * r.normal(size=3)), (X, np.random.default_rng(0))),
    "a method's self": (lambda x: tg.sum(x * _NOISE.draw()), (X,)),
    "Python's random": (lambda x: tg.sum(x * random.random()), (X,)),
    "a dict's item": (lambda x: tg.sum(x * _DRAWING["rng"].normal(size=3)), (X,)),
}


@pytest.mark.parametrize("case", DRAWN_ELSEWHERE)
def test_a_generator_reached_otherwise_warns_too(case):
    """These went unwarned: every replay repeated the recording's draws without a word."""
    f, args = DRAWN_ELSEWHERE[case]
    with pytest.warns(RuntimeWarning, match="reads the random generator .*repeats"):
        tg.compile(f, wrt=(0,))(*args)


def test_a_layers_draws_do_not_warn():
    drop = nn.Dropout(0.5, rng=np.random.default_rng(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tg.compile(lambda x: tg.sum(drop(x)))(X)
        tg.compile(lambda m, x: tg.sum(m(x)), wrt=(1,))(drop, X)  # its generator an argument's


# --- reads through methods, classes, defaults, partials and containers of functions
class _Module:
    def __call__(self, x):
        return self.forward(x)


class _Net(_Module):
    def __init__(self):
        self.k = 2.0

    def forward(self, x):
        return tg.sum(x * self.k)


class _Settings:
    scale = 2.0

    def __init__(self):
        self._k = 2.0

    @property
    def k(self):
        return self._k

    def apply(self, x):
        return x * self._k


_NET, _SETTINGS, _CONFIG, _HYPER = _Net(), _Settings(), {"scale": 2.0}, {"lr": 2.0, "act": tg.tanh}


def _with_default(x, config=_CONFIG):
    return tg.sum(x * config["scale"])


@functools.cache
def _cached_scale():
    return _Settings.scale


def _through_a_cache(x):
    return tg.sum(x * _cached_scale())


def _change_behind_a_cache():
    _Settings.scale = 5.0
    _cached_scale.cache_clear()  # as eagerly, which reads the cache too


READ_ELSEWHERE = {  # f, and the change to what it reads
    "an inherited __call__'s self": (_NET, lambda: setattr(_NET, "k", 5.0)),
    "a method of a global": (
        lambda x: tg.sum(_SETTINGS.apply(x)),
        lambda: setattr(_SETTINGS, "_k", 5.0),
    ),
    "a property": (lambda x: tg.sum(x * _SETTINGS.k), lambda: setattr(_SETTINGS, "_k", 5.0)),
    "a class attribute": (
        lambda x: tg.sum(x * _Settings.scale),
        lambda: setattr(_Settings, "scale", 5.0),
    ),
    "a default argument": (_with_default, lambda: _CONFIG.update(scale=5.0)),
    "a partial's argument": (
        functools.partial(lambda c, x: tg.sum(x * c["scale"]), _CONFIG),
        lambda: _CONFIG.update(scale=5.0),
    ),
    "a decorated function (functools.cache)": (_through_a_cache, _change_behind_a_cache),
    "a dict holding a function": (
        lambda x: tg.sum(_HYPER["act"](x) * _HYPER["lr"]),
        lambda: _HYPER.update(lr=5.0),
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", READ_ELSEWHERE)
def test_a_value_read_through_a_method_class_default_or_partial_records_anew(case):
    """Each of these reads was not guarded: the replay kept the recording's 2.0."""
    f, change = READ_ELSEWHERE[case]
    saved = (_NET.k, _SETTINGS._k, _Settings.scale, dict(_CONFIG), dict(_HYPER))
    try:
        step = tg.compile(f)
        step(X)
        change()
        assert float(step(X).val) == float(tg.withgradient(f, X).val), case
        assert step.cache_info().misses == 2
    finally:
        _NET.k, _SETTINGS._k, _Settings.scale = saved[:3]
        _CONFIG.update(saved[3])
        _HYPER.update(saved[4])


_MODEL = nn.Chain(nn.Dense(3, 4, rng=np.random.default_rng(1), dtype="float64"),
                  nn.Dropout(0.5, rng=np.random.default_rng(2), active=True))  # fmt: skip


def _global_model_loss(x):
    return tg.sum(_MODEL(x))


@pytest.mark.parametrize(
    "change",
    [
        lambda: setattr(_MODEL.layers[1], "active", False),
        lambda: setattr(_MODEL.layers[1], "p", 0.0),
        lambda: setattr(_MODEL.layers[0], "weight", np.zeros((4, 3))),
    ],
    ids=["active", "p", "weight"],
)
def test_a_global_models_layer_changed_in_place_records_anew(change):
    """A model read from the globals was guarded by identity alone: a layer switched off, or
    a weight rebound, in place, left the replay computing with the recording's."""
    global _MODEL
    saved, x = _MODEL, np.ones((2, 3))
    _MODEL = copy.deepcopy(saved)
    try:
        step = tg.compile(_global_model_loss, wrt=())
        step(x)
        change()
        expected = tg.withgradient(_global_model_loss, x, wrt=()).val
        assert float(step(x).val) == float(expected) and step.cache_info().misses == 2
    finally:
        _MODEL = saved


@dataclasses.dataclass
class _Derived:
    """A dataclass model with an attribute that is not a field, set by `__post_init__`."""

    weights: np.ndarray

    def __post_init__(self):
        self.scale = 3.0
        self.shift = np.zeros(3)
        self.config = _Temperature()

    def __call__(self, x):
        return tg.sum((x - self.shift) * self.weights * self.scale / self.config.temperature)


class _Temperature:
    temperature = 2.0


def _derived_loss(model, x):
    return model(x)


def _write_in_place(model):
    model.shift[:] = 1.0


NON_FIELD_CHANGES = {
    "a number rebound": (lambda m: setattr(m, "scale", -1.5), 2),
    "an array rebound": (lambda m: setattr(m, "shift", np.full(3, 0.5)), 2),
    "an array of another shape": (lambda m: setattr(m, "shift", np.ones(1)), 2),
    "an array written in place": (_write_in_place, 1),  # the same array: read by the replay
    "an attribute added": (lambda m: setattr(m, "extra", 1), 2),
    "a plain object's attribute": (lambda m: setattr(m.config, "temperature", 0.5), 2),
    "an attribute removed": (lambda m: delattr(m, "scale") or setattr(m, "scale", 3.0), 1),
    "nothing": (lambda m: None, 1),
}


@pytest.mark.parametrize("fast", [False, True], ids=["first replay", "fast path"])
@pytest.mark.parametrize("case", NON_FIELD_CHANGES)
def test_a_dataclass_arguments_attributes_that_are_not_fields_are_part_of_its_signature(case, fast):
    """Attributes of a dataclass argument that are not fields were in no signature and no
    guard: `model.scale = -1.5` left the replay computing with 3.0."""
    change, recordings = NON_FIELD_CHANGES[case]
    model = _Derived(np.array([1.0, -2.0, 0.5]))
    step = tg.compile(_derived_loss)
    for _ in range(3 if fast else 1):  # a third call makes the matcher of the fast path
        step(model, X)
    change(model)
    expected = tg.withgradient(_derived_loss, model, X)
    for _ in range(2):
        got = step(model, X)
        assert float(got.val) == float(expected.val)
        np.testing.assert_array_equal(got.grad[0].weights, expected.grad[0].weights)
        np.testing.assert_array_equal(got.grad[1], expected.grad[1])
    assert step.cache_info().misses == recordings


@dataclasses.dataclass
class _GlobalReader:
    """A dataclass model whose methods read the global `SCALE`."""

    weights: np.ndarray

    def __call__(self, x):
        return tg.sum(x * self.weights * SCALE)

    def loss(self, x):
        return self.helper(x) + self.offset

    def helper(self, x):  # named only by `loss`
        return tg.sum(x * self.weights * SCALE)

    @property
    def offset(self):
        return SCALE


class _PlainReader:
    def __init__(self):
        self.weights = np.array([1.0, -2.0, 0.5])

    def __call__(self, x):
        return tg.sum(x * self.weights * SCALE)


ARGUMENTS_READING_A_GLOBAL = {
    "a dataclass's __call__": (lambda m, x: m(x), _GlobalReader),
    "a method f names, and one it names": (lambda m, x: m.loss(x), _GlobalReader),
    "a plain object's __call__": (lambda m, x: m(x), lambda w: _PlainReader()),
}


@pytest.mark.parametrize("case", ARGUMENTS_READING_A_GLOBAL)
def test_a_global_read_by_an_arguments_methods_rebound_records_anew(case):
    """Reads by an argument's methods were not looked into: `SCALE = 5.0` replayed 2.0."""
    global SCALE
    f, make = ARGUMENTS_READING_A_GLOBAL[case]
    model = make(np.array([1.0, -2.0, 0.5]))
    step = tg.compile(f, wrt=(1,))
    for _ in range(3):
        step(model, X)
    SCALE = 5.0
    expected = tg.withgradient(lambda x: f(model, x), X)
    for _ in range(3):
        got = step(model, X)
        assert float(got.val) == float(expected.val), case
        np.testing.assert_array_equal(got.grad[1], expected.grad[0])
    assert step.cache_info().misses == 2


class _Box:
    """A plain object: a config, a namespace."""


_LONG_LIST = [1.0] * 40
_LONG_DICT = {f"k{i}": 1.0 for i in range(40)}
_NESTED = {"optimiser": {"lr": 1.0, "betas": [0.9, 1.0]}}
_CONFIGS = [_Derived(np.ones(3))]
_PAIR = ({"lr": 1.0}, 2.0)
_OUTER = _Box()
_OUTER.inner = _Box()
_OUTER.inner.lr = 1.0

CONTAINERS_CHANGED = {
    "an item of a list of 40": (
        lambda v: tg.sum(v * _LONG_LIST[3]),
        lambda: _LONG_LIST.__setitem__(3, 7.0),
    ),
    "an item of a dict of 40": (
        lambda v: tg.sum(v * _LONG_DICT["k3"]),
        lambda: _LONG_DICT.__setitem__("k3", 7.0),
    ),
    "an item of a nested dict": (
        lambda v: tg.sum(v * _NESTED["optimiser"]["lr"]),
        lambda: _NESTED["optimiser"].__setitem__("lr", 7.0),
    ),
    "an item of a list in a dict": (
        lambda v: tg.sum(v * _NESTED["optimiser"]["betas"][1]),
        lambda: _NESTED["optimiser"]["betas"].__setitem__(1, 7.0),
    ),
    "a field of a dataclass in a list": (
        lambda v: tg.sum(v * _CONFIGS[0].weights[0]),
        lambda: setattr(_CONFIGS[0], "weights", np.full(3, 7.0)),
    ),
    "an item of a dict in a tuple": (
        lambda v: tg.sum(v * _PAIR[0]["lr"]),
        lambda: _PAIR[0].__setitem__("lr", 7.0),
    ),
    "an attribute of an attribute": (
        lambda v: tg.sum(v * _OUTER.inner.lr),
        lambda: setattr(_OUTER.inner, "lr", 7.0),
    ),
}


@pytest.mark.parametrize("case", CONTAINERS_CHANGED)
def test_a_value_inside_what_f_reads_changed_records_anew(case):
    """Items of dicts and lists of more than 16, of nested ones, and attributes of an object's
    attributes were not guarded: the replay kept the recording's 1.0."""
    f, change = CONTAINERS_CHANGED[case]
    saved = copy.deepcopy((_LONG_LIST, _LONG_DICT, _NESTED)), _OUTER.inner.lr
    weights = _CONFIGS[0].weights
    try:
        step = tg.compile(f)
        for _ in range(3):
            step(X)
        change()
        for _ in range(2):
            assert float(step(X).val) == float(tg.withgradient(f, X).val) == 7.0 * X.sum()
        assert step.cache_info().misses == 2
    finally:
        (long_list, long_dict, nested), _OUTER.inner.lr = saved
        _LONG_LIST[:], _NESTED["optimiser"] = long_list, nested["optimiser"]
        _LONG_DICT.update(long_dict)
        _CONFIGS[0].weights = weights
        _PAIR[0]["lr"] = 1.0


def test_a_dict_too_large_to_compare_is_warned_of():
    from tracker_gpu.compiler.guards import ITEMS_MAX

    table = {i: 1.0 for i in range(ITEMS_MAX + 1)}
    step = tg.compile(lambda v: tg.sum(v * table[0]))
    with pytest.warns(RuntimeWarning, match="more than 256 items"):
        step(X)
    step(X)


# --- state held where the reads were not looked into: each replayed the recording's value
class _Scaler:
    def __init__(self, s):
        self.s = s

    def __call__(self, v):
        return v * self.s

    def scaled(self, v):
        return tg.sum(v * self.s)


class _ByName:
    def __init__(self):
        self.w1, self.w2 = 2.0, 3.0

    def __call__(self, x):
        return sum(tg.sum(x * getattr(self, name)) for name in ("w1", "w2"))


class _Layered:
    def __init__(self, holder):
        self.layers = holder([_Scaler(2.0), _Scaler(3.0)])

    def __call__(self, x):
        for layer in self.layers if isinstance(self.layers, list) else self.layers.values():
            x = layer(x)
        return tg.sum(x)


@dataclasses.dataclass
class _Tempered:
    def __call__(self, h):
        return h / _TEMPERATURE


_TEMPERATURE = 2.0
_GLOBAL_MODEL = None  # set by `_global_model_case`


def _through_a_global_model(x):
    return tg.sum(_GLOBAL_MODEL(x) ** 2)


def _set_global(name, value):
    globals()[name] = value


def _global_model_case(layer):
    _set_global("_TEMPERATURE", 2.0)
    _set_global("_GLOBAL_MODEL", nn.Chain(nn.Dense(3, 2, rng=np.random.default_rng(0),
                                                   dtype="float64"), layer))  # fmt: skip
    return _through_a_global_model, (X,), lambda: _set_global("_TEMPERATURE", 4.0)


def _argument_case(make, change):
    held = make()
    return (lambda x, h: tg.sum(x * h.scale)), (X, held), lambda: change(held)


def _case_by_name():
    model = _ByName()
    return model, (X,), lambda: setattr(model, "w1", 10.0)


class _Options:  # settings only: no method of its own reads them
    def __init__(self, s):
        self.s = s


def _case_vars():
    config = _Options(2.0)
    return (lambda x: tg.sum(x * vars(config)["s"])), (X,), lambda: setattr(config, "s", 5.0)


def _case_bound_method():
    scaler = _Scaler(2.0)
    return (lambda x, m: m(x)), (X, scaler.scaled), lambda: setattr(scaler, "s", 5.0)


def _case_layers(holder):
    model = _Layered(holder)
    first = model.layers[0] if holder is list else model.layers["a"]
    return model, (X,), lambda: setattr(first, "s", 7.0)


HELD_ELSEWHERE = {  # a fresh (f, args, change) each
    "an argparse.Namespace argument": lambda: _argument_case(
        lambda: argparse.Namespace(scale=2.0), lambda h: setattr(h, "scale", 5.0)
    ),
    "a types.SimpleNamespace argument": lambda: _argument_case(
        lambda: types.SimpleNamespace(scale=2.0), lambda h: setattr(h, "scale", 5.0)
    ),
    "a bound method argument": _case_bound_method,
    "a lambda in a global model": lambda: _global_model_case(lambda h: h / _TEMPERATURE),
    "a user's layer in a global model": lambda: _global_model_case(_Tempered()),
    "attributes read by getattr": _case_by_name,
    "attributes read by vars": _case_vars,
    "layers in a list attribute": lambda: _case_layers(list),
    "layers in a dict attribute": lambda: _case_layers(lambda ls: dict(zip("ab", ls))),
}


@pytest.mark.parametrize("case", HELD_ELSEWHERE)
def test_state_held_inside_objects_and_models_records_anew_when_changed(case):
    f, args, change = HELD_ELSEWHERE[case]()
    step = tg.compile(f, wrt=(0,))
    for _ in range(2):  # records, replays
        assert float(step(*args).val) == float(tg.withgradient(f, *args, wrt=(0,)).val)
    change()
    assert float(step(*args).val) == float(tg.withgradient(f, *args, wrt=(0,)).val), case
    assert step.cache_info().misses == 2


def test_a_config_object_of_a_user_module_is_guarded(tmp_path, monkeypatch):
    """`mycfg.opts.scale` rebound replayed the old value: a module's objects were skipped."""
    (tmp_path / "guarded_options.py").write_text(
        "import types\nopts = types.SimpleNamespace(scale=2.0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import guarded_options as mycfg

    def f(x):
        return tg.sum(x * mycfg.opts.scale)

    step = tg.compile(f)
    _same(step, f, X)
    mycfg.opts.scale = 5.0
    _same(step, f, X)
    assert step.cache_info().misses == 2


@dataclasses.dataclass
class _Noisy:
    rng: np.random.Generator

    def __call__(self, h):
        return h + self.rng.standard_normal(h.shape)


@pytest.mark.parametrize(
    "held",
    [lambda rng: (rng,), lambda rng: {"rng": rng}, lambda rng: nn.Chain(_Noisy(rng))],
    ids=["a tuple", "a dict", "a user's layer in a model"],
)
def test_a_generator_inside_an_argument_warns(held):
    """Only a generator passed as an argument itself warned."""
    f = lambda x, h: tg.sum(x * (h(x) if callable(h) else 1.0))  # noqa: E731
    with pytest.warns(RuntimeWarning, match="reads the random generator .*repeats"):
        tg.compile(f, wrt=(0,))(X, held(np.random.default_rng(0)))


def test_a_library_layers_generator_inside_an_argument_does_not_warn():
    model = nn.Chain(nn.Dense(3, 3, rng=np.random.default_rng(0), dtype="float64"),
                     nn.Dropout(0.5, rng=np.random.default_rng(1), active=True))  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tg.compile(lambda x, m: tg.sum(m(x)), wrt=(0,))(X, model)

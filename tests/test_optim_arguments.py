"""Every optimiser checks its arguments by name (issue 23): a wrong type or a value out of range
raises an error naming the optimiser, the argument and the value given. The rules and schedules
are enumerated from `optim.__all__`, so one added later is covered."""

import dataclasses
import math
import re

import numpy as np
import pytest

from tracker_gpu import optim

# The arguments a schedule needs (no default), valid.
REQUIRED = {"eta": 0.1, "steps": 10, "period": 4}


def _optimisers():
    found = []
    for name in optim.__all__:
        cls = getattr(optim, name)
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls is not optim.Leaf:
            if name not in (c.__name__ for c in found):
                found.append(cls)
    return found


def _fields(kinds):
    """(class, field) for every field of every optimiser whose default is of one of `kinds`
    (a required field counts by its annotation)."""
    cases = []
    for cls in _optimisers():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else REQUIRED.get(f.name)
            if type(default) in kinds:
                cases.append(pytest.param(cls, f.name, id=f"{cls.__name__}.{f.name}"))
    return cases


def _make(cls, **given):
    required = {
        f.name: REQUIRED[f.name]
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    return cls(**{**required, **given})


def _names_all(info, cls, name, value):
    message = str(info.value)
    assert cls.__name__ in message and re.search(rf"\b{name}\b", message), message
    assert repr(value) in message, message


def test_every_optimiser_is_enumerated():
    names = {cls.__name__ for cls in _optimisers()}
    assert {"Descent", "Adam", "AdamW", "RMSProp", "Lion", "ClipNorm", "Cosine"} <= names


def test_the_issue_example():
    with pytest.raises(TypeError, match=r"Descent: eta .*'0\.1'"):
        optim.Descent("0.1")


@pytest.mark.parametrize("cls, name", _fields({float, int}))
def test_a_number_given_as_a_string(cls, name):
    with pytest.raises((TypeError, ValueError)) as info:
        _make(cls, **{name: "0.1"})
    _names_all(info, cls, name, "0.1")


@pytest.mark.parametrize("cls, name", _fields({float, int}))
@pytest.mark.parametrize("value", [-1.0, math.nan])
def test_a_number_out_of_range(cls, name, value):
    with pytest.raises(ValueError) as info:
        _make(cls, **{name: value})
    _names_all(info, cls, name, value)


@pytest.mark.parametrize("cls, name", _fields({float}))
def test_numpy_numbers_are_numbers(cls, name):
    default = getattr(_make(cls), name)
    _make(cls, **{name: np.float32(default)})


@pytest.mark.parametrize("cls, name", _fields({tuple}))
@pytest.mark.parametrize("value", [("0.9", 0.999), (0.9,), (1.5, 0.9), (0.9, -0.1), 0.9])
def test_a_pair_checked(cls, name, value):
    with pytest.raises((TypeError, ValueError)) as info:
        _make(cls, **{name: value})
    _names_all(info, cls, name, value)


@pytest.mark.parametrize("cls, name", _fields({bool}))
def test_a_flag_checked(cls, name):
    with pytest.raises(TypeError) as info:
        _make(cls, **{name: "yes"})
    _names_all(info, cls, name, "yes")


def test_adjust_is_checked_too():
    state = optim.setup(optim.Adam(), {"w": np.ones(2)})
    with pytest.raises(TypeError, match=r"Adam: eta .*'1e-3'"):
        optim.adjust(state, eta="1e-3")


def _rules():
    """Each rule of `optim.__all__` that `setup` takes, made with its defaults."""
    made = []
    for cls in _optimisers():
        rule = _make(cls)
        if isinstance(rule, optim.Rule):
            made.append(pytest.param(rule, id=cls.__name__))
    return made


@pytest.mark.parametrize("rule", _rules())
def test_adjust_refuses_a_name_no_rule_has_and_changes_every_one_it_has(rule):
    state = optim.setup(rule, {"w": np.ones(2)})
    with pytest.raises(ValueError, match=r"adjust: no rule of this state .* has 'lr'.* eta"):
        optim.adjust(state, lr=0.5)
    for f in dataclasses.fields(rule):
        value = getattr(rule, f.name)
        if type(value) is float:  # each float hyperparameter, changed and read back
            changed = optim.adjust(state, **{f.name: value / 2})
            assert getattr(changed["w"].rule, f.name) == value / 2


def test_adjust_of_a_chain_or_a_schedule_knows_its_parts():
    chain = optim.OptimiserChain(optim.ClipGrad(1.0), optim.Adam())
    state = optim.setup(chain, {"w": np.ones(2)})
    assert optim.adjust(state, delta=2.0, eta=0.5)["w"].rule.rules[0].delta == 2.0
    with pytest.raises(ValueError, match="'etaa'"):
        optim.adjust(state, etaa=0.5)
    scheduled = optim.setup(optim.Scheduled(optim.Adam(), optim.Exp(0.1, 0.5)), {"w": np.ones(2)})
    adjusted = optim.adjust(scheduled, epsilon=1e-6)
    assert adjusted["w"].rule.rule.epsilon == 1e-6
    with pytest.raises(ValueError, match="eta of Scheduled.*set by its schedule"):
        optim.adjust(scheduled, eta=0.5, epsilon=1e-6)  # the schedule would undo it: refused
    with pytest.raises(ValueError, match="'lr'"):
        optim.adjust(scheduled, lr=0.5)


def test_an_infinite_learning_rate_refused():
    with pytest.raises(ValueError, match=r"Descent: eta .*inf"):
        optim.Descent(math.inf)
    optim.ClipGrad(math.inf)  # no clipping: allowed


def test_scheduled_field_names_a_field_of_the_rule():
    with pytest.raises(ValueError, match=r"Scheduled: field 'lr'.*Descent.*eta"):
        optim.Scheduled(optim.Descent(), optim.Exp(0.1), field="lr")


@pytest.mark.parametrize("rule", _rules())
@pytest.mark.parametrize("other", [(3, 4), (4, 1)])
def test_a_state_made_for_another_shape_is_refused_or_holds_nothing_shaped(rule, other):
    """A state reused on a model of another shape: its moments would be broadcast, or read out
    of bounds by a fused step (nan, -1e302). Refused naming the parameter; a rule whose state
    holds no array shaped like its parameter (Descent, a schedule's count) steps every element
    as it steps the model it was made for (all elements alike here)."""
    small = {"w": np.ones((1, 4))}
    state, _ = optim.update(optim.setup(rule, small), small, {"w": np.full((1, 4), 0.5)})
    model, grads = {"w": np.ones(other)}, {"w": np.full(other, 0.5)}
    shaped = [
        a for a in optim.state._flat(state["w"].state) if getattr(a, "ndim", 0) and a.size > 1
    ]
    if shaped:
        with pytest.raises(ValueError, match=r"state of w holds an array of shape \(1, 4\)"):
            optim.update(state, model, grads)
    else:
        _, stepped = optim.update(state, model, grads)
        _, same = optim.update(state, small, {"w": np.full((1, 4), 0.5)})
        np.testing.assert_array_equal(stepped["w"], np.full(other, same["w"][0, 0]))


@pytest.mark.parametrize("rule", _rules())
def test_a_complex_parameter_with_a_gradient_is_refused_not_left_untrained(rule):
    """`setup` makes states for real floats only: a complex parameter's gradient was dropped,
    and the parameter never moved (PyTorch's optimisers step complex parameters)."""
    model = {"z": np.ones(2, complex), "w": np.ones(2)}
    state = optim.setup(rule, model)
    with pytest.raises(ValueError, match=r"update: z is complex \(complex128\) and has a gradient"):
        optim.update(state, model, {"z": np.array([1 + 1j, 1 - 1j]), "w": np.ones(2)})
    _, stepped = optim.update(state, model, {"z": None, "w": np.ones(2)})  # a constant
    np.testing.assert_array_equal(stepped["z"], model["z"])


def _schedules_with_steps():
    found = []
    for cls in _optimisers():
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(_make(cls), optim.Rule) and "steps" in names:
            found.append(pytest.param(cls, id=cls.__name__))
    return found


@pytest.mark.parametrize("cls", _schedules_with_steps())
def test_a_schedule_of_zero_steps_is_refused(cls):
    """Cosine(0.1, steps=0) gave 0.1 then 0.0 for ever: a run whose step count was computed
    as zero trained at the minimum rate, silently."""
    with pytest.raises(ValueError, match=rf"{cls.__name__}: steps must be at least 1 step"):
        _make(cls, steps=0)


def test_freeze_takes_paths_one_by_one_or_in_a_list_and_refuses_others():
    """The messages list paths as `['layers.0.weight']`; passing such a list raised a
    concatenation TypeError from inside."""
    from tracker_gpu import nn

    state = optim.setup(optim.Adam(), nn.Chain(nn.Dense(2, 2), nn.Dense(2, 2), nn.Dense(2, 2)))
    frozen = lambda s: [layer.weight.frozen for layer in s.layers]  # noqa: E731
    assert frozen(optim.freeze(state, ["layers.0", "layers.2"])) == [True, False, True]
    assert frozen(optim.freeze(state, "layers.1")) == [False, True, False]
    assert frozen(optim.thaw(optim.freeze(state), ["layers.1"])) == [True, False, True]
    for bad in (None, 3, ["layers.0", 1]):
        with pytest.raises(TypeError, match=r"a parameter's path is a dotted string"):
            optim.freeze(state, bad)

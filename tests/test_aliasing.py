"""Gradients handed to a user own their memory: writing into one changes no other gradient, no
input and no seed (as PyTorch and JAX guarantee). Each test writes into what it was given and
checks that everything else kept its value."""

import numpy as np

import tracker_gpu as tg


def zero_in_place(backend, a):
    """`a *= 0` in place, through the library's own in-place operator."""
    a *= 0
    assert np.all(backend.to_numpy(a) == 0)


def assert_values(backend, arrays, expected):
    for a, e in zip(arrays, expected):
        assert np.array_equal(backend.to_numpy(a), e)


def test_two_inputs_reached_through_one_addition(backend):
    a, b, w = (backend.asarray([1.0, 2.0]) for _ in range(3))
    ga, gb = tg.gradient(lambda a, b: tg.sum((a + b) * w), a, b)
    zero_in_place(backend, ga)
    assert_values(backend, (gb, a, b), ([1.0, 2.0], [1.0, 2.0], [1.0, 2.0]))


def test_back_of_a_sum_gives_each_leaf_its_own_gradient_and_keeps_the_seed(backend):
    x = tg.param(backend.asarray([[1.0, 2.0], [3.0, 4.0]]))
    y = tg.param(backend.asarray([[1.0, 2.0], [3.0, 4.0]]))
    dy = backend.asarray([[1.0, 2.0], [3.0, 4.0]])
    tg.back(x + tg.permute_dims(y, (1, 0)), dy)
    gx, gy = tg.grad(x), tg.grad(y)
    zero_in_place(backend, gx)
    assert_values(backend, (gy, dy), ([[1.0, 3.0], [2.0, 4.0]], [[1.0, 2.0], [3.0, 4.0]]))


def test_an_array_reachable_twice_gets_the_total_in_two_buffers(backend):
    shared = backend.asarray([2.0])
    (g,) = tg.gradient(lambda t: tg.sum(t["a"] * 3.0 + t["b"]), {"a": shared, "b": shared})
    zero_in_place(backend, g["a"])
    assert_values(backend, (g["b"], shared), ([4.0], [2.0]))


def test_a_custom_pullback_that_returns_an_input_does_not_hand_out_the_input(backend):
    @tg.rule
    def scaled(x, w):
        return x * w, lambda g: (w, x)  # for a scalar g = 1: the other argument itself

    x, w = backend.asarray([1.0, 2.0]), backend.asarray([3.0, 4.0])
    gx, gw = tg.gradient(lambda x, w: tg.sum(scaled(x, w)), x, w)
    zero_in_place(backend, gx)
    zero_in_place(backend, gw)
    assert_values(backend, (x, w), ([1.0, 2.0], [3.0, 4.0]))


def test_implicit_params_get_separate_buffers(backend):
    W, b = tg.param(backend.asarray([1.0, 2.0])), tg.param(backend.asarray([3.0, 4.0]))
    gs = tg.gradient(lambda: tg.sum(W + b), tg.Params([W, b]))
    zero_in_place(backend, gs[W])
    assert_values(backend, (gs[b],), ([1.0, 1.0],))


def test_forward_back_never_returns_the_seed(backend):
    y, back = tg.forward(
        lambda x, z: x + z, backend.asarray([1.0, 2.0]), backend.asarray([0.0, 0.0])
    )
    dy = backend.asarray([5.0, 6.0])
    gx, gz = back(dy)
    zero_in_place(backend, gx)
    assert_values(backend, (gz, dy), ([5.0, 6.0], [5.0, 6.0]))


def test_fresh_gradients_are_not_copied():
    """The common case stays free: a gradient no one else holds is handed out as it is."""
    seen = []

    @tg.rule
    def double(x):
        def pullback(g):
            seen.append(g * 2.0)
            return (seen[-1],)

        return x * 2.0, pullback

    (g,) = tg.gradient(lambda x: tg.sum(double(x)), np.array([1.0, 2.0]))
    assert g is seen[0]

"""L-BFGS (`optim.LBFGS`, `optim.lbfgs_step`) against PyTorch's `torch.optim.LBFGS` without a
line search, on the Rosenbrock function: the same iterates, the same history size, and the
minimum at (1, 1); SciPy's minimiser confirms the minimum. Its refusals are clear."""

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn, optim

torch = pytest.importorskip("torch", reason="the reference L-BFGS is PyTorch's")


def rosenbrock(x):
    """Sum over i of 100 (x[i+1] - x[i]^2)^2 + (1 - x[i])^2, in either library."""
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def ours(m):
    return tg.sum(100 * (m["x"][1:] - m["x"][:-1] ** 2) ** 2 + (1 - m["x"][:-1]) ** 2)


def both(start, **options):
    """Our L-BFGS state and model, and PyTorch's optimiser, tensor and closure."""
    torch_options = {("history_size" if k == "history" else "lr" if k == "eta" else k): v
                     for k, v in options.items()}  # fmt: skip
    model = {"x": np.array(start, dtype=np.float64)}
    state = optim.setup(optim.LBFGS(**options), model)
    tensor = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    reference = torch.optim.LBFGS([tensor], **torch_options)

    def closure():
        reference.zero_grad()
        loss = rosenbrock(tensor)
        loss.backward()
        return loss

    return state, model, reference, tensor, closure


@pytest.mark.parametrize("history", [100, 3])
def test_the_iterates_are_pytorchs(history):
    """One iteration per call, so that every iterate is compared. Without a line search the
    Rosenbrock valley amplifies the last bit of a dot product about tenfold per iteration
    (PyTorch's kernels fuse multiply-adds), so the iterates agree to 1e-12 for the first
    steps and to 1e-8 over twelve."""
    state, model, reference, tensor, closure = both([-1.5, 2.0], history=history, max_iter=1)
    for step in range(12):
        state, model, loss = optim.lbfgs_step(state, model, ours)
        expected_loss = reference.step(closure).detach()
        assert abs(float(loss) - float(expected_loss)) <= 1e-8 * abs(float(expected_loss))
        tolerance = 1e-12 if step < 6 else 1e-8
        np.testing.assert_allclose(model["x"], tensor.detach().numpy(), rtol=tolerance)
    torch_state = reference.state[tensor]
    assert state.n_iter == torch_state["n_iter"] == 12
    assert state.func_evals == torch_state["func_evals"]
    assert len(state.dirs) == len(torch_state["old_dirs"]) <= history


@pytest.mark.parametrize("start, history", [([-1.5, 2.0], 10), ([-1.2, 1.0], 5)])
def test_the_minimum_is_reached_like_pytorch(start, history):
    scipy_optimize = pytest.importorskip("scipy.optimize")
    state, model, reference, tensor, closure = both(start, history=history)
    for _ in range(20):  # 20 calls of up to 20 iterations
        state, model, _ = optim.lbfgs_step(state, model, ours)
        reference.step(closure)
    minimum = scipy_optimize.minimize(scipy_optimize.rosen, start, method="L-BFGS-B").x
    np.testing.assert_allclose(minimum, [1.0, 1.0], atol=1e-4)
    np.testing.assert_allclose(model["x"], minimum, atol=1e-4)
    np.testing.assert_allclose(tensor.detach().numpy(), minimum, atol=1e-4)
    assert float(ours(model)) < 1e-10


def test_the_first_call_is_pytorchs_to_1e12():
    """Twenty iterations inside one call, on a quadratic where rounding does not grow."""
    a = np.array([[3.0, 0.5, 0.0], [0.5, 2.0, 0.3], [0.0, 0.3, 1.0]])
    b = np.array([1.0, -2.0, 0.5])
    quadratic = lambda m: tg.sum(m["x"] * (m["x"] @ a)) / 2 - tg.sum(m["x"] * b)  # noqa: E731
    model = {"x": np.zeros(3)}
    state = optim.setup(optim.LBFGS(eta=0.5, history=2), model)
    tensor = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    reference = torch.optim.LBFGS([tensor], lr=0.5, history_size=2)
    ta, tb = torch.tensor(a), torch.tensor(b)

    def closure():
        reference.zero_grad()
        loss = (tensor * (tensor @ ta)).sum() / 2 - (tensor * tb).sum()
        loss.backward()
        return loss

    state, model, _ = optim.lbfgs_step(state, model, quadratic)
    reference.step(closure)
    np.testing.assert_allclose(model["x"], tensor.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(model["x"], np.linalg.solve(a, b), rtol=1e-4)


def test_a_model_with_several_parameters_and_float32():
    """A layer's weight and bias form one vector, as PyTorch flattens its parameters; a
    float32 model stays float32."""
    rng = np.random.default_rng(0)
    layer = nn.Dense(3, 2, rng=rng, dtype="float32")
    x = rng.standard_normal((8, 3)).astype(np.float32)
    y = rng.standard_normal((8, 2)).astype(np.float32)
    loss = lambda m: nn.mse(m(x), y)  # noqa: E731
    state = optim.setup(optim.LBFGS(history=5), layer)
    before = float(loss(layer))
    for _ in range(3):
        state, layer, _ = optim.lbfgs_step(state, layer, loss)
    assert float(loss(layer)) < 0.9 * before
    assert layer.weight.dtype == np.float32 and layer.bias.dtype == np.float32


def test_refusals():
    model = {"x": np.zeros(2)}
    state = optim.setup(optim.LBFGS(), model)
    with pytest.raises(TypeError, match="call state, model, loss = lbfgs_step"):
        optim.update(state, model, {"x": np.ones(2)})
    with pytest.raises(TypeError, match="the loss as a function of the model"):
        optim.lbfgs_step(state, model, 1.0)
    with pytest.raises(TypeError, match="takes the state of setup"):
        optim.lbfgs_step(optim.setup(optim.Adam(), model), model, ours)
    with pytest.raises(ValueError, match="LBFGS: history must be an int >= 1, got 0"):
        optim.LBFGS(history=0)
    with pytest.raises(ValueError, match="LBFGS: eta must be >= 0"):
        optim.LBFGS(eta=-1.0)
    with pytest.raises(TypeError, match="the state of LBFGS is not saved"):
        optim.save_checkpoint("unused.npz", model, state)
    with pytest.raises(tg.BackError, match="the loss must be a scalar"):
        optim.lbfgs_step(state, model, lambda m: m["x"] * 2)


@pytest.mark.parametrize("other", [(5,), (3, 1), (1, 3)])
def test_a_state_made_for_another_shape_is_refused(other):
    """A state whose history holds vectors of another model: its two-loop recursion would
    broadcast them against this model's gradient, silently."""
    loss = lambda m: tg.sum((m["w"] - 2.0) ** 2)  # noqa: E731
    model = {"w": np.ones(3)}
    state, model, _ = optim.lbfgs_step(optim.setup(optim.LBFGS(max_iter=2), model), model, loss)
    with pytest.raises(ValueError, match=r"parameter 0 had shape \(3,\), this model's has"):
        optim.lbfgs_step(state, {"w": np.ones(other)}, loss)


def test_a_loss_with_aux_is_taken_as_gradient_takes_it():
    """`loss(m)` may return `(loss, aux...)`, as for gradient (it raised from float())."""
    model = {"x": np.array([-1.2, 1.0, 0.3])}
    state = optim.setup(optim.LBFGS(max_iter=5), model)
    plain = optim.lbfgs_step(state, model, ours)
    with_aux = optim.lbfgs_step(state, model, lambda m: (ours(m), "aux"))
    np.testing.assert_array_equal(with_aux[1]["x"], plain[1]["x"])
    assert float(with_aux[2]) == float(plain[2])

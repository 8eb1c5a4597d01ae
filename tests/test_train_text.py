"""The text job (issue 25): a character-level transformer on CPython's documentation text. Its
model matches PyTorch with the same weights, a short run lowers the loss, the baselines are
counted exactly, a stopped run resumes bit for bit, `--compile` trains as eager does, and bad
arguments are argparse's errors before any work."""

import math
import signal
import warnings
from collections import Counter

import numpy as np
import pytest

import tracker_gpu as tg
from tracker_gpu import nn
from tracker_gpu.train import text_cli
from tracker_gpu.train.loop import Interrupted
from tracker_gpu.train.text_data import Text, baselines, batch, corpus, windows
from tracker_gpu.train.text_loop import TextConfig, compiled_text_step, evaluate, train_text
from tracker_gpu.train.transformer import CharTransformer, generate, text_loss

TINY = dict(layers=1, width=16, heads=2, context=16, batch_size=8, lr=1e-2, eval_every=1000)
TINY_ARGS = ["--layers", "1", "--width", "16", "--heads", "2", "--context", "16",
             "--batch-size", "8", "--no-progress", "--plot", ""]  # fmt: skip


@pytest.fixture(autouse=True)
def numpy_only(request):
    if request.config.getoption("backend") not in ("numpy", "numpy-fused"):
        pytest.skip("the text job's tests make their own NumPy arrays")


@pytest.fixture(scope="module")
def text():
    return Text.of(corpus())


# --- the model against PyTorch --------------------------------------------------------------


def torch_reference(p, tokens, heads):
    """The same decoder written in PyTorch from the weights `p` (by name), independently."""
    import torch
    import torch.nn.functional as F

    b, t = tokens.shape
    x = p["embed.weight"][tokens] + p["position"][:t]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    i = 0
    while f"blocks.{i}.norm1.scale" in p:
        k = f"blocks.{i}."
        h = F.layer_norm(x, x.shape[-1:], p[k + "norm1.scale"], p[k + "norm1.bias"], 1e-5)
        q, kk, v = (
            (h @ p[f"{k}attention.{n}_proj.weight"].T + p[f"{k}attention.{n}_proj.bias"])
            .reshape(b, t, heads, -1)
            .transpose(1, 2)
            for n in "qkv"
        )
        scores = (q @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        weights = torch.softmax(scores.masked_fill(~causal, -math.inf), dim=-1)
        joined = (weights @ v).transpose(1, 2).reshape(b, t, -1)
        out = p[k + "attention.out_proj.weight"]
        x = x + joined @ out.T + p[k + "attention.out_proj.bias"]
        h = F.layer_norm(x, x.shape[-1:], p[k + "norm2.scale"], p[k + "norm2.bias"], 1e-5)
        h = F.gelu(
            h @ p[k + "mlp.layers.0.weight"].T + p[k + "mlp.layers.0.bias"], approximate="tanh"
        )
        x = x + h @ p[k + "mlp.layers.1.weight"].T + p[k + "mlp.layers.1.bias"]
        i += 1
    x = F.layer_norm(x, x.shape[-1:], p["norm.scale"], p["norm.bias"], 1e-5)
    return x @ p["embed.weight"].T


def _randomised(model, rng):
    """`model` with every array drawn anew (LayerNorm's ones and zeros, the zero biases)."""
    from tracker_gpu.optim.tree import tree_map_with_path

    def draw(path, x):
        if isinstance(x, np.ndarray) and x.dtype == np.float64:
            return rng.uniform(-0.5, 0.5, x.shape)
        return x

    return tree_map_with_path(draw, model)


def test_the_forward_and_gradients_match_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    model = CharTransformer(11, context=8, width=8, heads=2, layers=2, dropout=0.0, rng=rng,
                            dtype="float64")  # fmt: skip
    model = _randomised(model, rng)
    x, y = rng.integers(0, 11, (3, 7)), rng.integers(0, 11, (3, 7))
    loss, (grads,) = tg.withgradient(lambda m: text_loss(m, x, y), model)
    weights = {k: torch.tensor(v, requires_grad=True) for k, v in nn._parameters(model).items()}
    logits = torch_reference(weights, torch.from_numpy(x), heads=2)
    np.testing.assert_allclose(np.asarray(model(x)), logits.detach().numpy(), rtol=1e-12,
                               atol=1e-12)  # fmt: skip
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), torch.from_numpy(y)
                                                 .reshape(-1))  # fmt: skip
    expected.backward()
    assert abs(float(loss) - expected.item()) < 1e-12
    got = nn._parameters(grads)
    assert set(got) == set(weights)  # the tied embedding: one array, one gradient (both uses)
    for name, w in weights.items():
        np.testing.assert_allclose(got[name], w.grad.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)  # fmt: skip


def test_the_output_is_causal_and_tied():
    rng = np.random.default_rng(1)
    model = CharTransformer(11, context=8, width=8, heads=2, layers=1, dropout=0.0, rng=rng)
    x = rng.integers(0, 11, (2, 8))
    changed = x.copy()
    changed[:, 5:] = (changed[:, 5:] + 1) % 11
    before, after = np.asarray(model(x)), np.asarray(model(changed))
    assert np.array_equal(before[:, :5], after[:, :5])
    assert not np.allclose(before[:, 5:], after[:, 5:])
    assert "head" not in repr(nn._parameters(model).keys())  # no separate output matrix


# --- data and baselines ---------------------------------------------------------------------


def test_the_corpus_ships_with_python_and_is_split_90_10(text):
    assert len(text.vocab) == 103 and 460_000 < len(text.train) + len(text.valid) < 470_000
    assert abs(len(text.valid) / (len(text.train) + len(text.valid)) - 0.1) < 1e-4
    assert text.decode(text.encode("The assert")) == "The assert"
    x, y = batch(text.train, 4, 10, np.random.default_rng(0))
    assert x.shape == y.shape == (4, 10) and np.array_equal(x[:, 1:], y[:, :-1])


@pytest.mark.parametrize("n, context, size", [(50, 7, 3), (47, 7, 3), (47, 7, 100), (9, 8, 2)])
def test_the_validation_windows_predict_every_character_but_the_first_once(n, context, size):
    covered = [y[:, -new:].ravel() for _, y, new in windows(np.arange(n), context, size)]
    assert np.array_equal(np.concatenate(covered), np.arange(1, n))


def test_the_validation_loss_is_the_mean_over_every_predicted_character():
    ids = np.random.default_rng(3).integers(0, 11, size=61)
    model = CharTransformer(11, 8, 16, 2, 1, dropout=0.0, rng=np.random.default_rng(4))
    losses = {}  # each target's loss, -log softmax by hand, where it is first predicted
    for start in [*range(0, 53, 8), 60 - 8]:
        logits = np.asarray(model(ids[None, start : start + 8]), np.float64)[0]
        log_p = logits - logits.max(-1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
        for i in range(8):
            losses.setdefault(start + i + 1, -log_p[i, ids[start + i + 1]])
    assert sorted(losses) == list(range(1, 61))
    expected = np.mean(list(losses.values()))
    assert abs(evaluate(model, ids, 8, 3) - expected) < 1e-5


def test_the_baselines_are_counted_exactly():
    train, valid = "abracadabra cab", "bacabra dac"
    text = Text.of(train + valid, fraction=len(valid) / len(train + valid))
    assert text.decode(text.valid) == valid
    vocab = sorted(set(train + valid))
    unigram = Counter(train)
    expected_unigram = -np.mean(
        [math.log((unigram[c] + 1) / (len(train) + len(vocab))) for c in valid]
    )
    pairs, firsts = Counter(zip(train, train[1:])), Counter(train[:-1])
    expected_bigram = -np.mean(
        [math.log((pairs[a, b] + 1) / (firsts[a] + len(vocab))) for a, b in zip(valid, valid[1:])]
    )
    got = baselines(text.train, text.valid, len(text.vocab))
    assert got["unigram"] == pytest.approx(expected_unigram, rel=1e-12)
    assert got["bigram"] == pytest.approx(expected_bigram, rel=1e-12)


# --- training -------------------------------------------------------------------------------


def test_fifty_steps_lower_the_loss(text):
    result = train_text(TextConfig(**TINY, steps=50, warmup=5), text)
    losses = result.history["loss"]
    assert len(losses) == 5 and losses[-1] < losses[0] - 0.5
    assert result.valid_loss < math.log(len(text.vocab))


def _weights(model):
    return {k: np.array(v) for k, v in nn._parameters(model).items()}


def _same(a, b):
    assert _weights(a.model).keys() == _weights(b.model).keys()
    for name, value in _weights(a.model).items():
        assert np.array_equal(value, _weights(b.model)[name]), name
    assert a.history == b.history


def test_a_stopped_run_resumes_bit_for_bit(text, tmp_path):
    config = TextConfig(**{**TINY, "eval_every": 8}, steps=20, warmup=2, dropout=0.1)
    straight = train_text(config, text)
    steps = iter(range(1, 100))
    stop = lambda: signal.SIGINT if next(steps) == 13 else None  # noqa: E731
    with pytest.raises(Interrupted) as stopped:
        train_text(config, text, save=tmp_path / "text.npz", stop=stop)
    assert stopped.value.step == 13
    resumed = train_text(config, text, resume=tmp_path / "text.npz")
    _same(straight, resumed)


def test_a_compiled_step_trains_as_the_eager_one(text):
    config = TextConfig(**TINY, steps=12, warmup=2, dropout=0.1)
    eager = train_text(config, text)
    compiled = train_text(config, text, step=compiled_text_step(), step_kind="compiled")
    _same(eager, compiled)


def test_generation_is_the_forward_only(text):
    model = CharTransformer(len(text.vocab), 16, 16, 2, 1, rng=np.random.default_rng(0))
    codes = generate(model, text.encode("The"), 40, temperature=0.8, rng=np.random.default_rng(0))
    again = generate(model, text.encode("The"), 40, temperature=0.8, rng=np.random.default_rng(0))
    assert len(codes) == 40 and codes == again and all(0 <= c < 103 for c in codes)


def test_generation_at_the_smallest_temperatures_is_greedy(text):
    """The logits are shifted before they are divided: a tiny temperature gave inf - inf, nan
    probabilities, and a ValueError after the whole run."""
    model = CharTransformer(len(text.vocab), 16, 16, 2, 1, rng=np.random.default_rng(0))
    prompt = text.encode("The")
    greedy = generate(model, prompt, 12, temperature=1e-6, rng=np.random.default_rng(0))
    for temperature in (1e-310, 5e-324):
        rng = np.random.default_rng(1)
        with warnings.catch_warnings():  # nor a warning of the overflow to -inf on the way
            warnings.simplefilter("error")
            assert generate(model, prompt, 12, temperature=temperature, rng=rng) == greedy


# --- the command line -----------------------------------------------------------------------


def test_the_command_line_trains_reports_and_samples(tmp_path, capsys):
    plot = tmp_path / "text.png"
    result = text_cli.run([*TINY_ARGS, "--steps", "20", "--plot", str(plot), "--prompt", "def ",
                           "--sample-length", "30", "--save", str(tmp_path / "run")])  # fmt: skip
    out = capsys.readouterr().out
    assert "nats/char" in out and "bigram 2.323" in out and "unigram 3.238" in out
    assert result.sample.startswith("def ") and len(result.sample) == 34
    assert plot.stat().st_size > 0 and (tmp_path / "run" / "text.npz").exists()


def test_the_digits_job_stays_the_default(capsys):
    from tracker_gpu.train import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--models" in out and "tracker_gpu.train text" in " ".join(out.split())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--context", "100000"], "longer than the validation text"),
        (["--context", "40000"], "attention weights alone would take"),
        (["--heads", "0"], "must be more than 0"),
        (["--width", "30", "--heads", "4"], "not divisible by --heads"),
        (["--prompt", "\u2211"], "not in the text"),
        (["--temperature", "0"], "must be more than 0"),
        (["--resume", "nowhere"], "no checkpoint"),
        (["--width", "200000", "--heads", "1"], "the parameters, their gradients"),
        (["--layers", "10000000", "--width", "64"], "the parameters, their gradients"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        text_cli.main([*TINY_ARGS, *argv])
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == "" and message in err


def test_a_stop_before_the_first_checkpoint_says_to_start_again(tmp_path):
    """With --save given, the line said that nothing was saved for want of --save."""
    argv = [*TINY_ARGS, "--save", str(tmp_path)]
    line = text_cli._stopped_line(Interrupted(signal.SIGTERM, "text", 0, 0, None), argv)
    assert "before any checkpoint was written; start again with:" in line
    assert "no --save" not in line and "--resume" not in line


def test_an_argument_error_leaves_no_save_folder_behind(tmp_path, capsys):
    with pytest.raises(SystemExit):
        text_cli.main([*TINY_ARGS, "--prompt", "\u2211", "--save", str(tmp_path / "run")])
    assert "not in the text" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_a_run_whose_weights_become_not_finite_is_one_line(capsys):
    """The last update left NaN weights after a finite training loss: the validation loss was
    nan, and the sample raised a traceback."""
    with pytest.raises(SystemExit) as stopped:
        text_cli.main([*TINY_ARGS, "--steps", "1", "--lr", "1e30", "--sample-length", "20"])
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and "Traceback" not in err
    assert "validation loss became nan after step 1; lower the learning rate" in err


def test_a_resume_from_a_folder_in_the_checkpoints_place_says_so(tmp_path, capsys):
    (tmp_path / "text.npz").mkdir()
    with pytest.raises(SystemExit):
        text_cli.main([*TINY_ARGS, "--resume", str(tmp_path)])
    assert "is a folder, not a checkpoint" in capsys.readouterr().err  # it said "no checkpoint"


def test_a_resume_with_another_setting_is_refused(tmp_path, capsys):
    text_cli.run([*TINY_ARGS, "--steps", "10", "--sample-length", "0", "--save", str(tmp_path)])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        text_cli.main([*TINY_ARGS, "--steps", "10", "--width", "32", "--resume", str(tmp_path)])
    assert "saved with --width 16" in capsys.readouterr().err


@pytest.mark.parametrize(
    "changed, said",
    [(["--compile"], "saved with step eager, going on with compiled"),
     (["--backend", "torch"], "saved with backend numpy, going on with torch")],
    ids=["compiled", "backend"],
)  # fmt: skip
def test_a_resume_that_runs_otherwise_says_so(tmp_path, capsys, changed, said):
    """The text job went on with another backend or step without a word (the digits job said
    it), and its losses differ from the straight run's by rounding."""
    if "torch" in changed:
        pytest.importorskip("torch")
    args = [*TINY_ARGS, "--steps", "4", "--sample-length", "0"]
    stop = lambda: signal.SIGINT  # noqa: E731  (after the first step)
    with pytest.raises(Interrupted):
        text_cli.run([*args, "--backend", "numpy", "--save", str(tmp_path)], stop=stop)
    capsys.readouterr()
    text_cli.run([*TINY_ARGS, "--sample-length", "0", "--resume", str(tmp_path), *changed])
    assert said in capsys.readouterr().out


def test_a_resumed_run_keeps_its_eval_every_and_a_fresh_one_refuses_an_earlier_checkpoint(
    tmp_path, capsys
):
    args = [*TINY_ARGS, "--steps", "6", "--eval-every", "2", "--sample-length", "0"]
    asked = []
    stop = lambda: asked.append(1) or (signal.SIGINT if len(asked) == 1 else None)  # noqa: E731
    with pytest.raises(Interrupted):
        text_cli.run([*args, "--save", str(tmp_path)], stop=stop)
    resumed = text_cli.run([*TINY_ARGS, "--sample-length", "0", "--resume", str(tmp_path)])
    assert resumed.config.eval_every == 2 and resumed.history["valid_step"] == [2, 4, 6]
    capsys.readouterr()
    with pytest.raises(SystemExit):  # a fresh run would leave it beside its own
        text_cli.main([*args, "--save", str(tmp_path)])
    assert "holds a checkpoint of an earlier run" in capsys.readouterr().err


def test_a_resume_on_another_text_is_refused(text, tmp_path, capsys, monkeypatch):
    """CPython's documentation differs between versions (465,048 characters in 3.11.7, 466,097
    in 3.11.2, the same 103 distinct): a run resumed under another Python went on training and
    validating on another text without a word."""
    text_cli.run([*TINY_ARGS, "--steps", "2", "--sample-length", "0", "--save", str(tmp_path)])
    other = corpus()[:-1000]  # the same characters, a shorter text
    monkeypatch.setattr(text_cli, "corpus", lambda: other)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        text_cli.main([*TINY_ARGS, "--steps", "4", "--resume", str(tmp_path)])
    err = capsys.readouterr().err
    assert f"was trained on a text of {len(corpus()):,} characters" in err, err
    config = TextConfig(**TINY, steps=4)
    with pytest.raises(ValueError, match="another text"):
        train_text(config, Text.of(other), resume=str(tmp_path / "text.npz"))


def test_a_checkpoint_damaged_past_its_header_is_refused_before_any_work(tmp_path, capsys):
    """Only the header and the first 64 KiB of each array were read before the run: a flipped
    byte further in was a traceback after the job had printed its settings and started."""
    import zipfile

    wide = ["--layers", "1", "--width", "256", "--heads", "2", "--context", "16",
            "--batch-size", "2", "--steps", "2", "--no-progress", "--plot", ""]  # fmt: skip
    text_cli.run([*wide, "--sample-length", "0", "--save", str(tmp_path)])
    path = tmp_path / "text.npz"
    with zipfile.ZipFile(path) as archive:
        largest = max(archive.infolist(), key=lambda member: member.file_size)
    assert largest.file_size > 2 * 65536
    with open(path, "r+b") as f:
        f.seek(largest.header_offset + 100 + largest.file_size - 1000)  # past its first 64 KiB
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x40]))
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        text_cli.main([*wide, "--resume", str(tmp_path)])
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and "--resume" in err and "damaged" in err, err
    assert out == ""  # no work begun


@pytest.mark.parametrize("name", ["transformer", "text_data"])
def test_the_docstring_examples(name):
    import doctest
    import importlib

    module = importlib.import_module(f"tracker_gpu.train.{name}")
    assert doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0


# --- mixed precision (here: the text job through the host build of the kernels is too slow
# for the numpy-fused row)
def test_the_text_job_saves_and_resumes_its_loss_scale(tmp_path, capsys):
    common = ["--layers", "1", "--width", "16", "--heads", "2", "--context", "8",
              "--batch-size", "4", "--steps", "6", "--sample-length", "0", "--plot", "",
              "--no-progress"]  # fmt: skip
    args = [*common, "--precision", "16"]
    straight = text_cli.run(args)
    asked = []
    stop = lambda: asked.append(1) or (signal.SIGINT if len(asked) == 3 else None)  # noqa: E731
    with pytest.raises(Interrupted):
        text_cli.run([*args, "--save", str(tmp_path)], stop=stop)
    info = tg.optim.read_checkpoint_info(str(tmp_path / "text.npz"))
    assert info["settings"]["precision"] == "16" and info["step"] == 3
    saved = tg.LossScale(**info["loss_scale"])
    assert saved.good + saved.skipped == 3
    capsys.readouterr()
    resumed = text_cli.run([*common, "--resume", str(tmp_path)])
    assert "computing in float16" in capsys.readouterr().out  # the checkpoint's precision
    assert resumed.history["loss"] == straight.history["loss"]
    for a, b in zip(_floating(resumed.model), _floating(straight.model)):
        assert np.array_equal(a, b)


def _floating(tree):
    from tracker_gpu.pytree import tree_leaves

    return [x for x in tree_leaves(tree) if getattr(x, "dtype", None) is not None
            and np.issubdtype(np.asarray(x).dtype, np.floating)]  # fmt: skip


@pytest.mark.parametrize("job", ["text", "digits"])
def test_a_save_that_fails_mid_run_is_one_line_and_exit_1(job, tmp_path, capsys, monkeypatch):
    """A full disk at a checkpoint ended the run with a traceback; the error names the file
    and says the one there before is unchanged."""
    from tracker_gpu import optim
    from tracker_gpu.files import SaveError
    from tracker_gpu.train import cli

    def full(path, *args, **kwargs):
        raise SaveError(path, OSError(28, "No space left on device"))

    monkeypatch.setattr(optim, "save_checkpoint", full)
    if job == "text":
        argv = [*TINY_ARGS, "--steps", "2", "--sample-length", "0", "--save", str(tmp_path)]
        main = text_cli.main
    else:
        argv = ["--backend", "numpy", "--models", "mlp", "--epochs", "1", "--plot", "",
                "--no-progress", "--save", str(tmp_path)]  # fmt: skip
        main = cli.main
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and "Traceback" not in err
    assert "No space left on device" in err and "unchanged" in err

"""`tg.compile`: record a function once per signature, replay it without building a tape.

`step = tg.compile(f)`; `step(*args)` returns what `tg.withgradient(f, *args)` returns. The
first call with a new signature (`signature.py`: the arguments' structure and each array's
library, shape, dtype and device) runs `f` and its gradient eagerly while recording them; later
calls with that signature replay the recording (`program.py`): the forward as a flat list of the
rules' forwards, the backward as the recorded pullbacks in their recorded order. With
`gradient=False`, `f` takes its own gradient (a training step calling `withgradient` and then
`optim.update`) and `step(*args)` returns `f`'s output: the step is the whole program. A layer's
buffers that `f` reads and writes (BatchNorm's running statistics) are inputs and outputs of the
program: read anew and written back in place by every replay. So are the arguments that `f` gets
as plain arrays eagerly (outside `wrt`, or all of them with `gradient=False`) and writes into
(`c += 1.0`, `out[...] = v`): every replay writes the caller's array as the eager call does (a
write whose old value `f` reads after it, through a view or a value a gradient pass saved, is
refused: `recorder.argument_writes`). Every array a call returns is the caller's own: one that
`f` makes without its arguments (`tg.zeros(3)`) is copied at each call, as eagerly it is made
anew.

While recording, integer and boolean arrays among the arguments are traced too, so what `f`
computes from them is replayed from the new ones, and random draws of tracker_gpu's layers
(`nn.Dropout`) are drawn anew by every replay. What cannot be replayed is refused with an
error naming the operation (`tg.RecordingError`): a tracked value made a Python number or a
branch (`float(x)`, `if x > 0:`), used as an index, or a tracked array made outside `f`. With
`fallback=True` such a signature runs eagerly every time instead (the refused recording's run
finishes eagerly, so that `f` runs once per call).

What `f` reads from its globals and closure (`guards.py`: numbers and strings by value, arrays
by identity, shape and dtype) is checked before every replay; when it has changed, the call
records anew. Keyword arguments are part of the signature, and are not differentiated.

>>> import numpy as np, tracker_gpu as tg
>>> step = tg.compile(lambda x: tg.sum(tg.sin(x) * x))
>>> val, (g,) = step(np.array([0.5, 1.0]))  # records
>>> val, (g,) = step(np.array([0.0, 2.0]))  # replays
>>> bool(np.allclose(g, np.sin([0.0, 2.0]) + np.array([0.0, 2.0]) * np.cos([0.0, 2.0])))
True
>>> step.cache_info()
CacheInfo(hits=1, misses=1, maxsize=32, currsize=1, eager=0)
"""

import functools
import sys
import threading
import warnings
from collections import OrderedDict, namedtuple
from dataclasses import dataclass

import numpy as np

from .. import draws, nesting, recording
from ..api import (
    HandOut,
    WithGradient,
    _as_data,
    backprop,
    gradients_in_place,
    positions,
    top_levels,
    track_inputs,
    withgradient,
)
from ..pytree import tree_map
from ..recording import RecordingError
from ..tracked import TrackedArray
from . import cuda_target, loops, native_rules  # noqa: F401 (installs the rules' native loops)
from .argument_writes import CONTAINER_CHANGED, AsEagerly, changed, containers
from .fastpath import matcher
from .guards import ITEMS_MAX, Guards, guards_of
from .program import Program, shallow_copy
from .recorder import Recorder, Walk
from .signature import VALUES, TrackedArgument, arrays_of, signature_and_arrays

__all__ = ["compile", "Compiled", "RecordingError"]

CacheInfo = namedtuple("CacheInfo", "hits misses maxsize currsize eager")
_EAGER = object()  # a signature that runs eagerly (fallback=True after a refusal)
_KEYWORDS = object()  # marks the signature of a call with keyword arguments
_TRACKED = object()  # a call with tracked arguments, which has no signature
VARIANTS = 8  # recordings kept for one signature whose guards differ (guards.py)


def compile(f, *, gradient=None, wrt=None, fallback=False, maxsize=32, cuda_graphs=True, fuse=None):
    """`f` recorded once per signature and replayed after (see the module's docstring).

    `gradient` says what a call returns: True, `withgradient(f, *args)`; False, `f(*args)` as
    it is, for an `f` that takes its own gradient (a training step that calls `withgradient`
    and `optim.update`: the whole step is one program). None (the default) is True, except for
    an `f` that makes a backward pass and returns that pass's loss first, or no tracked loss
    at all: that is taken as False, with a DeprecationWarning asking to say so.
    `wrt` differentiates only the arguments at those positions, as in `gradient` (a data batch
    passed as a float array is then read anew by every replay, without a gradient);
    `fallback=True` runs `f` eagerly for a signature whose recording was refused; `maxsize`
    bounds the signatures kept (the least recently used goes first), each with up to
    `VARIANTS` recordings for the values it read from outside its arguments (`guards.py`);
    keyword arguments are part of the signature and not differentiated; `cuda_graphs=False`
    replays CuPy programs step by step instead of as CUDA graphs; `fuse` replays each region
    of elementwise operations of a NumPy program, and each chain of elementwise pullbacks of its
    backward passes, as one generated C++ loop, built once and cached on disk (`fusion.py`,
    `backward.py`, `loops.py`; without a compiler, unfused with a warning): `fuse="exact"`
    fuses what it computes bit for bit as eager does (the correctly rounded operations, and
    exp, sin, tanh, sigmoid... of float32 and float64 by NumPy's own loops: `numpy_loops.py`),
    `fuse=True` the C library's powers and half-type functions too (within a few
    units in the last place of NumPy's), `fuse=False` nothing. None (the default) is "exact"
    where the machine's vector instructions are IEEE arithmetic and tested
    (`loops.EXACT_MACHINES`: x86-64), else False. A CuPy
    program's regions are CUDA kernels, several to a launch (`cuda_target.py`); there None is
    "exact" whatever the host.
    """
    if not callable(f):
        raise TypeError(f"tg.compile needs a function, got {type(f).__name__}")
    if gradient not in (None, True, False):
        raise TypeError(f"tg.compile: gradient is True, False or None, got {gradient!r}")
    if fuse not in (None, True, False, "exact"):
        raise TypeError(f"tg.compile: fuse is None, True, False or 'exact', got {fuse!r}")
    if not (isinstance(maxsize, int) and not isinstance(maxsize, bool) and maxsize >= 1):
        raise ValueError(f"tg.compile: maxsize is the number of signatures kept, an int >= 1, "
                         f"got {maxsize!r}")  # fmt: skip
    compiled = Compiled(f, fallback, maxsize, cuda_graphs, wrt, gradient,
                        loops.default_fuse() if fuse is None else fuse)  # fmt: skip
    compiled.cuda_fuse = "exact" if fuse is None else fuse  # a GPU's arithmetic is IEEE's
    return compiled


class Compiled:
    """A compiled function: call it as `f`; `cache_info()` says what it holds."""

    def __init__(self, f, fallback, maxsize, cuda_graphs, wrt=None, gradient=None, fuse=False):
        self.f, self.fallback, self.maxsize, self.cuda_graphs = f, fallback, maxsize, cuda_graphs
        self.wrt, self.gradient, self.fuse, self.cuda_fuse = wrt, gradient, fuse, fuse
        self._programs = OrderedDict()
        self._matchers, self._matcher = {}, None  # signature -> fast path; the last one hit
        self._hits = self._misses = 0
        self._churned = self._guard_churned = self._warned_random = self._warned_large = False
        self._lock = threading.RLock()
        functools.update_wrapper(self, f, updated=())

    def __call__(self, *args, **kwargs):
        last = self._matcher  # read once: another thread may change it
        if last is not None:
            ran = self._fast(last, _matched(args, kwargs))
            if ran is not None:
                return _plain(ran)
            with self._lock:  # its hits since the last call here count as uses
                if last[0] in self._programs:
                    self._programs.move_to_end(last[0])
        memo = {}
        chosen = _chosen(args, self.wrt, self.gradient)  # a Python number outside stays one
        original, warned = args, any(_top_level_number(args[i]) for i in chosen)
        args = tuple(_prepared(a, memo) for a in top_levels(args, chosen))
        kwargs_given = kwargs
        try:
            if kwargs:  # by name: the order they are written in does not matter
                kwargs = {k: _prepared(kwargs[k], memo) for k in sorted(kwargs)}
                key, arrays = signature_and_arrays((args, kwargs))
                key = (_KEYWORDS, key)
            else:
                key, arrays = signature_and_arrays(args)
        except TrackedArgument:
            key = _TRACKED
        if key is _TRACKED:
            return self._inlined(original, kwargs_given)
        with self._lock:  # the cache, shared by the threads that call: replays run outside
            variants = self._programs.get(key)
            program = None if variants is None else _holding(variants, arrays)
            if program is not None:
                self._hits += 1
                self._programs.move_to_end(key)
                if program is not _EAGER and not warned:
                    self._match_next(key, _matched(args, kwargs), _matched(original, kwargs_given))
            else:
                self._misses += 1  # counted under the lock: the churn warning reads it
        if program is None:
            return self._record(key, args, kwargs, variants, arrays)
        if program is _EAGER:
            return _plain(self._eager(args, kwargs))
        return _plain(program.run(arrays))

    def _fast(self, last, given):
        """The replay's result if the arguments (`_matched`) have the signature of the last
        call that replayed (`last`) and its guards hold (`fastpath.py`), else None."""
        _, match, variants = last  # the signature's variants, while it is cached
        arrays = match(given)
        program = None if arrays is None else _holding(variants, arrays)
        if program is None or program is _EAGER:
            return None
        # unlocked (a lock per replay costs more than a rare lost count of a hit under threads);
        # moved to the end of the cache by the next call that is not fast
        self._hits += 1
        return program.run(arrays)

    def _match_next(self, key, args, original):
        """Let the next call with this signature take the fast path (`fastpath.py`), with a
        matcher made once per signature."""
        if self._matcher is None or self._matcher[0] != key:
            made = self._matchers.get(key)
            if made is None:
                made = self._matchers[key] = matcher(original, args)
                if len(self._matchers) > self.maxsize:  # those of evicted signatures go
                    self._matchers = {k: m for k, m in self._matchers.items()
                                      if k in self._programs}  # fmt: skip
            self._matcher = None if made is None else (key, made, self._programs[key])

    def __getstate__(self):
        """A copy or a pickle holds the function and its options; it records anew (a
        recording holds compiled code, the cache is this object's own)."""
        state = dict(self.__dict__, _programs=OrderedDict(), _matchers={}, _matcher=None)
        state.update(_hits=0, _misses=0)
        state.pop("_lock")
        return state

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.RLock())

    def __reduce_ex__(self, protocol):
        """By its name where `f` was decorated (`@tg.compile def step`): its module's `step` is
        then this object, and `f` cannot be pickled by that name (multiprocessing, joblib);
        else by value (`__getstate__`)."""
        if _found_by_name(self):
            return self.__qualname__
        return super().__reduce_ex__(protocol)

    def cache_info(self):
        programs = [p for variants in self._programs.values() for _, p in variants]
        eager = sum(p is _EAGER for p in programs)
        return CacheInfo(self._hits, self._misses, self.maxsize, len(programs), eager)

    def programs(self):
        """The recordings kept (the replayed programs; none for a signature run eagerly),
        the least recently used signature first, its newest recording first."""
        found = [p for variants in self._programs.values() for _, p in variants]
        return [p for p in found if p is not _EAGER]

    def cache_clear(self):
        self._programs.clear()
        self._matchers, self._matcher = {}, None
        self._hits = self._misses = 0

    def _record(self, key, args, kwargs, variants, arrays):
        """Record `f` for a new signature, or anew for one whose recordings' guards (the
        globals and closure they read, `guards.py`) no longer hold: one more variant."""
        changed = None if variants is None else variants[0][0].failing(arrays)
        before = guards_of(self.f, args, kwargs)  # what f reads, as it reads it
        before.note_aliases(arrays)
        try:
            # notrack() is f's own; a recording that raises leaves the layers' buffers as they were
            with draws.noted() as drawn, nesting.resumed(), recording.Journal():
                program, result = record(
                    self.f,
                    args,
                    self.cuda_graphs,
                    self.wrt,
                    self.gradient,
                    self.fallback,
                    kwargs,
                    self.fuse,
                    self.cuda_fuse,
                )
        except RecordingError:
            if not self.fallback:
                raise
            # a refusal the run could not go on from eagerly: f runs again, eagerly, drawing
            # what the recording drew (as the one eager run would), without winding a shared
            # generator back over other threads' draws
            with draws.replayed(drawn):
                program, result = None, self._eager(args, kwargs)
        # guarded as the recording read them: a value another thread changed meanwhile makes
        # the next call record anew (taken after, it would guard a program of the old value)
        guards = Guards() if program is None else before
        self._warn_random(guards)
        self._warn_by_identity(guards)
        if program is not None:  # (run eagerly, f's changes are f's own)
            self._warn_changed(before.changed())
        with self._lock:
            self._keep(key, (guards, _EAGER if program is None else program), changed)
        return _plain(result)

    def _keep(self, key, variant, changed):
        """`variant` first among the key's, the least recently used signature evicted; a first
        recording of a key that another thread recorded meanwhile is not kept twice."""
        if changed is None and key in self._programs:
            self._programs.move_to_end(key)
            return
        variants = self._programs.setdefault(key, [])
        variants.insert(0, variant)
        if len(variants) > VARIANTS:
            variants.pop()
            self._warn_guard_churn(changed)
        self._programs.move_to_end(key)
        while len(self._programs) > self.maxsize:
            evicted, _ = self._programs.popitem(last=False)
            if self._matcher is not None and self._matcher[0] == evicted:
                self._matcher = None
            self._warn_churn()

    def _inlined(self, args, kwargs):
        """A call with tracked arguments (inside a gradient, or while another compiled
        function records) is a call of `f` as eagerly, its result tracked: the pass or the
        recording around it records what `f` computes, as `jax.jit` inside `jax.grad` or
        another `jax.jit` traces through."""
        result = self._eager(args, kwargs)
        return result.val if isinstance(result, _Own) else result

    def _eager(self, args, kwargs):
        if self.gradient is False:
            return _Own(self.f(*args, **kwargs))
        return withgradient(_with_keywords(self.f, kwargs), *args, wrt=self.wrt)

    def _warn_changed(self, names):
        """Warn of what `f` read and changed while recording (a counter): a replay runs none
        of f's Python code, so it stays as the recording left it, and f's reads of it are
        the recording's."""
        if names:
            warnings.warn(
                f"tg.compile of {getattr(self.f, '__name__', 'f')!r}: f changed "
                f"{', '.join(names)} while recording, which it reads; a replay runs none of "
                "f's Python code, so it is left as the recording left it, and what f computed "
                "from it is the recording's. Keep such state outside f, or pass it as an "
                "argument (a 0-d array argument outside wrt, or with gradient=False, that f "
                "writes into in place is written back by every replay, as eagerly)",
                RuntimeWarning,
                stacklevel=3,
            )

    def _warn_by_identity(self, guards):
        if guards.by_identity:
            self._warn_once(
                "_warned_large",
                f"reads {guards.by_identity[0]!r}, a dict, list or tuple of more than "
                f"{ITEMS_MAX} items in all: a replay checks that it is the same object, not its "
                "items, so a change to them is not seen. Pass what f needs of it as arguments",
            )

    def _warn_random(self, guards):
        if guards.random:
            self._warn_once(
                "_warned_random",
                f"reads the random generator {guards.random[0]!r} (NumPy's or Python's): what "
                "f draws from it is drawn once, while recording, and every replay repeats those "
                "numbers. Draw with tracker_gpu's layers (nn.Dropout draws anew at every "
                "replay), or pass the draws in as an argument",
            )

    def _warn_once(self, flag, message):
        """Warn of what the recording read, once per compiled function (`flag` says whether
        it has been)."""
        if getattr(self, flag):
            return
        setattr(self, flag, True)
        name = getattr(self.f, "__name__", "f")
        warnings.warn(f"tg.compile of {name!r} {message}", RuntimeWarning, stacklevel=5)

    def _warn_guard_churn(self, changed):
        if self._guard_churned:
            return
        self._guard_churned = True
        warnings.warn(
            f"tg.compile of {getattr(self.f, '__name__', 'f')!r} has recorded anew more than "
            f"{VARIANTS} times for one signature, because a value it reads from outside its "
            f"arguments changes from call to call ({changed!r}); each recording builds its "
            "fused loops anew (a tenth of a second, and memory kept while the process lives). "
            "Pass such a value as an argument (a number as a 0-d array is read anew by every "
            "replay)",
            RuntimeWarning,
            stacklevel=4,
        )

    def _warn_churn(self):
        if self._churned:
            return
        self._churned = True
        warnings.warn(
            f"tg.compile of {getattr(self.f, '__name__', 'f')!r} has recorded {self._misses} "
            f"programs and drops the oldest: its signature changes from call to call. A Python "
            "number inside the arguments is part of the signature (a schedule's step count, "
            "say), and each recording builds its fused loops anew (a tenth of a second, and "
            "memory kept while the process lives); pass such a number as a 0-d array, or raise "
            "maxsize if the shapes really vary that much",
            RuntimeWarning,
            stacklevel=3,
        )

    def __repr__(self):
        return f"<tg.compile of {getattr(self.f, '__name__', self.f)!r}: {self.cache_info()}>"


def _found_by_name(compiled):
    """Whether `compiled`'s module holds it under its qualified name."""
    found = sys.modules.get(getattr(compiled, "__module__", None) or "")
    for part in getattr(compiled, "__qualname__", "<lambda>").split("."):
        found = getattr(found, part, None)
    return found is compiled


def record(
    f,
    args,
    cuda_graphs=True,
    wrt=None,
    gradient=True,
    fallback=False,
    kwargs=None,
    fuse=False,
    cuda_fuse=None,
):
    """Run `f(*args, **kwargs)` (and its gradient) once, recording: `(program, the result of
    this run)`. `gradient` as in `compile`; `fuse` a host program's fusion, `cuda_fuse` a CuPy
    program's (None: `fuse`); keyword arguments are not differentiated. With
    `fallback`, a refusal that the run can go on from eagerly stops the recording there, and
    the run finishes eagerly: `(None, its result)`."""
    kwargs = kwargs or {}
    arrays = arrays_of((args, kwargs)) if kwargs else arrays_of(args)
    recorder = Recorder(arrays, lenient=fallback)
    with recording.recording(recorder):
        result = _traced_run(f, args, recorder, wrt, gradient, kwargs)
    if recorder.refused is None:
        pending = recorder.argument_writes(result, arrays)  # f's writes into its arguments
        try:
            program = Program(recorder, result, arrays, cuda_graphs, fuse)
            cuda_fuse = fuse if cuda_fuse is None else cuda_fuse
            if cuda_fuse and program.interpreted and cuda_target.applies(arrays):
                cuda_target.fuse(program, arrays, cuda_fuse == "exact")
        except RecordingError:
            if not fallback:
                raise
        else:
            _write_back(pending)
            plain = tree_map(_untraced, result)
            return program, program.handed_out(plain, arrays)
    _write_back(recorder.refused_writes(arrays))  # the run finished eagerly: its writes
    if isinstance(result, _Own):
        return None, _Own(tree_map(_untraced, result.val))
    return None, WithGradient(tree_map(_untraced, result.val), tree_map(_untraced, result.grad))


def _write_back(writes):
    """The recording run's writes into its arguments' arrays, made as eagerly: the caller's
    arrays hold what `f` wrote into them (a replay writes them at its end, `Program.run`)."""
    for array, value in writes:
        array[...] = value


def _untraced(v):
    return v.data if isinstance(v, TrackedArray) else v


def _traced_run(f, args, recorder, wrt=None, gradient=True, kwargs=None):
    """`withgradient(f, *args)` with everything traced, or `f`'s output (`gradient` False,
    or None and `f` took its own gradient: `_own_gradient`). The keyword arguments' arrays
    are traced as data, as the arguments outside `wrt` are."""
    chosen = _chosen(args, wrt, gradient)
    args, inputs, tracked_args = track_inputs(args, nest=False, chosen=chosen)
    if gradient is False:  # traced, but plain eagerly: layers stay in their inference mode
        recorder.tracked_as([x._node for x in inputs.values()], False)
    data_kwargs = _as_data(kwargs) if kwargs else None
    f = _with_keywords(f, data_kwargs)
    start, passes = len(recorder.steps), nesting.top_level_passes()
    copies = _data_copies(args, tracked_args, chosen, kwargs, data_kwargs)
    # the differentiated arguments are copies eagerly too, unless f takes its own gradient
    own_copies = _data_copies(args, tracked_args, ()) if gradient is not True else []
    if gradient:  # differentiated, as by withgradient: the passes f makes inside nest
        with nesting.inside():
            val = _called(f, tracked_args)
    else:
        val = _called(f, tracked_args)
    _refuse_changes(copies)
    inner = nesting.top_level_passes() > passes  # f ran a transform, unnested
    if gradient is False or (gradient is None and _own_gradient(f, val, recorder, start, inner)):
        _refuse_changes(own_copies)
        return _Own(val)
    loss = val[0] if isinstance(val, tuple) else val
    found = backprop(loss, inputs.values(), nest=False)
    return WithGradient(val, gradients_in_place(args, inputs, found, nest=False, chosen=chosen))


def _data_copies(args, tracked_args, chosen, kwargs=None, data_kwargs=None):
    """`containers` of the arguments outside `chosen` (and keywords) that f is given as
    copies while recording (eagerly, the caller's own): a change to one cannot be replayed."""
    found = []
    for i, (given, traced) in enumerate(zip(args, tracked_args)):
        if i not in chosen and traced is not given:
            found += containers(traced, f"at position {i}")
    for name, value in (data_kwargs or {}).items():
        if value is not kwargs[name]:
            found += containers(value, f"{name}=")
    return found


def _refuse_changes(copies):
    """Refuse the recording if f changed one of `_data_copies`' containers."""
    found = changed(copies)
    if found is not None:
        raise RecordingError(CONTAINER_CHANGED.format(*found))


def _chosen(args, wrt, gradient):
    """The positions of the arguments traced as parameters: `wrt`'s, less, for a function
    compiled without a gradient, the Python numbers (eagerly they stay numbers)."""
    chosen = positions(wrt, len(args))
    if gradient is False:
        chosen = frozenset(i for i in chosen if not _top_level_number(args[i]))
    return chosen


def _with_keywords(f, kwargs):
    """`f` with the keyword arguments `kwargs` given (`f` itself when there are none)."""
    if not kwargs:
        return f
    return functools.update_wrapper(functools.partial(f, **kwargs), f, updated=())


def _matched(args, kwargs):
    """What a matcher checks of a call: its positional arguments, or, with keyword arguments,
    those and the keywords in the order of their names, behind a mark that no positional call
    holds (the arrays in the order the signature finds them)."""
    if not kwargs:
        return args
    return (_KEYWORDS, args, {k: kwargs[k] for k in sorted(kwargs)})


def _top_level_number(x):
    """Whether `top_level` converts `x` or warns about it: such calls take the general path."""
    if type(x) in (int, float, complex):
        return True
    return isinstance(x, (list, tuple)) and any(type(v) is float for v in x)


def _holding(variants, arrays):
    """The first program of one signature whose guards hold for a call of `arrays` (None if
    none does)."""
    for guards, program in variants:
        if guards.holds(arrays):
            return program
    return None


def _called(f, tracked_args):
    """`f(*tracked_args)`; NumPy's own code on a traced argument (`labels.astype(...)`,
    `np.mean(batch)`: plain arrays eagerly) refused with the fix, not a TypeError."""
    try:
        return f(*tracked_args)
    except (TypeError, AttributeError) as error:
        if isinstance(error, (RecordingError, AsEagerly)) or "TrackedArray" not in str(error):
            raise
        raise RecordingError(
            f"tg.compile cannot record f: {type(error).__name__}: {error}. While recording, "
            "every array argument reaches f traced (integer labels and arguments outside wrt "
            "too, which are plain arrays eagerly); compute on them with tracker_gpu's "
            "functions (tg.astype, tg.mean, tg.take), or use tg.compile(f, fallback=True) to "
            "run f eagerly every time"
        ) from error


def _own_gradient(f, val, recorder, start, inner):
    """Whether an `f` compiled without `gradient=` takes its own gradient, as tg.compile once
    guessed from the backward passes `f` makes: it did, if it made one and returns that
    pass's loss first (`withgradient` then `optim.update`), or no tracked loss at all; the
    guess is deprecated, and warned. An `f` that called a transform (`inner`) and returns
    another loss is refused: `withgradient` would nest that transform, which this recording,
    made at top level, did not."""
    roots = {id(s.root) for s in recorder.steps[start:] if isinstance(s, Walk)}
    if not roots and not inner:
        return False
    loss = val[0] if isinstance(val, tuple) else val
    name = getattr(f, "__name__", "f")
    if not roots or (
        isinstance(loss, TrackedArray) and loss._node is not None and id(loss._node) not in roots
    ):
        raise RecordingError(
            f"tg.compile cannot tell what {name!r} returns: f makes a backward pass of its own "
            "(an inner gradient, tg.forward's pullback, tg.jvp) and returns another loss. Say "
            "it: tg.compile(f, gradient=True) differentiates f, its inner passes nested as "
            "withgradient nests them; gradient=False returns f's output as it is"
        )
    warnings.warn(
        f"tg.compile of {name!r} returns f's output as it is, guessing that f takes its own "
        "gradient (it makes a backward pass and returns its loss); say so with "
        "tg.compile(f, gradient=False): the guess is deprecated",
        DeprecationWarning,
        stacklevel=6,
    )
    return True


_LEAVES = VALUES | {np.ndarray}  # nothing to look into


def _prepared(x, memo):
    """`x` with each object that has a `__tracker_compile__` method replaced by what it returns
    (an optimiser's `Leaf` gives its step counts as 0-d arrays, so that a replay reads them
    rather than fixing them); each object once, so that what was shared stays shared; the
    containers around a replaced object rebuilt, the others kept."""
    kind = type(x)
    if kind in _LEAVES:
        return x
    hook = getattr(kind, "__tracker_compile__", None)
    if hook is not None:
        if id(x) not in memo:
            memo[id(x)] = hook(x)
        return memo[id(x)]
    if isinstance(x, dict):
        values = [_prepared(v, memo) for v in x.values()]
        changed = any(a is not b for a, b in zip(values, x.values()))
        return type(x)(zip(x.keys(), values)) if changed else x
    if isinstance(x, (tuple, list)):
        values = [_prepared(v, memo) for v in x]
        if not any(a is not b for a, b in zip(values, x)):
            return x
        return type(x)(*values) if hasattr(x, "_fields") else type(x)(values)
    fields = getattr(type(x), "__dataclass_fields__", None)
    if fields is None or isinstance(x, type):
        return x
    out = x
    for name in fields:
        value = getattr(x, name)
        new = _prepared(value, memo)
        if new is not value:
            out = shallow_copy(x) if out is x else out
            object.__setattr__(out, name, new)  # frozen dataclasses too
    return out


@dataclass
class _Own:
    """The output of a function that took its own gradient: returned as it is."""

    val: object


def _plain(result):
    """The result as a user gets it: plain values; gradients owning their memory."""
    if isinstance(result, _Own):
        return result.val
    hand_out = HandOut()
    grads = tree_map(lambda g: g if g is None else hand_out(g), result.grad)
    return WithGradient(result.val, grads)

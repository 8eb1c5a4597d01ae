"""The generated program's body made into Python functions of bounded size.

Python's `compile` of one function of a million lines takes time and memory that grow faster
than its length (and holds the whole syntax tree at once), so a long body is cut into chunks of
about CHUNK_LINES lines, each compiled on its own. A chunk is `chunk(E)`: the values that cross
a cut live in the dict `E` between chunks, keyed by their names. Each local name is bound from
its first mention to its last (`codegen.py` never binds a name again once deleted), so a name
mentioned in several chunks is stored into `E` at the end of each chunk that mentions it and
needs it later, loaded at the start of each later chunk that mentions it, and popped by the
last one (whose `del` then frees it): the work is linear in the number of mentions. A body of
one chunk stays one function, `run(*arrays)`, as fast as before.
"""

import re

__all__ = ["CHUNK_LINES", "link"]

# Lines per chunk: small enough that compiling is linear and its peak memory bounded, large
# enough that a replay's calls between chunks cost nothing measurable.
CHUNK_LINES = 2000

_NAMES = re.compile(r"\b(?:[vx]\d+|g\d+(?:_\d+)?)\b")  # values, contexts, gradients


def link(body, cuts, params, outputs, is_local, namespace):
    """`(run, source)`: `run(*params)` returning the values of `outputs` (names) as a tuple.
    `body` are the lines at one indent, `cuts` the line counts after which a cut is allowed,
    `is_local(name)` whether a name is a local (not a global of `namespace`). `source` is the
    whole text for a single function, else None (not kept: it is as long as the program)."""
    result = f"    return ({''.join(f'{name}, ' for name in outputs)})"
    pieces = _pieces(body, cuts)
    if len(pieces) <= 1:
        source = "\n".join([f"def run({', '.join(params)}):", *body, result]) + "\n"
        exec(compile(source, "<tg.compile>", "exec"), namespace)
        return namespace["run"], source
    body.clear()  # the pieces hold the text
    mentions = [_mentioned(text, is_local) for text in pieces]
    first, last = _spans(mentions, params)
    kept = {name for name in outputs if is_local(name)}
    chunks = []
    for k, names in enumerate(mentions):
        chunks.append(_chunk(pieces[k], names, k, first, last, kept, namespace))
        pieces[k] = mentions[k] = None  # compiled: its text goes
    returned = ", ".join(f"E[{n!r}]" if n in kept else n for n in outputs)
    driver = (f"def run({', '.join(params)}):\n"
              f"    E = {{{', '.join(f'{p!r}: {p}' for p in params)}}}\n"
              "    for chunk in CHUNKS:\n        chunk(E)\n"
              f"    return ({returned}{',' if outputs else ''})\n")  # fmt: skip
    namespace["CHUNKS"] = tuple(chunks)
    exec(compile(driver, "<tg.compile>", "exec"), namespace)
    return namespace["run"], None


def _pieces(body, cuts):
    """The body as texts of about CHUNK_LINES lines each, cut only where allowed."""
    pieces, start = [], 0
    for cut in cuts:
        if cut - start >= CHUNK_LINES:
            pieces.append("\n".join(body[start:cut]))
            start = cut
    if start < len(body) or not pieces:
        pieces.append("\n".join(body[start:]))
    return pieces


def _mentioned(text, is_local):
    return [name for name in set(_NAMES.findall(text)) if is_local(name)]


def _spans(mentions, params):
    """The first and last piece that mentions each local name (-1: an argument)."""
    first, last = dict.fromkeys(params, -1), dict.fromkeys(params, -1)
    for k, names in enumerate(mentions):
        for name in names:
            first.setdefault(name, k)
            last[name] = k
    return first, last


def _chunk(text, names, k, first, last, kept, namespace):
    head = [f"    {n} = E.pop({n!r})" if last[n] == k and n not in kept else f"    {n} = E[{n!r}]"
            for n in names if first[n] < k]  # fmt: skip
    tail = [f"    E[{n!r}] = {n}" for n in names if last[n] > k or n in kept]
    source = "\n".join(["def chunk(E):", *head, text, *tail, "    return None"]) + "\n"
    exec(compile(source, "<tg.compile>", "exec"), namespace)
    return namespace.pop("chunk")

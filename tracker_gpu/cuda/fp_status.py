"""Floating-point exceptions of the code built for the host (fused loops, row loops, native
optimiser steps), reported as NumPy reports them.

A NumPy call reads the processor's exception flags after its loop and warns or raises as its
settings ask (`np.errstate`, `np.seterr`). Code built here computes the same operations, so it
raises the same flags, but nothing read them: each such function now clears the flags before its
work and returns them after (`STATUS`, as the bits of `NAMED`: the C library's own values differ
between platforms), and where `reported` says NumPy's settings do not ignore one, the caller
raises `Flagged` and its guard runs NumPy's own operations, which warn or raise as they would.

>>> import numpy as np
>>> with np.errstate(over="ignore"):
...     reported(2)
False
>>> with np.errstate(over="raise"):
...     reported(2)
True
"""

import numpy as np

__all__ = ["Flagged", "NAMED", "STATUS", "reported"]

STATUS = r"""#include <fenv.h>
#define TG_FP_ALL (FE_DIVBYZERO | FE_OVERFLOW | FE_UNDERFLOW | FE_INVALID)
static inline int tg_fp_status(void) {
    const int f = fetestexcept(TG_FP_ALL);
    return (f & FE_DIVBYZERO ? 1 : 0) | (f & FE_OVERFLOW ? 2 : 0) | (f & FE_UNDERFLOW ? 4 : 0)
        | (f & FE_INVALID ? 8 : 0);
}
"""
NAMED = ((1, "divide"), (2, "over"), (4, "under"), (8, "invalid"))  # as np.geterr names them


class Flagged(Exception):
    """Code built for the host raised a floating-point exception that NumPy's settings do not
    ignore: its guard runs NumPy's operations instead (the values are the same)."""


def reported(status):
    """Whether NumPy's settings would report one of the exceptions of `status` (not ignore it)."""
    modes = np.geterr()
    return any(status & bit and modes[name] != "ignore" for bit, name in NAMED)

"""How close each tight float check comes to failing: a pytest plugin for auditing tolerances.

    PYTHONPATH=tests python -m pytest -q -p tolerance_margins -m "not slow" tests/
    OPENBLAS_CORETYPE=Prescott NPY_DISABLE_CPU_FEATURES="X86_V3 X86_V4 AVX512_ICL AVX512_SPR" \
        PYTHONPATH=tests python -m pytest -q -p tolerance_margins -m "not slow" tests/

Every np.testing.assert_allclose and math.isclose with both tolerances at or below 1e-9 records
its ratio err / (atol + rtol |desired|) (1.0 = at the edge); the session ends with the closest
calls and writes all of them to $MARGINS_OUT (tolerance_margins.json). Run it under several
kernels and keep every ratio under 0.1, a tenfold margin (docs/decisions.md, "Tolerances from
measurement"). Not a test: it checks nothing by itself.
"""
import json
import math
import os

import numpy as np
import numpy.testing
import pytest

RATIOS = {}                      # test id -> (largest ratio, rtol, atol)
_current = [None]
_assert_allclose, _isclose = numpy.testing.assert_allclose, math.isclose


def _record(ratio, rtol, atol):
    if _current[0] is not None and np.isfinite(ratio) and ratio > RATIOS.get(_current[0], (-1,))[0]:
        RATIOS[_current[0]] = (float(ratio), rtol, atol)


def assert_allclose(actual, desired, rtol=1e-7, atol=0, *args, **kwargs):
    if max(rtol, atol) <= 1e-9:
        try:
            a, d = np.asarray(actual, dtype=float), np.asarray(desired, dtype=float)
            err, tol = np.abs(a - d), atol + rtol * np.abs(d)
            with np.errstate(all="ignore"):
                ratio = np.where(tol > 0, err / np.where(tol > 0, tol, 1.0), np.where(err > 0, np.inf, 0.0))
            ratio = ratio[np.isfinite(ratio)]
            if ratio.size:
                _record(ratio.max(), rtol, atol)
        except (TypeError, ValueError):
            pass                 # not numbers: the real assertion below says so
    return _assert_allclose(actual, desired, rtol, atol, *args, **kwargs)


def isclose(a, b, *, rel_tol=1e-9, abs_tol=0.0):
    tol = max(rel_tol * max(abs(a), abs(b)), abs_tol)
    if max(rel_tol, abs_tol) <= 1e-9 and tol > 0:
        _record(abs(a - b) / tol, rel_tol, abs_tol)
    return _isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


numpy.testing.assert_allclose = np.testing.assert_allclose = assert_allclose
math.isclose = isclose


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _current[0] = item.nodeid
    yield
    _current[0] = None


def pytest_terminal_summary(terminalreporter):
    closest = sorted(RATIOS.items(), key=lambda kv: -kv[1][0])[:15]
    terminalreporter.section("closest to their tolerance (ratio 1.0 fails)")
    for test, (ratio, rtol, atol) in closest:
        terminalreporter.write_line(f"{ratio:7.3f}  rtol={rtol:g} atol={atol:g}  {test}")
    with open(os.environ.get("MARGINS_OUT", "tolerance_margins.json"), "w") as f:
        json.dump(RATIOS, f, indent=1, sort_keys=True)

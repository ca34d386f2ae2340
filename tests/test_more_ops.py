"""nanospa/more_ops.py: the ops kept for users' own equations (the model calls none of them).

Every op against float64 central differences (full Jacobian, random upstream gradient) and
float32 in -> float32 out, like the engine's own ops (tests/test_functions.py).
"""
import numpy as np
import pytest

from conftest import assert_full_jacobian, assert_keeps_float32
from nanospa import Tensor
from nanospa import more_ops as M

R = np.random.default_rng(1)
COND = R.standard_normal((3, 4)) > 0


def normal(*shape):
    return R.standard_normal(shape)


def positive(*shape):
    return R.uniform(0.5, 2.0, shape)


def distinct(*shape):
    """Entries at least 0.1 apart, so no central difference crosses a tie of max."""
    return R.permutation(np.arange(np.prod(shape)) * 0.1 - 1.0).reshape(shape)


OPS = {
    "exp": (M.exp, [normal(3, 4)]),
    "log": (M.log, [positive(3, 4)]),
    "sqrt": (M.sqrt, [positive(3, 4)]),
    "max_axis": (lambda a: M.max(a, axis=1), [distinct(2, 5, 3)]),
    "max_all_keepdims": (lambda a: M.max(a, keepdims=True), [distinct(4, 3)]),
    "where": (lambda a, b: M.where(COND, a, b), [normal(3, 4), normal(4)]),
    "concatenate": (lambda a, b: M.concatenate([a, b, a], axis=1), [normal(2, 3), normal(2, 2)]),
    "split": (lambda a: M.split(a, [1, 3], axis=1)[1] * 2.0 + M.split(a, 2, axis=0)[0].sum(), [normal(2, 4)]),
    "activation_softplus": (lambda a: M.activation(a, "softplus"), [normal(3, 4) * 3]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_full_jacobian(name):
    assert_full_jacobian(*OPS[name])


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_float32_in_float32_out(name):
    assert_keeps_float32(name, *OPS[name])


def test_max_shares_a_tie_equally():
    x = Tensor(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]]), requires_grad=True)
    M.max(x, axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 0.5, 0.5], [1, 0, 0]])


def test_split_refuses_sizes_that_do_not_add_up():
    with pytest.raises(ValueError, match=r"sizes \[1, 2\] do not add up to 4"):
        M.split(Tensor(normal(2, 4)), [1, 2], axis=1)
    with pytest.raises(ValueError, match="does not divide into 3 parts"):
        M.split(Tensor(normal(2, 4)), 3, axis=1)


def test_where_needs_a_tensor():
    with pytest.raises(TypeError, match="a or b must be a Tensor"):
        M.where(COND, normal(3, 4), normal(3, 4))


def test_the_model_calls_none_of_them():
    """more_ops is for users' equations and the extensions' (beyond/norms.py's DyT calls its
    tanh): no file of the paper's path, nanospa/*.py and signal/, imports it."""
    import pathlib
    import re
    root = pathlib.Path(M.__file__).parent
    imports = re.compile(r"^\s*(from\s+\S*more_ops\s+import|from\s+\S+\s+import\s+.*\bmore_ops\b|import\s+\S*more_ops)", re.M)
    core = [*root.glob("*.py"), *(root / "signal").rglob("*.py")]
    users = [p for p in core if p.name != "more_ops.py" and imports.search(p.read_text())]
    assert len(core) > 20 and users == []

"""Tests for nanospa/config.py: GPTConfig's validation on construction (one ValueError naming
the field and the allowed values), its derived properties and its dict round trip."""
from dataclasses import fields

import numpy as np
import pytest

from nanospa.beyond import values
from nanospa.config import BASE_ACTIVATIONS, DTYPES, NORM_POSITIONS, GPTConfig
from nanospa.signal import BUDGETS

ATTENTIONS, RESIDUALS, NORMS, POSITIONS = (values(f) for f in ("attention", "residual", "norm", "pos"))


@pytest.mark.parametrize("field,value,message", [
    ("attention", "linear", "attention='linear' is not one of"),
    ("activation", "swishy", "activation='swishy' is not one of"),
    ("residual", "skip", "residual='skip'"),
    ("norm", "instancenorm", "norm='instancenorm'"),      # not offered: not causal (docs/norms.md)
    ("norm_position", "middle", "norm_position='middle'"),
    ("final_norm", "maybe", "final_norm='maybe'"),
    ("pos", "rotary", "pos='rotary' is not one of"),
    ("dtype", "float16", "dtype='float16'"),
    ("kernel_budget", "magic", "kernel_budget='magic'"),
    ("n_layer", 0, "n_layer must be a positive integer"),
    ("n_embd", -4, "n_embd must be a positive integer"),
    ("block_size", 2.0, "block_size must be a positive integer"),
    ("n_head", True, "n_head must be a positive integer"),            # bool is not an int here
    ("n_head", 3, "not divisible by n_head=3"),
    ("residual_beta", 1.5, "residual_beta must be in"),
    ("residual_beta", 0.0, "residual_beta must be in"),
    ("rho_final", 1.0, "rho_final must be in"),
    ("gamma_final", -0.1, "gamma_final must be > 0"),
    ("final_corr", 1.0, "final_corr must be in"),
    ("eta", 1.0, "eta must be in"),
    ("zeta", 0.5, "zeta must be > 1"),
    ("tau", 0.0, "tau must be > 0"),
    ("shaping_depth", -1, "shaping_depth must be >= 0"),
    ("block_size", 1, "block_size=1 is too small for attention='espa': SPA shapes the correlations"),
])
def test_invalid_config_fields(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        GPTConfig(**{field: value})


def test_block_size_one_names_block_size_not_the_schedule():
    """T = 1 has no correlation between positions for U-SPA / E-SPA to shape; the error names
    the setting the user wrote (it used to blame gamma_final or rho_final, never set)."""
    for attention in ("espa", "uspa"):
        with pytest.raises(ValueError, match=f"^GPTConfig.block_size=1 is too small for attention='{attention}'"):
            GPTConfig(block_size=1, attention=attention)
    for attention in ("softmax", "value_skipinit"):
        GPTConfig(block_size=1, attention=attention)            # no SPA schedule: fine
    GPTConfig(block_size=2, attention="espa")


def test_error_lists_the_allowed_values():
    with pytest.raises(ValueError) as e:
        GPTConfig(attention="flash")
    assert str(e.value) == f"GPTConfig.attention='flash' is not one of {list(ATTENTIONS)}"
    with pytest.raises(ValueError) as e:
        GPTConfig(activation="swishy")
    assert "'tat_lrelu'" in str(e.value) and "'relu'" in str(e.value)   # plain and shaped names


NEEDS = {("residual", "deepnorm"): dict(norm="layernorm", norm_position="post"),   # docs/residuals.md
         ("residual", "ngpt"): dict(attention="softmax", activation="swish")}


def test_every_listed_choice_is_accepted():
    for name, allowed in (("attention", ATTENTIONS), ("residual", RESIDUALS), ("norm", NORMS),
                          ("norm_position", NORM_POSITIONS), ("pos", POSITIONS), ("dtype", DTYPES),
                          ("kernel_budget", BUDGETS), ("activation", BASE_ACTIVATIONS)):
        for value in allowed:                            # spa_prior: E-SPA's B_l for attention without one
            companions = NEEDS.get((name, value), {})     # choices that refuse the defaults' fields
            companions = {"attention": "softmax"} if (name, value) == ("pos", "spa_prior") else companions
            assert getattr(GPTConfig(**{name: value}, **companions), name) == value
    for shaped in ("tat_lrelu", "dks_gelu", "tat_gelu"):
        GPTConfig(activation=shaped)
    assert GPTConfig(n_layer=np.int64(3)).n_layer == 3                 # numpy integers are integers


def test_derived_properties():
    assert GPTConfig(n_embd=128, n_head=4).head_size == 32
    # auto: a final norm only with a norm and a residual stream (Pre-LN style)
    assert GPTConfig(norm="layernorm", residual="standard").uses_final_norm
    assert not GPTConfig(norm="layernorm", residual="none").uses_final_norm
    assert not GPTConfig(norm="none", residual="standard").uses_final_norm
    assert GPTConfig(final_norm="yes").uses_final_norm
    assert not GPTConfig(norm="rmsnorm", residual="normalised", final_norm="no").uses_final_norm


def test_dict_round_trip():
    cfg = GPTConfig(n_layer=3, attention="uspa", activation="dks_gelu", pos="learned")
    d = cfg.to_dict()
    assert d["n_layer"] == 3 and d["attention"] == "uspa" and len(d) == len(GPTConfig().to_dict())
    assert GPTConfig.from_dict(d) == cfg
    assert GPTConfig.from_dict(dict(d, unknown_key=1)) == cfg           # extra keys are ignored
    assert GPTConfig.from_dict({"n_layer": 5}) == GPTConfig(n_layer=5)


@pytest.mark.parametrize("name", [f.name for f in fields(GPTConfig) if f.type is float])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), "0.5"])
def test_every_float_field_must_be_a_finite_number(name, value):
    """nan passed the range checks written as x <= 1 or x < 0 (zeta, tau, gamma_final): from
    Python every float field is now checked for a finite number, as the command line is."""
    with pytest.raises(ValueError, match=rf"^GPTConfig.{name} must be a finite number, got"):
        GPTConfig(**{name: value})

"""The golden run (tests/golden.py): float64 losses, parameter checksums, kernel-budget plans
and the signal command's text, recorded before the architecture redesign, reproduced to
1e-12. When behaviour is meant to change, rerun `python tests/golden.py --write` and say why
in the commit."""
import pytest
import json

import golden

pytestmark = pytest.mark.slow       # the full suite only: python -m pytest -m 'not slow' skips it


def test_golden_run_reproduced():
    ref = json.loads(golden.GOLDEN.read_text())
    diffs = golden.differences(ref, golden.record())
    assert not diffs, "\n".join(diffs[:20])


def test_golden_comparison_catches_a_change():
    ref = json.loads(golden.GOLDEN.read_text())
    new = json.loads(golden.GOLDEN.read_text())
    key = next(iter(new["models"]))
    new["models"][key]["losses"][-1] *= 1 + 1e-10
    text_key = next(iter(new["signal"]))
    new["signal"][text_key]["text"] = new["signal"][text_key]["text"].replace("0.5586", "0.5587", 1)
    diffs = golden.differences(ref, new)
    assert any("losses" in d for d in diffs) and any("printed" in d for d in diffs)

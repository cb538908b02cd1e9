"""`python -m torchops.demo` (make demo) runs to a verdict for any step count: --steps 0 compares the initial
losses (it used to divide by zero), --steps 1 judges the loss after the step (it used to report FAILED)."""

from __future__ import annotations

import contextlib
import importlib.util
import io

import pytest

from torchops import demo

pytestmark = pytest.mark.slow  # compiles three models

# The fourth section (a transformers LLaMA, patched and not) runs where transformers is installed.
SECTIONS = 3 + (importlib.util.find_spec("transformers") is not None)


@pytest.mark.parametrize("steps", [0, 1])
def test_demo_runs_with_few_steps(steps: int) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = demo.main(["--device", "cpu", "--steps", str(steps)])
    text = out.getvalue()
    assert status == 0, text
    assert "FAILED" not in text and text.rstrip().endswith("all agree"), text
    assert text.count("losses agree: yes") == SECTIONS, text
    assert text.count("loss went down: yes") == (SECTIONS if steps else 0), text


def test_demo_refuses_negative_steps(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        demo.main(["--steps", "-1"])
    assert e.value.code == 2 and "--steps must be at least 0" in capsys.readouterr().err

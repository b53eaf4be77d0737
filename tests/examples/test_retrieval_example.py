"""examples/retrieval.py end to end: its test Recall@20 reaches 0.9 of the
hidden teacher's, its served top-20 over HTTP equals the model's, and its
last line is the one the docs promise."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # trains for a minute or two in a fresh interpreter

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "retrieval.py"


def test_the_example_reaches_nine_tenths_of_the_teacher():
    environment = {**os.environ, "PYTHONPATH": str(EXAMPLE.parents[1])}
    result = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                            timeout=1200, env=environment, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "served top-20 of 8 users over HTTP equals the model's" in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"recall_at_20=(\d\.\d+) teacher_recall_at_20=(\d\.\d+)", last)
    assert found, last
    recall, teacher = map(float, found.groups())
    assert teacher == pytest.approx(0.318, abs=1e-3)
    assert recall >= 0.9 * teacher, (recall, teacher)

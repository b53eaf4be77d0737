import dataclasses

import pytest

# reckeras selects Keras's torch backend; import it before any test module
# imports keras (Keras reads its backend once, at first import).
import reckeras  # noqa: F401
from reckeras import config


@pytest.fixture(autouse=True)
def _options_restored():
    # A test that changes rk.config's options leaves them as it found them.
    saved = config.options()
    yield
    config.set(**dataclasses.asdict(saved))

import pytest

import reckeras.datasets as rkd


@pytest.fixture(scope="session")
def small_synth(tmp_path_factory):
    """A generated criteo_synth file with three row groups (last one short)."""
    path = tmp_path_factory.mktemp("synth") / "small.parquet"
    return rkd.generate("criteo_synth", 2 * 65_536 + 1_000, path, split="test")

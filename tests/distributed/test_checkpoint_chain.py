"""Delta chains saved on N ranks load on M: the chain's state equals a full
checkpoint of the same step, every key on its owner, for 1 -> 2, 2 -> 1,
2 -> 2 and a chain whose links come from different world sizes; a truncated
delta file fails the load on both ranks and changes nothing."""

import json
import shutil

import pytest
from safetensors.numpy import load_file

from launch import torchrun

pytestmark = pytest.mark.slow  # spawns torchrun processes


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("chains")
    for ranks in (1, 2):
        torchrun("checkpoint_chain.py", ranks, "save", root / f"on{ranks}")
    return root


def compare(ranks, chain, full, out):
    torchrun("checkpoint_chain.py", ranks, "compare", chain, full, out)
    return json.loads(out.read_text())


@pytest.mark.parametrize("saved_on, loaded_on", [(1, 2), (2, 1), (2, 2)])
def test_a_chain_loads_on_any_number_of_ranks_as_the_full_checkpoint(saved, saved_on,
                                                                       loaded_on, tmp_path):
    root = saved / f"on{saved_on}"
    index = json.loads((root / "delta3" / "index.json").read_text())
    assert index["kind"] == "delta" and index["world_size"] == saved_on
    # The lifecycle freed rows between the saves: the deltas delete keys.
    assert sum(array.size for name in index["table_files"]
               for key, array in load_file(str(root / "delta3" / name)).items()
               if key.endswith(".deleted")) > 0
    result = compare(loaded_on, root / "delta3", root / "full3", tmp_path / "out.json")
    assert result["same"] and result["links"] == 3 and result["rows"] > 0
    assert len(result["rows_per_rank"]) == loaded_on and min(result["rows_per_rank"]) > 0


def test_a_chain_of_links_saved_on_different_world_sizes_loads(saved, tmp_path):
    # 1-rank full and deltas, then a 2-rank delta on top; loaded on 1 rank.
    torchrun("checkpoint_chain.py", 2, "extend", saved / "on1" / "delta3", tmp_path)
    index = json.loads((tmp_path / "delta4" / "index.json").read_text())
    assert index["world_size"] == 2 and index["base"]["path"].endswith("delta3")
    result = compare(1, tmp_path / "delta4", tmp_path / "full4", tmp_path / "out.json")
    assert result["same"] and result["links"] == 4


def test_a_truncated_delta_file_fails_the_load_on_every_rank(saved, tmp_path):
    for name in ("full1", "delta2", "delta3"):
        shutil.copytree(saved / "on2" / name, tmp_path / name)
    torchrun("checkpoint_chain.py", 2, "truncated", tmp_path / "delta3", tmp_path / "rank")
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["error"] == "CheckpointError" and report["unchanged"], report
        assert report["file"] in report["message"] and "truncated" in report["message"]
    # Rank 1 reads its own file (the damaged one); rank 0 hears of it.
    assert "rank 1 of 2 could not load it" in reports[0]["message"]

"""The h2d stage (`device_copy`): on a GPU, pipelined training with the
copy and the packing on its own stream equals the same stages run inline;
here (no GPU) the stage refuses a CPU device and items no stage copied pass
`ready` as they are."""

import numpy as np
import pytest
import torch

from reckeras.pipeline.device_copy import DeviceCopy, ready, wait_for_copy
from reckeras.pipeline.stream import PreparedBatch


def test_items_not_copied_pass_unchanged():
    item = PreparedBatch(3, {"a": torch.arange(3)}, torch.ones(3), None)
    assert ready(item) is item
    assert wait_for_copy(item) is item


def test_refuses_a_device_other_than_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        DeviceCopy("cpu", pack=lambda batch: batch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pipelined_gpu_fit_equals_inline_fit():
    from test_model import build, snapshot, synthetic
    results = {}
    for pipeline in (True, False):
        model = build(seed=2)
        model.fit(synthetic(1200), batch_size=200, epochs=2, verbose=0, shuffle=True,
                  seed=1, pipeline=pipeline)
        assert "h2d" in model.pipeline_stats
        assert model.pipeline_stats["h2d"]["items"] == 12
        results[pipeline] = snapshot(model)
    for threaded, inline in zip(results[True][0], results[False][0]):
        np.testing.assert_array_equal(threaded, inline)
    # The same rows by key: the two runs may number the rows differently (the
    # pipelined run resolves a batch's new keys ahead of the step).
    for threaded, inline in zip(results[True][1], results[False][1]):
        by_key = np.argsort(threaded["keys"]), np.argsort(inline["keys"])
        rows = len(threaded["keys"])
        for key in threaded:
            a, b = np.asarray(threaded[key]), np.asarray(inline[key])
            if a.ndim and len(a) == rows:
                a, b = a[by_key[0]], b[by_key[1]]
            np.testing.assert_array_equal(a, b, err_msg=key)

"""Packaged demo datasets, synthetic generators and real-format readers.

`criteo_synth` ships inside the package: a Criteo-like click log whose labels
come from a hidden teacher, so the Bayes-optimal test AUC is known
(`Dataset.bayes_auc`). `generate` writes larger splits from the same teacher;
`from_parquet`, `from_orc`, `from_csv` and `criteo_tsv` read your own files,
local or on any pyarrow filesystem, with hive partitions (`dt=2026-11-30/`)
as columns. Every reader returns a `Dataset` that streams fixed-size
`pyarrow.RecordBatch`es, shuffled and sharded on request; `Dataset.windows`
cuts partitioned data into time windows, in order. `generate("criteo_stream",
...)` writes a daily log whose teacher drifts, one partition per day.

For retrieval, `retrieval_synth` holds implicit feedback whose teacher's
Recall@K is known (`Dataset.teacher_recall`), `from_user_lines` reads the
`user item item ...` files of the open matching benchmarks, `split_per_user`
holds out part of each user's interactions and `user_items` gives each
user's items as the padded matrix the retrieval metrics take.

This package depends on nothing else of reckeras.

Example:

```python
import reckeras as rk

train = rk.datasets.load("criteo_synth", split="train")
test = rk.datasets.load("criteo_synth", split="test")
for batch in train.batches(4096, shuffle=True, seed=0):
    labels = batch.column("label")
test.bayes_auc()  # 0.8466..., the AUC a perfect model would reach
stream = rk.datasets.generate("criteo_stream", path="/tmp/stream", days=7)
days = stream.windows("dt")   # one Dataset per day, in date order
```
"""

from reckeras.datasets._criteo_tsv import criteo_tsv
from reckeras.datasets._csv import from_csv
from reckeras.datasets._dataset import Dataset
from reckeras.datasets._orc import from_orc
from reckeras.datasets._parquet import from_parquet
from reckeras.datasets._registry import generate, list, load  # noqa: A004 - rk.datasets.list
from reckeras.datasets._user_lines import from_user_lines
from reckeras.datasets._user_splits import split_per_user, user_items
from reckeras.datasets.taobao import taobao_user_behavior

__all__ = ["Dataset", "criteo_tsv", "from_csv", "from_orc", "from_parquet",
           "from_user_lines", "generate", "list", "load", "split_per_user",
           "taobao_user_behavior", "user_items"]

"""rk.Model.fit takes the new readers' datasets unchanged (issue 14, item 5):
a CSV with a list column, and hive-partitioned parquet whose partition
value is a feature."""

import csv

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import reckeras as rk
import reckeras.datasets as rkd

GENRES = np.array(["Action", "Comedy", "Drama", "Horror", "Romance"])


def compile_dlrm(features, seed=0):
    keras.utils.set_random_seed(seed)
    columns = rk.layers.FeatureColumns(features)
    model = rk.models.dlrm(columns, bottom_units=(16, 8), top_units=(32, 1),
                           dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.1),
                  metrics=[rk.metrics.AUC()])
    return model


@pytest.mark.slow
def test_fit_on_csv_with_a_list_column(tmp_path):
    rng = np.random.default_rng(0)
    rows = 3000
    n = rng.normal(size=rows)
    movie = rng.integers(0, 50, rows)
    genres = [list(rng.choice(GENRES, rng.integers(1, 4), replace=False))
              for _ in range(rows)]
    # Clicks follow "Drama" among the genres and the numeric column.
    logit = 2.5 * np.array(["Drama" in g for g in genres]) - 1.2 + n
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    for part in range(2):
        with open(tmp_path / f"part-{part}.csv", "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["label", "n", "movie", "genres"])
            for i in range(part * rows // 2, (part + 1) * rows // 2):
                writer.writerow([label[i], n[i], movie[i], "|".join(genres[i])])
    data = rkd.from_csv(tmp_path, column_types={
        "n": pa.float32(), "genres": pa.list_(pa.string())})
    model = compile_dlrm([
        rk.features.Numeric("n"), rk.features.Categorical("movie", dim=8),
        rk.features.Sequence("genres", dim=8, max_len=3, combiner="mean",
                             dtype="string")])
    history = model.fit(data, batch_size=128, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    logs = model.evaluate(data, batch_size=500, verbose=0, return_dict=True)
    assert logs["auc"] > 0.75
    assert model.predict(data, batch_size=500).shape == (rows, 1)


@pytest.mark.slow
def test_fit_on_hive_partitions_with_the_partition_as_a_feature(tmp_path):
    rng = np.random.default_rng(1)
    days = ["2026-11-29", "2026-11-30", "2026-12-01"]
    # Only the day and the numeric column carry signal.
    day_effect = {"2026-11-29": -2.0, "2026-11-30": 0.0, "2026-12-01": 2.0}
    for day in days:
        for part in range(2):
            rows = 600
            n = rng.normal(size=rows).astype(np.float32)
            logit = day_effect[day] + 0.5 * n
            label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
            directory = tmp_path / "logs" / f"dt={day}"
            directory.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"label": label, "n": n,
                                     "item": rng.integers(0, 30, rows)}),
                           directory / f"part-{part}.parquet",
                           row_group_size=256)
    data = rkd.from_parquet(tmp_path / "logs")
    assert data.schema.field("dt").type == pa.string()

    def fitted(features):
        model = compile_dlrm([rk.features.Numeric("n"),
                              rk.features.Categorical("item", dim=8), *features])
        model.fit(data, batch_size=128, epochs=3, verbose=0)
        return model.evaluate(data, batch_size=600, verbose=0,
                              return_dict=True)["auc"]

    with_day = fitted([rk.features.Categorical("dt", dim=8, dtype="string")])
    without_day = fitted([])
    # The day's effect (+-2 on the logit) is learned from the dt column.
    assert with_day > 0.8
    assert with_day > without_day + 0.1

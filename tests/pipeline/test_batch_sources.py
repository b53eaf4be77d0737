"""fit/evaluate/predict read a keras.utils.PyDataset and a torch DataLoader
batch by batch, as Keras does: each compared with the same batches given in
memory (a dict of arrays at the same batch size, not shuffled)."""

import keras
import numpy as np
import pytest
import torch

import reckeras as rk
from reckeras.pipeline.batch_sources import SourceBatches
from test_model import assert_same, build, snapshot, synthetic

BATCH = 250


def columns_of(table):
    x = {name: table.column(name).to_numpy() for name in ("n", "a", "b")}
    return x, table.column("label").to_numpy()


class Batches(keras.utils.PyDataset):
    """The rows in batches of BATCH: `(x, y)`, or `(x, y, w)` with weights."""

    def __init__(self, x, y, weights=None, infinite=False):
        super().__init__()
        self.x, self.y, self.weights, self.infinite = x, y, weights, infinite
        self.read, self.epochs_ended = [], 0

    @property
    def num_batches(self):
        return None if self.infinite else -(-len(self.y) // BATCH)

    def __getitem__(self, index):
        self.read.append(index)
        rows = slice(BATCH * index, BATCH * (index + 1))
        item = ({k: v[rows] for k, v in self.x.items()}, self.y[rows])
        return item if self.weights is None else (*item, self.weights[rows])

    def on_epoch_end(self):
        self.epochs_ended += 1


class Rows(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.x.items()}, self.y[i]


@pytest.fixture(scope="module")
def data():
    return columns_of(synthetic(1000))


def test_a_py_dataset_trains_as_the_same_batches_in_memory(data):
    x, y = data
    source = Batches(x, y)
    from_source = build()
    history = from_source.fit(source, epochs=2, shuffle=False, verbose=0)
    in_memory = build()
    expected = in_memory.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert_same(snapshot(from_source), snapshot(in_memory))
    assert history.history == expected.history
    assert source.epochs_ended == 2
    assert from_source.evaluate(source, verbose=0) == \
        in_memory.evaluate(x, y, batch_size=BATCH, verbose=0)
    np.testing.assert_array_equal(from_source.predict(source, verbose=0),
                                  in_memory.predict(x, batch_size=BATCH, verbose=0))


def test_a_data_loader_of_tensors_trains_as_the_same_batches_in_memory(data):
    x, y = data
    loader = torch.utils.data.DataLoader(Rows(x, y), batch_size=BATCH)
    from_loader = build()
    from_loader.fit(loader, epochs=1, verbose=0, validation_data=loader)
    in_memory = build()
    in_memory.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_same(snapshot(from_loader), snapshot(in_memory))


def test_weights_and_outputs_in_the_batches(data):
    x, y = data
    weights = np.linspace(0.0, 2.0, len(y)).astype(np.float32)
    from_source = build()
    from_source.fit(Batches(x, y, weights), epochs=1, shuffle=False, verbose=0)
    in_memory = build()
    in_memory.fit(x, y, sample_weight=weights, batch_size=BATCH, epochs=1, shuffle=False,
                  verbose=0)
    assert_same(snapshot(from_source), snapshot(in_memory))
    with pytest.raises(ValueError, match="class_weight and sample_weight"):
        build().fit(Batches(x, y, weights), class_weight={0: 1.0, 1: 2.0}, verbose=0)


def test_a_shuffled_py_dataset_reads_each_batch_once_an_epoch_in_a_new_order(data):
    x, y = data
    source = Batches(x, y)
    build().fit(source, epochs=3, shuffle=True, verbose=0)
    # Its first batch is read once up front, to find its layout.
    epochs = [source.read[1 + 4 * e:5 + 4 * e] for e in range(3)]
    assert all(sorted(order) == [0, 1, 2, 3] for order in epochs), source.read
    assert len({tuple(order) for order in epochs}) > 1, epochs


def test_an_infinite_py_dataset_takes_steps_per_epoch(data):
    x, y = data
    with pytest.raises(ValueError, match="has no length: pass steps_per_epoch"):
        build().fit(Batches(x, y, infinite=True), verbose=0)
    steps = []
    counted = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: steps.append(b))
    history = build().fit(Batches(x, y, infinite=True), epochs=2, steps_per_epoch=3,
                          verbose=0, callbacks=[counted])
    assert len(history.history["loss"]) == 2 and steps == [0, 1, 2, 0, 1, 2]


def test_a_batch_laid_out_unlike_the_first_is_named(data):
    x, y = data

    class Mixed(Batches):
        def __getitem__(self, index):
            x, y = super().__getitem__(index)
            return (x, y) if index == 0 else (x,)

    with pytest.raises(rk.features.FeatureInputError,
                       match="batch 1 of the Mixed is laid out unlike its first batch"):
        build().fit(Mixed(x, y), shuffle=False, verbose=0)

    class NotABatch(Batches):
        def __getitem__(self, index):
            return 3

    with pytest.raises(ValueError, match=r"batch 0 of the NotABatch must be x, \(x,\)"):
        build().fit(NotABatch(x, y), verbose=0)


def test_what_keras_refuses_with_these_sources_is_refused(data):
    x, y = data
    with pytest.raises(ValueError, match="y and sample_weight must be None when x is a "
                                         "Batches"):
        build().fit(Batches(x, y), y, verbose=0)
    with pytest.raises(TypeError, match=r"train_on_batch\(\) takes one batch.*use fit"):
        build().train_on_batch(Batches(x, y))
    with pytest.raises(TypeError, match="generators and tf.data datasets are not read"):
        build().fit((batch for batch in [(x, y)]), verbose=0)


def test_the_first_batch_gives_the_label_layout(data):
    x, y = data
    assert SourceBatches(Batches(x, y)).label == "__label__"
    unlabeled = SourceBatches(torch.utils.data.DataLoader(Rows(x, y), batch_size=4)).label
    assert unlabeled == "__label__"

    class Features(Batches):
        def __getitem__(self, index):
            return super().__getitem__(index)[0]

    assert SourceBatches(Features(x, y)).label is None
    assert SourceBatches(Features({**x, "label": y}, y)).label == "label"

"""The README quickstart: DLRM on the packaged criteo_synth dataset."""

import reckeras as rk  # first: selects Keras's torch backend

import keras  # noqa: E402

keras.utils.set_random_seed(0)                             # the same run every time
train = rk.datasets.load("criteo_synth", split="train")
test = rk.datasets.load("criteo_synth", split="test")

columns = rk.layers.FeatureColumns(
    [rk.features.Numeric(f"I{i}", transform="log1p") for i in range(1, 14)]
    + [rk.features.Categorical(f"C{i}", dim=16) for i in range(1, 27)])
inputs = columns.inputs()
dense, sparse = columns(inputs)
# Rows start as Keras's Embedding starts them, uniform in [-0.05, 0.05], and an
# L2 penalty on the rows each batch looks up keeps the rows of rare ids from
# memorizing their labels' noise: without both, validation AUC peaks at epoch 2
# (docs/quickstart.md, "Why the regularizer").
emb = rk.layers.ShardedEmbedding(
    columns, init_scale=0.05,
    embeddings_regularizer=keras.regularizers.L2(1e-4))(sparse)   # [B, 26, 16]
x = rk.layers.MLP([512, 256, 16])(dense)
z = rk.layers.DotInteraction()([x, emb])
out = rk.layers.MLP([512, 256, 1], output_activation="sigmoid")(z)

model = rk.Model(inputs, out)
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              embedding_optimizer=rk.optimizers.RowWiseAdagrad(0.05),
              loss="binary_crossentropy", metrics=[rk.metrics.AUC()])
history = model.fit(train, batch_size=4096, epochs=3, validation_data=test)

print("val_auc_per_epoch=" + " ".join(f"{auc:.4f}" for auc in history.history["val_auc"]))
# Training examples/s over the 3 epochs, validation excluded (rk.Model's pipeline_stats).
print(f"examples_per_s={model.pipeline_stats['examples_per_s']:.0f}")
test_auc = model.evaluate(test, batch_size=4096, verbose=0, return_dict=True)["auc"]
print(f"test_auc={test_auc:.4f} bayes_auc={test.bayes_auc():.4f}")

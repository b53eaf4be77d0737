"""`rk.Model.compile`'s own arguments: their checks and their config.

An `rk.Model` runs every step eagerly (the embedding lookup is not a
traceable graph), trains its tables with a sparse optimizer of its own, and
guards every step against non-finite values: `compile` refuses what cannot
hold with that, each with a message naming what to use. Its compile config
adds the embedding optimizer, the non-finite policy and the GAUC metrics to
Keras's (`with_own_config`), and `compile_from_config` reads them back
(`from_config`).
"""

from __future__ import annotations

from typing import Any

import keras

from reckeras import optimizers as sparse_optimizers
from reckeras.pipeline.group_metrics import group_metrics_config, with_group_metrics

NONFINITE_POLICIES = ("raise", "skip")


def check(nonfinite: str, jit_compile: bool | str, steps_per_execution: int) -> None:
    """Checks `compile`'s `nonfinite`, `jit_compile` and `steps_per_execution`.

    Args:
        nonfinite: one of `NONFINITE_POLICIES`.
        jit_compile: `False` or `"auto"`.
        steps_per_execution: 1.

    Raises:
        ValueError: any other value, with what to use.
    """
    if nonfinite not in NONFINITE_POLICIES:
        raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, "
                         f"got {nonfinite!r}")
    if jit_compile not in (False, "auto"):
        raise ValueError("rk.Model does not support jit_compile=True: the sparse "
                         "kernels are torch ops torch.compile traces, but the step "
                         "keeps data-dependent sizes and Python hooks (the hash "
                         "tables, the sparse optimizer run in backward), and "
                         "compiling the dense part alone did not pay (wide workload "
                         "on CPU: 33-39 ms a step compiled against 32-33 ms eager, "
                         "after 4 minutes of compilation; docs/kernels.md); use "
                         "jit_compile=False (or 'auto')")
    if steps_per_execution != 1:
        raise ValueError(f"rk.Model runs one step per execution; got "
                         f"steps_per_execution={steps_per_execution!r}. Every step "
                         f"is eager already, so there is nothing to amortize")


def check_optimizer(optimizer: keras.optimizers.Optimizer) -> None:
    """Refuses loss scaling: the tables' optimizer would get scaled gradients.

    Args:
        optimizer: the compiled Keras optimizer.

    Raises:
        ValueError: a `LossScaleOptimizer`.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError("rk.Model does not support loss scaling (a LossScaleOptimizer, "
                         "or auto_scale_loss under the mixed_float16 policy): the "
                         "embedding tables' optimizer would receive the scaled "
                         "gradients. Use the mixed_bfloat16 or float32 policy, or "
                         "compile(auto_scale_loss=False)")


def embedding_optimizer(given: Any, layers: list) -> Any:
    """The sparse optimizer of the embedding tables.

    Args:
        given: `compile`'s `embedding_optimizer`: an `rk.optimizers`
            optimizer, its name, or None.
        layers: the model's ShardedEmbedding layers.

    Returns:
        The optimizer, or None for a model without tables given none.

    Raises:
        ValueError: None for a model with tables.

    Example:

    ```python
    optimizer = embedding_optimizer("adagrad", model.embedding_layers)
    ```
    """
    if given is None and layers:
        raise ValueError("the model has ShardedEmbedding tables: pass "
                         "embedding_optimizer=rk.optimizers.RowWiseAdagrad(...) "
                         "(or another rk.optimizers optimizer) to compile()")
    return None if given is None else sparse_optimizers.get(given)


def with_own_config(config: dict | None, nonfinite: str, embedding_optimizer: Any,
                    gaucs: list, outputs: list) -> dict | None:
    """Keras's compile config with `rk.Model.compile`'s own arguments added.

    Args:
        config: `keras.Model.get_compile_config()`'s (None: not compiled).
        nonfinite: the non-finite policy.
        embedding_optimizer: the tables' sparse optimizer, or None.
        gaucs: the GAUC metrics.
        outputs: the output each GAUC reads (None: the only one).

    Returns:
        The config (None when not compiled).
    """
    if config:
        config["nonfinite"] = nonfinite
        if embedding_optimizer is not None:
            config["embedding_optimizer"] = sparse_optimizers.serialize(embedding_optimizer)
        if gaucs:
            config["group_metrics"] = group_metrics_config(gaucs, outputs)
    return config


def from_config(config: dict) -> dict:
    """`rk.Model.compile`'s arguments from its compile config.

    Args:
        config: what `with_own_config` returned (`embedding_optimizer` and
            `group_metrics` are taken out of it).

    Returns:
        The keyword arguments of `compile`, deserialized.

    Example:

    ```python
    model.compile(**from_config(saved.get_compile_config()))
    ```
    """
    embedding_optimizer = config.pop("embedding_optimizer", None)
    saved_gaucs = config.pop("group_metrics", [])
    config = keras.saving.deserialize_keras_object(config)
    config["metrics"] = with_group_metrics(config.get("metrics"), saved_gaucs)
    return {"embedding_optimizer": embedding_optimizer, **config}

"""TorchRec on CPU, in every configuration its documentation offers for
training, on the workloads of `workloads.py`.

Every configuration has one `EmbeddingBagConfig` per field (`vocab + 1`
rows: the last is the id a null becomes, `feeds`), Adagrad on the embedding
rows applied in the backward pass (exact, element-wise: fbgemm's
`EXACT_ADAGRAD`, as `torch.optim.Adagrad` maps there) and `torch.optim.Adagrad`
on the dense weights, learning rate 0.01 for both, like the other baselines
(`baselines.py`). They differ in what holds the tables:

* `torchrec_dmp_default`: an `EmbeddingBagCollection` on the meta device
  with `apply_optimizer_in_backward`, in `DistributedModelParallel` with
  nothing else given: its default planner and sharders choose (on one CPU
  rank they choose table-wise sharding of fbgemm's fused kernels);
* `torchrec_tw_fused`: the same, with the plan asked for explicitly
  (`ParameterConstraints`: `TABLE_WISE`, compute kernel `FUSED`, the
  planner told the batch size);
* `torchrec_dp`: the same, with the tables data-parallel (`DATA_PARALLEL`,
  compute kernel `DENSE`): replicated, gradients through DDP's all-reduce;
* `torchrec_ebc_fused`: `FusedEmbeddingBagCollection`, the unsharded
  collection that runs fbgemm's batched kernels with the optimizer fused,
  without `DistributedModelParallel` (no process group, no DDP);
* `torchrec_ebc_in_backward`: a plain `EmbeddingBagCollection` (one
  `nn.EmbeddingBag` per table, dense gradients) with
  `apply_optimizer_in_backward`, without `DistributedModelParallel`.

Inputs are `KeyedJaggedTensor` s of the feed's field-major ids with
one-id bags: their lengths and offsets (int64, the type fbgemm's kernels
take) are the same every step and are made once, as a TorchRec user whose
bags all have one id would. `TrainPipelineSparseDist` needs CUDA streams, so
the steps run one after another.

Each configuration also has a dense-only floor (`floor=True`): the
`DistributedModelParallel` ones share `torchrec_floor` (the dense network
under `DistributedModelParallel`, so in DDP, as they run it); the ones
without it share plain PyTorch's floor (`baselines.py`).
"""

import collections

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from baseline_parts import (EMBEDDING_INIT_RANGE, LEARNING_RATE, THREADS, DenseArch,
                            FloorModel, dense_floor_step, timed_steps)

# Configuration -> whether it runs under DistributedModelParallel.
CONFIGURATIONS = {"torchrec_dmp_default": True, "torchrec_tw_fused": True, "torchrec_dp": True,
                  "torchrec_ebc_fused": False, "torchrec_ebc_in_backward": False}


class _TorchRecModel(nn.Module):
    def __init__(self, workload, embedding_bags):
        super().__init__()
        self.embedding_bags = embedding_bags
        self.embedding_shape = (workload.num_fields, workload.dim)
        self.dense_arch = DenseArch(workload)

    def forward(self, dense, features):
        # One pooled vector per field, concatenated in the collection's key order.
        pooled = self.embedding_bags(features).values()
        return self.dense_arch(dense, pooled.view(-1, *self.embedding_shape))


def _keys(workload):
    return [f"C{field + 1}" for field in range(workload.num_fields)]


def _table_configs(workload):
    from torchrec import EmbeddingBagConfig
    return [EmbeddingBagConfig(name=f"table_{key}", num_embeddings=vocab + 1,
                               embedding_dim=workload.dim, feature_names=[key],
                               weight_init_min=-EMBEDDING_INIT_RANGE,
                               weight_init_max=EMBEDDING_INIT_RANGE)
            for key, vocab in zip(_keys(workload), workload.vocabs)]


def _plan(configuration, model, workload, batch_size, sharders):
    """The sharding plan a DMP configuration asks for (None: DMP's default)."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.planner import (EmbeddingShardingPlanner, ParameterConstraints,
                                              Topology)
    from torchrec.distributed.types import ShardingType
    if configuration == "torchrec_dmp_default":
        return None
    sharding, kernel = {
        "torchrec_tw_fused": (ShardingType.TABLE_WISE, EmbeddingComputeKernel.FUSED),
        "torchrec_dp": (ShardingType.DATA_PARALLEL, EmbeddingComputeKernel.DENSE),
    }[configuration]
    constraint = ParameterConstraints(sharding_types=[sharding.value],
                                      compute_kernels=[kernel.value])
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=dist.get_world_size(), compute_device="cpu"),
        batch_size=batch_size, debug=False,
        constraints={f"table_{key}": constraint for key in _keys(workload)})
    return planner.collective_plan(model, sharders, dist.GroupMember.WORLD)


def _dmp_model(configuration, workload, batch_size):
    """`(model, dense optimizer)` of a DistributedModelParallel configuration."""
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    embedding_bags = EmbeddingBagCollection(tables=_table_configs(workload),
                                            device=torch.device("meta"))
    apply_optimizer_in_backward(torch.optim.Adagrad, embedding_bags.parameters(),
                                {"lr": LEARNING_RATE})
    model = _TorchRecModel(workload, embedding_bags)
    sharders = get_default_sharders()
    plan = _plan(configuration, model, workload, batch_size, sharders)
    model = DistributedModelParallel(model, device=torch.device("cpu"),
                                     **({} if plan is None else {"plan": plan,
                                                                "sharders": sharders}))
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=LEARNING_RATE))
    print(f"# {workload.name} {configuration} plan: {plan_summary(model.plan)}", flush=True)
    return model, dense_optimizer


def plan_summary(plan):
    """`"table_wise/fused x26"`: how many tables a `ShardingPlan` gives each
    (sharding type, compute kernel)."""
    counts = collections.Counter(
        f"{sharding.sharding_type}/{sharding.compute_kernel}"
        for module_plan in plan.plan.values() for sharding in module_plan.values())
    return ", ".join(f"{kind} x{count}" for kind, count in sorted(counts.items()))


def _unsharded_model(configuration, workload):
    """`(model, dense optimizer)` of a configuration without DMP."""
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    if configuration == "torchrec_ebc_fused":
        embedding_bags = FusedEmbeddingBagCollection(
            tables=_table_configs(workload), optimizer_type=torch.optim.Adagrad,
            optimizer_kwargs={"lr": LEARNING_RATE}, device=torch.device("cpu"))
    else:
        embedding_bags = EmbeddingBagCollection(tables=_table_configs(workload),
                                                device=torch.device("cpu"))
        apply_optimizer_in_backward(torch.optim.Adagrad, embedding_bags.parameters(),
                                    {"lr": LEARNING_RATE})
    model = _TorchRecModel(workload, embedding_bags)
    return model, torch.optim.Adagrad(model.dense_arch.parameters(), lr=LEARNING_RATE)


def torchrec(configuration, workload, feed, floor=False):
    """TorchRec in one of `CONFIGURATIONS` (see the module docstring).

    A configuration under `DistributedModelParallel` runs on a one-rank gloo
    group, created here and destroyed afterwards, unless one exists.

    Args:
        configuration: a key of `CONFIGURATIONS`.
        workload: a `workloads.Workload`.
        feed: a `feeds.MemoryFeed` or `feeds.ParquetFeed` of its batches.
        floor: train the configuration's dense-only floor instead: the dense
            network on constant embeddings, in `DistributedModelParallel`
            for the configurations that use it, with the same `Adagrad`.

    Returns:
        A `baseline_parts.Measurement`, or None (after printing why) when
        TorchRec (`bash scripts/install_bench.sh`) is not importable.
    """
    if configuration not in CONFIGURATIONS:
        raise ValueError(f"unknown TorchRec configuration {configuration!r}; "
                         f"choose from {sorted(CONFIGURATIONS)}")
    try:
        from torchrec import KeyedJaggedTensor
        from torchrec.distributed import DistributedModelParallel
        from torchrec.optim.keyed import KeyedOptimizerWrapper
    except ImportError as error:
        print(f"{workload.name} {configuration} skipped: cannot import torchrec ({error}); "
              f"install it: bash scripts/install_bench.sh")
        return None
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    sharded = CONFIGURATIONS[configuration]
    owns_group = sharded and not dist.is_initialized()
    if owns_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        if floor:
            model = FloorModel(workload)
            if not sharded:
                optimizer = torch.optim.Adagrad(model.parameters(), lr=LEARNING_RATE)
                return timed_steps(feed, dense_floor_step(model, optimizer))
            model = DistributedModelParallel(model, device=torch.device("cpu"))
            optimizer = KeyedOptimizerWrapper(
                dict(model.named_parameters()),
                lambda params: torch.optim.Adagrad(params, lr=LEARNING_RATE))
            return timed_steps(feed, dense_floor_step(model, optimizer))
        if sharded:
            model, dense_optimizer = _dmp_model(configuration, workload, feed.batch_size)
        else:
            model, dense_optimizer = _unsharded_model(configuration, workload)
        keys = _keys(workload)
        bags = workload.num_fields * feed.batch_size
        lengths = torch.ones(bags, dtype=torch.int64)
        offsets = torch.arange(bags + 1, dtype=torch.int64)

        def train_step(batch):
            dense, ids, labels = (torch.from_numpy(array) for array in batch)
            if ids.shape[1] != feed.batch_size:
                raise ValueError(f"{configuration} takes whole batches of {feed.batch_size} "
                                 f"rows, got {ids.shape[1]}")
            features = KeyedJaggedTensor(keys=keys, values=ids.view(-1), lengths=lengths,
                                         offsets=offsets)
            loss = F.binary_cross_entropy_with_logits(model(dense, features), labels)
            dense_optimizer.zero_grad(set_to_none=True)
            loss.backward()      # also applies the embedding rows' Adagrad
            dense_optimizer.step()
            return loss.detach()

        return timed_steps(feed, train_step)
    finally:
        if owns_group:
            dist.destroy_process_group()

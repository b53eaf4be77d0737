"""Each rank computes the in-batch softmax of its slice of one global batch
against the candidates of every rank (rk.retrieval.gather_candidates) and
writes its loss and gradients to `<out>.rank<r>.npz`."""

import sys

import numpy as np
import torch

import reckeras as rk  # noqa: F401
from reckeras import distributed
from reckeras.retrieval import cross_rank, losses

GLOBAL_ROWS, DIM = 12, 5

out_path = sys.argv[1]
world = distributed.init(timeout_s=60)
rng = np.random.default_rng(0)
query_all = rng.normal(size=(GLOBAL_ROWS, DIM)).astype(np.float32)
candidates_all = rng.normal(size=(GLOBAL_ROWS, DIM)).astype(np.float32)
ids_all = rng.integers(0, 6, GLOBAL_ROWS)          # repeated ids: accidental hits
log_q_all = np.log(rng.uniform(0.05, 1.0, GLOBAL_ROWS)).astype(np.float32)

rows = slice(world.rank * GLOBAL_ROWS // world.size,
             (world.rank + 1) * GLOBAL_ROWS // world.size)
query = torch.tensor(query_all[rows], requires_grad=True)
candidates = torch.tensor(candidates_all[rows], requires_grad=True)
ids = torch.tensor(ids_all[rows])
gathered, gathered_ids, log_q, offset = cross_rank.gather_candidates(
    candidates * 2.0, ids, torch.tensor(log_q_all[rows]))
positive_index = offset + torch.arange(query.shape[0])
hits = losses.accidental_hits(ids, gathered_ids, positive_index)
loss = losses.sampled_softmax_loss(query @ gathered.T, positive_index, temperature=0.5,
                                   log_q=log_q, hits=hits).mean()
loss.backward()

# Uneven row counts gather too: rank r gives r + 1 rows of value r.
uneven = torch.full((world.rank + 1,), world.rank, dtype=torch.int64)
_, gathered_uneven, _, uneven_offset = cross_rank.gather_candidates(
    torch.zeros(world.rank + 1, 1), uneven, None)
np.savez(f"{out_path}.rank{world.rank}.npz", loss=loss.detach().numpy(),
         query_grad=query.grad.numpy(), candidate_grad=candidates.grad.numpy(),
         gathered_ids=gathered_ids.numpy(), uneven=gathered_uneven.numpy(),
         uneven_offset=np.array(uneven_offset))

"""Failure modes. Usage: failures.py hang|config"""

import sys
import time

import common

import reckeras as rk
from reckeras import distributed

world = distributed.init(timeout_s=5)
if sys.argv[1] == "hang":
    model = common.model()
    if world.rank == 1:
        time.sleep(120)               # a hung peer: never joins a collective
    started = time.time()
    try:
        model.fit(common.data(), batch_size=32, verbose=0)
    except distributed.PeerFailureError as error:
        print(f"FAILED_AFTER={time.time() - started:.1f} {error}", flush=True)
        raise
else:
    dim = 4 if world.rank == 0 else 8
    columns = rk.layers.FeatureColumns([rk.features.Numeric("n"),
                                        rk.features.Categorical("a", dim=dim)])
    model = rk.models.dlrm(columns, bottom_units=(dim,), top_units=(1,),
                           dropout=0.0, embedding_l2=0.0)
    model.compile(optimizer="adam", loss="binary_crossentropy",
                  embedding_optimizer=rk.optimizers.SGD(0.1))
    model.fit(common.data(), batch_size=32, verbose=0)

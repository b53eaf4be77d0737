"""A peer that dies or hangs inside the sparse-dist stage's key exchange.

Usage: sparse_dist_faults.py kill|kill_at_once|hang <batch> <out-prefix>

Both ranks train the common model with the stage threads on (timeout 5 s).
On rank 1, the sparse-dist stage's key send of batch <batch> (after the
counts went through, so rank 0 is inside the exchange) breaks:

* `kill`: waits a second (both main threads finish the step before and
  wait for this batch's routes), then kills its own process (SIGKILL: its
  sockets close);
* `kill_at_once`: kills it at once, while both main threads are still
  inside the step before (rank 0 may fail in the step's own exchanges);
* `hang`: waits a second, then sleeps far past the timeout.

Rank 1 writes <out-prefix>1.json with the wall time of the fault, just before
it; rank 0 writes <out-prefix>0.json with the error fit raised and the wall
time it did, then re-raises it (torchrun then stops the hung rank). Rank 0
ignores SIGTERM: torchrun sends it to the survivors as soon as it sees rank
1 die, and the test measures what rank 0 detects by itself (as a rank on
another node, whose agent does not see the death, must).
"""

import json
import os
import signal
import sys
import time
import traceback

import common

from reckeras import distributed

mode, fault_batch, out_prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
world = distributed.init(timeout_s=5)
model = common.model()
router = model.embedding_layers[0].engine.connect()    # a collective, on every rank


def write(report):
    with open(f"{out_prefix}{world.rank}.json", "w") as f:
        json.dump(report, f)


if world.rank == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    # One physical table: one key send per batch on the stage's exchange.
    send, calls = router.ahead.send, [0]

    def faulty_send(*args):
        if calls[0] == fault_batch:
            if mode != "kill_at_once":
                time.sleep(1.0)
            write({"fault_at": time.time()})
            if mode == "hang":
                time.sleep(600)
            os.kill(os.getpid(), signal.SIGKILL)
        calls[0] += 1
        return send(*args)

    router.ahead.send = faulty_send

started = time.time()
try:
    model.fit(common.data(), batch_size=common.GLOBAL_BATCH // world.size, epochs=1,
              verbose=0, pipeline=True)
except Exception as error:
    write({"error": type(error).__name__, "message": str(error),
           "traceback": traceback.format_exc(), "started_at": started,
           "raised_at": time.time()})
    raise
write({"error": None})

"""Trains, checkpoints and resumes across world sizes.

Usage: checkpoint_resume.py save <ckpt> <epochs>   (train from scratch, save)
       checkpoint_resume.py resume <ckpt> <epochs> <out.npz>  (load, train to epochs)
       checkpoint_resume.py straight <epochs> <out.npz>  (train without stopping)
"""

import sys

import common

from reckeras import distributed

mode = sys.argv[1]
world = distributed.init(timeout_s=60)
model = common.model()
batch = common.GLOBAL_BATCH // world.size
if mode == "save":
    model.fit(common.data(), batch_size=batch, epochs=int(sys.argv[3]), seed=3, verbose=0)
    model.save_checkpoint(sys.argv[2])
elif mode == "resume":
    model.load_checkpoint(sys.argv[2])
    model.fit(common.data(), batch_size=batch, epochs=int(sys.argv[3]), seed=3, verbose=0,
              initial_epoch=1)
    common.save_all(model, sys.argv[4])
else:
    model.fit(common.data(), batch_size=batch, epochs=int(sys.argv[2]), seed=3, verbose=0)
    common.save_all(model, sys.argv[3])

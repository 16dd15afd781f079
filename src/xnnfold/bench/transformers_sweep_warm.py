"""The transformers sweep's forkserver preload (:data:`.transformers_sweep.PRELOAD`), imported
in that server and in no other process (a class's child finds it imported already): it imports
what a class's measurement uses and exports a tiny BERT with each exporter
(:func:`.transformers_sweep_measure.warm_up`), so that every class's process, forked from the
server, starts past the imports and torch.export's and executorch's first-use costs: GPT-2's
base model, its three exports, took 39 s of CPU in a process started cold, 25 s forked.

It runs on one torch thread: a process forked from one whose OpenMP pool has started can hang
on its first parallel op, and a pool of one thread is never started; each child sets the
sweep's own count again (:func:`.transformers_sweep_measure.measure_in_child`).
"""

from __future__ import annotations

import logging

import torch

from ..pte.quiet import silence_python

torch.set_num_threads(1)
silence_python()

try:
    from .transformers_sweep_measure import warm_up

    warm_up()
except Exception as error:  # noqa: BLE001 - the children still measure, each warming itself
    logging.getLogger("xnnfold").warning(
        "transformers sweep: the forkserver's warm-up failed (%s: %s): each class pays its "
        "own first export", type(error).__name__, error)

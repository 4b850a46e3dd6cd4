"""``python -m trainlib.distributed.worker <job folder>``: what msrun starts on every worker.

A module of its own so that the training code and the worker entry share one
``trainlib.distributed.launch`` module, and with it the worker's rank.
"""

import sys
from pathlib import Path

from trainlib.distributed.launch import run_worker

if __name__ == "__main__":
    run_worker(Path(sys.argv[1]))

"""The bench: measuring lowerings (stock vs xnnfold vs ideal), the built-in and third-party
models, the report and the command line. Apart from the pass (``xnnfold``), which needs torch
and executorch only; this needs the ``bench`` extra (tabulate, tqdm, matplotlib)."""

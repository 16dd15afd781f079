"""The bench: measurement only. The report (stock vs xnnfold vs the ideal rewrite, its tables
and charts, :mod:`.report`), the LLM decode measurement (:mod:`.decode`) and the one-off
scripts ``xnnfold bench NAME`` runs (:mod:`.scripts`). It lowers and runs through
:mod:`xnnfold.pte` and builds its models from :mod:`xnnfold.models`; needs the ``bench`` extra
(tabulate, tqdm, matplotlib)."""

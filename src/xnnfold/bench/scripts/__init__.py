"""The bench's one-off measurements, run as ``xnnfold bench NAME [ARGS]`` (see README.md here).

Each module is a script (``python -m xnnfold.bench.scripts.NAME`` works too); the command runs
it in a process of its own, as its author wrote it to run.
"""

# command name -> module, in the order README.md lists them
SCRIPTS = {
    "lowering-time": "lowering_time",
    "decoder-stack-memory": "decoder_stack_memory",
    "tied-head": "tied_head",
    "attention-glue": "attention_glue",
    "tied-models": "tied_models",
    "lowering-isolated": "lowering_isolated",
    "llm-decode": "llm_decode",
}

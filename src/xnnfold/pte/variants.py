"""The names of the ways the bench lowers a model (a leaf module: no torch, so that the command
line checks ``--variants`` before any heavy import)."""

STOCK, XNNFOLD, CONSTANT_PROP = "stock", "xnnfold", "constant_prop_pass"
# Stock's own way round computed weights: every fp32 linear takes its weight at run time.
STOCK_FLAG = "stock-flag"
# xnnfold with prefer="size": a tied head stores its table once, repacked on every call.
XNNFOLD_SIZE = "xnnfold-size"
# The plain-linear rewrite of a built-in model, lowered with stock.
IDEAL = "ideal"
# A transformers model exported with its eager attention, lowered with stock.
EAGER_EXPORT = "eager-export"

# The variants in the order the report shows them.
VARIANTS = (STOCK, XNNFOLD, XNNFOLD_SIZE, STOCK_FLAG, IDEAL, EAGER_EXPORT, CONSTANT_PROP)
PROFILED = (STOCK, XNNFOLD)          # the variants whose time the ETDump breaks down

"""What XNNPACK's partitioner takes, asked of executorch itself rather than of a copy of its
checks: :mod:`.fast` (each GEMM cut out with what the decision depends on, :mod:`.cut`, laid
side by side in one small program, :mod:`.program`), :mod:`.whole` (the whole program lowered
up to ``partition()``), :mod:`.verified` (the fast probe checked against the whole one, a test
mode; ``make_probe``, and ``Verification``, which says which answer is checked when)."""

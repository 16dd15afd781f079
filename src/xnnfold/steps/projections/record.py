"""What ``explain`` lists for each packed projection: split, or kept and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...decision import Decline
from . import quantized


@dataclass
class PackedProjection:
    """A linear whose output only feeds MHA's layout chain, and the parts that chain selects."""

    linear: str                  # name of the packed linear
    parts: int                   # n
    width: int                   # E, the rows of each part
    chain: list                  # names of the layout nodes, in graph order
    selects: dict                # part index -> name of the select node that takes it
    part_linears: dict = field(default_factory=dict)   # part index -> new linear's name
    kept_because: Optional[Decline] = None   # rule split's Decline, when undone
    # PT2E int8: the weight cut by rows through its dequantize, and the output's q/dq nodes
    int8_weight: Optional[quantized.QuantizedWeight] = field(default=None, repr=False)
    output_qdq: Optional[tuple] = field(default=None, repr=False, compare=False)
    # the nodes named above, in the program the site was found in: linear, chain, selects
    found: tuple = field(default=(), repr=False, compare=False)

    @property
    def rewritten(self) -> bool:
        return self.kept_because is None

    def describe(self) -> str:
        if self.kept_because is not None:
            return (f"{self.linear}: packed projection of {self.parts} parts kept as is: "
                    f"{self.kept_because.reason}")
        taken = ", ".join(f"{self.part_linears.get(i, '?')} (rows {i * self.width}:"
                          f"{(i + 1) * self.width})" for i in sorted(self.selects))
        return f"{self.linear}: packed projection of {self.parts} parts split into {taken}"

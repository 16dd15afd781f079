"""The record ``explain`` lists for each attention the step looked at."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class AttentionRewrite:
    """One ``scaled_dot_product_attention`` (``op="attention"``) or batched ``matmul`` node:
    rewritten (``proven`` says why the rewrite is exact there) or kept as it was
    (``kept_because``)."""

    node: str
    proven: Optional[str] = None
    kept_because: Optional[str] = None
    op: str = "attention"

    @property
    def rewritten(self) -> bool:
        return self.kept_because is None

    def describe(self) -> str:
        what = "attention" if self.op == "attention" else "batched matmul"
        if self.rewritten:
            return (f"attention step: {what} {self.node} rewritten into ops XNNPACK takes "
                    f"({self.proven})")
        return f"attention step: {what} {self.node} kept as it was: {self.kept_because}"

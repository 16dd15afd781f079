"""The words the pass decides in, about one GEMM operand: what analysis found it to be
(:class:`Found`), what was done with it (:class:`Status`), and, when it is not folded, by which
rule (:class:`Rule`) and why (:class:`Decline`).

A leaf module (it imports nothing of xnnfold): analysis, the plan, the rules, the steps and
the result all speak it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Found(str, Enum):
    """What analysis found a GEMM operand to be, before any rule: ``PLAIN`` (a param, or one
    behind casts decomposition removes: stock delegates it as is), ``TARGET`` (computed from
    static nodes: planned, then folded or declined) or ``DYNAMIC`` (computed from a user input
    or a mutable buffer: declined by rule *static*)."""

    PLAIN = "plain"
    TARGET = "target"
    DYNAMIC = "dynamic"

    def __str__(self) -> str:
        return self.value


class Rule(str, Enum):
    STATIC = "static"
    EXACT = "exact"
    SIZE = "size"
    WHOLE_GROUP = "whole-group"
    DELEGATED = "delegated"
    SPLIT = "split"
    INTERNAL = "internal"      # an internal failure sent the program back to stock

    def __str__(self) -> str:
        return self.value


class Status(str, Enum):
    """What was done with a GEMM operand (:class:`~xnnfold.result.GemmOperand`)."""

    PLAIN = "plain"
    FOLDED = "folded"
    DECLINED = "declined"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Decline:
    """Why a target is not folded: the rule, the node that broke it, and a sentence."""

    rule: Rule
    node: str
    reason: str

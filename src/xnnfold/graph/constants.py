"""New lifted constants in a program: a placeholder holding a tensor, named after the node it
stands for, placed before the user inputs (lifted constants come first)."""

from __future__ import annotations

import torch
import torch.fx
from executorch.backends.transforms.utils import create_constant_placeholder
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

CONSTANT_PREFIX = "_xnnfold_"


def _constant_name(source: str, graph: torch.fx.Graph) -> str:
    taken = {n.name for n in graph.nodes}
    name, index = f"{CONSTANT_PREFIX}{source}", 1
    while name in taken:
        name, index = f"{CONSTANT_PREFIX}{source}_{index}", index + 1
    return name


def _insertion_point(ep: ExportedProgram) -> torch.fx.Node:
    """The first user input: lifted constants must come before user inputs."""
    user_inputs = {s.arg.name for s in ep.graph_signature.input_specs
                   if s.kind == InputKind.USER_INPUT}
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    first_user = next((n for n in placeholders if n.name in user_inputs), None)
    if first_user is not None:
        return first_user
    return next(n for n in ep.graph.nodes if n.op != "placeholder")


def new_constant(program: ExportedProgram, source: str, value: torch.Tensor) -> torch.fx.Node:
    """A lifted constant placeholder holding ``value`` (in its own storage already), named
    after the node ``source`` it stands for."""
    graph = program.graph
    with graph.inserting_before(_insertion_point(program)):
        return create_constant_placeholder(program, graph, _constant_name(source, graph),
                                           InputKind.CONSTANT_TENSOR, value)

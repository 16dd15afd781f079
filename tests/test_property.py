"""Property test over generated programs: a packed param (or separate params), a multi-output
op (or none), random single-output chains per part (same-dtype casts among them), and GEMM
consumers (one of them over a learned table, so with only static inputs; one a tied head, the
part also read by an embedding lookup) or non-GEMM ones, sometimes on a data-dependent number
of rows. One more mode, "projection",
builds MHA's packed projection: one linear over the (chained) packed weight whose output is cut
into parts by MHA's layout chain (sometimes also used whole, which must keep it packed).

Properties: lowering never raises; the xnnfold .pte runs and matches eager; it never leaves more
GEMMs outside delegates than stock; it never stores more tensor bytes than stock; and, unless a
conv was folded (XNNPACK stores conv weights in more bytes than the portable program), its .pte
is no larger than stock's but for XNNPACK's fixed per-GEMM and per-constant overhead. CI profile:
``XNNFOLD_EXAMPLES`` examples (default 100) in ten seeded shards; ``XNNFOLD_FUZZ=<part>``: one
random run (``make fuzz`` starts two).
"""

import os
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from torch import nn

from conftest import DELEGATE_BYTES_PER_CONSTANT, DELEGATE_BYTES_PER_GEMM, check_lowering_if_modified

CHAIN_OPS = ["mul", "add_param", "t_t", "permute", "view", "cast", "cast_half", "slice_cat",
             "same_cast"]
CONSUMERS = ["linear", "addmm", "mm", "conv1d", "static_linear", "tied_head", "non_gemm"]
SPLITS = ["none", "split", "split_with_sizes", "chunk", "unbind", "projection", "separate"]


class Generated(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.spec = spec
        parts, n, k = spec["parts"], spec["n"], spec["k"]
        shape = (parts, n, k) if spec["split"] == "unbind" else (parts * n, k)
        self.packed = nn.Parameter(torch.randn(shape))
        projection = spec["split"] == "projection"
        self.other = nn.Parameter(torch.randn(parts * n if projection else n, k))
        self.bias = nn.Parameter(torch.randn(parts * n if projection else n))
        self.table = nn.Parameter(torch.randn(3, k))    # a learned table: a GEMM of static inputs
        # "separate": one plain param per part (chains of no-op casts leave them plain)
        self.separate = nn.ParameterList([nn.Parameter(torch.randn(n, k)) for _ in range(parts)])

    def _parts(self):
        split, parts, n = self.spec["split"], self.spec["parts"], self.spec["n"]
        if split == "none":
            return [self.packed[i * n:(i + 1) * n] for i in range(parts)]
        if split == "separate":
            return list(self.separate)
        if split == "split":
            return list(self.packed.split(n))
        if split == "split_with_sizes":
            return list(self.packed.split_with_sizes([n] * parts))
        if split == "chunk":
            return list(self.packed.chunk(parts))
        return list(self.packed.unbind(0))

    def _chain(self, w, ops):
        for op in ops:
            if op == "mul":
                w = w * 0.5
            elif op == "add_param":
                w = w + self.other
            elif op == "t_t":
                w = w.t().t()
            elif op == "permute":
                w = w.permute(1, 0).contiguous().permute(1, 0)
            elif op == "view":
                w = w.reshape(-1).view(w.shape)
            elif op == "cast":
                w = w.double().float()
            elif op == "cast_half":
                w = w.half().float()
            elif op == "slice_cat":
                w = torch.cat([w[:1], w[1:]])
            elif op == "same_cast":    # the mixed-precision idiom, a no-op in fp32
                w = w.to(torch.float32)
        return w

    def _projection(self, x):
        # nn.MultiheadAttention's in-projection, as its forward writes it.
        parts, n = self.spec["parts"], self.spec["n"]
        whole = F.linear(x, self._chain(self.packed, self.spec["chains"][0]), self.bias)
        cut = whole.unflatten(-1, (parts, n)).unsqueeze(0).transpose(0, -2).squeeze(-2)
        cut = cut.contiguous()
        outputs = [cut[i] for i in range(parts)]
        if self.spec["portable_between"]:
            outputs = [torch.cumsum(y, -1) for y in outputs]
        if self.spec["consumers"][0] == "non_gemm":   # used whole too: must stay packed
            outputs.append(whole * 2)
        return tuple(outputs)

    def forward(self, x):
        if self.spec["split"] == "projection":
            return self._projection(x)
        if self.spec["masked"]:        # a data-dependent number of rows (an unbacked size)
            x = x[x[:, 0] > -10.0]
        outputs = []
        for w, ops, consumer in zip(self._parts(), self.spec["chains"], self.spec["consumers"]):
            w = self._chain(w, ops)
            if consumer == "linear":
                y = F.linear(x, w, self.bias)
            elif consumer == "addmm":
                y = torch.addmm(self.bias, x, w.t())
            elif consumer == "mm":
                y = x @ w.t()
            elif consumer == "conv1d":
                y = F.conv1d(x.t().unsqueeze(0), w.unsqueeze(-1)).squeeze(0).t()
            elif consumer == "tied_head":
                # the same table read by a lookup and, transposed, by an output head
                outputs.append(F.embedding(torch.tensor([1, 0]), w))
                y = x @ w.t()
            elif consumer == "static_linear":
                # No bias: a param shared by GEMMs in two delegates is stored once per delegate
                # (XNNPACK copies its constants), as stock does with plain params.
                y = x[:, :1] * F.linear(self.table, w).sum(0)
            else:
                y = x[:, :1] * w.sum()
            if self.spec["portable_between"]:
                y = torch.cumsum(y, -1)
            outputs.append(y)
        return tuple(outputs)


@st.composite
def specs(draw):
    parts = draw(st.integers(1, 3))
    return {
        "parts": parts,
        "n": draw(st.integers(2, 6)),
        "k": draw(st.integers(2, 6)),
        "split": draw(st.sampled_from(SPLITS)),
        "chains": [draw(st.lists(st.sampled_from(CHAIN_OPS), max_size=2)) for _ in range(parts)],
        "consumers": [draw(st.sampled_from(CONSUMERS)) for _ in range(parts)],
        "portable_between": draw(st.booleans()),
        "dynamic": draw(st.booleans()),
        "masked": draw(st.integers(0, 5)) == 0,
        "seed": draw(st.integers(0, 1000)),
    }


def check_spec(spec):
    torch.manual_seed(spec["seed"])
    model = Generated(spec).eval()
    x = torch.randn(4, spec["k"])
    dynamic = ({0: torch.export.Dim("rows", min=2, max=16)},) if spec["dynamic"] else None
    others = [(torch.randn(7, spec["k"]),)] if spec["dynamic"] else []
    checked = check_lowering_if_modified(model, (x,), dynamic_shapes=dynamic, run_inputs=others,
                                         tol=1e-4, compare_counts=False)
    if checked.stock is None:
        return    # xnnfold left the program as it was: the stock lowering, by construction
    folded, stock = checked.folded, checked.stock
    assert len(folded.gemms_outside) <= len(stock.gemms_outside)
    assert folded.constant_bytes <= stock.constant_bytes     # also in the helper: the core one
    folded_convs = any("conv" in c for const in checked.fold.constants for c in const.consumers)
    if not folded_convs:
        moved = len(stock.gemms_outside) - len(folded.gemms_outside)
        slack = (DELEGATE_BYTES_PER_CONSTANT * len(checked.fold.constants)
                 + DELEGATE_BYTES_PER_GEMM * moved)
        assert folded.pte_bytes <= stock.pte_bytes + slack


EXAMPLES = int(os.environ.get("XNNFOLD_EXAMPLES", "100"))
FUZZ = os.environ.get("XNNFOLD_FUZZ") is not None
# The CI profile is cut into seeded shards, separate tests that pytest-xdist gives to different
# workers; each process of make fuzz is one random run.
SHARDS = 1 if FUZZ else 10


def _generated_programs_test(shard: int):
    @settings(max_examples=-(-EXAMPLES // SHARDS), deadline=None, print_blob=True,
              database=None if not FUZZ else settings.default.database,
              suppress_health_check=list(HealthCheck))
    @given(specs())
    def test(spec):
        check_spec(spec)
        _show_progress()

    return test if FUZZ else seed(shard)(test)


# make test runs the first two shards (20 examples); make test-all all ten (the slow set)
for _shard in range(SHARDS):
    globals()[f"test_generated_programs_{_shard}"] = _generated_programs_test(_shard) \
        if FUZZ or _shard < 2 else pytest.mark.slow(_generated_programs_test(_shard))


_progress = {"examples": 0, "start": time.monotonic()}


def _show_progress(every: int = 25) -> None:
    # make fuzz runs for half an hour or more (and with -s): say how far it is.
    if os.environ.get("XNNFOLD_FUZZ") is None:
        return
    _progress["examples"] += 1
    if _progress["examples"] % every == 0:
        minutes = (time.monotonic() - _progress["start"]) / 60
        print(f"[fuzz {os.environ['XNNFOLD_FUZZ']}] {_progress['examples']} examples passed, "
              f"{minutes:.1f} min", file=sys.stderr, flush=True)

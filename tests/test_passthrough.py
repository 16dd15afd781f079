"""Programs whose no-op copies vanish in XNNPACK's preprocess (issue 22, item 3).

Stock's lowering raises "Output node ... is already in the inputs" on each of them: a delegate
would return a value twice, or return its input, once preprocess drops the copies. xnnfold's
partition() leaves those copies on portable (xnnfold.passthrough); the .pte runs and matches
eager. With the fix removed from XnnpackPartitioner.partition, every test here raises.
"""

import pytest
import torch
from torch import nn

from conftest import (PASS_THROUGH, NumericMismatch, check_where_stock_fails_to_lower, expect,
                      tiny_wav2vec2_config)
from xnnfold.pte import compare_outputs, run_pte

E = 16


class ValueAndClone(nn.Module):
    def forward(self, x):
        y = x + 1
        return y, y.clone()


class LinearAndDropout(nn.Module):
    """An eval-mode dropout (``_clone_dim_order`` in Edge) of a linear whose output is also
    returned: under a dynamic length, as in a speech encoder's feature projection."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(E, E)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = self.proj(x)
        return h, self.drop(h)


class InputRoundTrip(nn.Module):
    def forward(self, x):
        back = x.to(memory_format=torch.channels_last).to(memory_format=torch.contiguous_format)
        return back, x * 2


class ValueRoundTrip(nn.Module):
    def forward(self, x):
        y = x * 2
        return y.to(memory_format=torch.channels_last).to(memory_format=torch.contiguous_format), y


class DetrStyleDecoder(nn.Module):
    """DETR-style query decoder: learned queries concatenated with their position embedding,
    the result cloned as the first hidden state and also returned; every layer's output
    returned through an eval-mode dropout (the auxiliary outputs)."""

    def __init__(self, e=E, queries=6, layers=2):
        super().__init__()
        self.query = nn.Embedding(queries, e)
        self.pos = nn.Embedding(queries, e)
        self.down = nn.Linear(2 * e, e)
        self.attn = nn.ModuleList(nn.MultiheadAttention(e, 2, batch_first=True)
                                  for _ in range(layers))
        self.norm = nn.ModuleList(nn.LayerNorm(e) for _ in range(layers))
        self.first = nn.LayerNorm(2 * e)
        self.drop = nn.Dropout(0.1)

    def forward(self, memory):
        b = memory.shape[0]
        queries = self.query.weight.unsqueeze(0).expand(b, -1, -1)
        pos = self.pos.weight.unsqueeze(0).expand(b, -1, -1)
        query_pos = torch.cat([queries, pos], -1)
        hidden = self.down(self.first(query_pos.clone()))
        outs = []
        for attn, norm in zip(self.attn, self.norm):
            hidden = norm(hidden + attn(hidden, memory, memory, need_weights=False)[0])
            outs.append(self.drop(hidden))
        return (query_pos, hidden, *outs)


LENGTH = torch.export.Dim("length", min=2, max=64)
CASES = {
    "value and its clone": (ValueAndClone, (2, 3), None),
    "dropout of a linear, dynamic length": (LinearAndDropout, (1, 5, E), ({1: LENGTH},)),
    "memory-format round trip of an input": (InputRoundTrip, (1, 3, 4, 4), None),
    "memory-format round trip of a value": (ValueRoundTrip, (1, 3, 4, 4), None),
    "DETR-style query decoder": (DetrStyleDecoder, (2, 10, E), None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_lowers_where_stock_raises(name):
    torch.manual_seed(0)
    cls, shape, dynamic_shapes = CASES[name]
    model = cls().eval()
    checked = check_where_stock_fails_to_lower(model, (torch.randn(shape),),
                                               dynamic_shapes=dynamic_shapes,
                                               stock_error=PASS_THROUGH)
    assert checked.folded.delegate_calls >= (0 if "input" in name else 1)


def test_wav2vec2_encoder_with_a_dynamic_length():
    """Stock raises: the feature projection's linear leaves its delegate next to its dropout
    (a clone) under a dynamic length."""
    import transformers

    torch.manual_seed(0)
    config = tiny_wav2vec2_config(transformers, layers=2)
    encoder = transformers.Wav2Vec2Model(config).eval()

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, audio):
            out = self.encoder(audio, output_hidden_states=True)
            return (out.last_hidden_state, out.extract_features, *out.hidden_states)

    model = Encoder().eval()
    checked = check_where_stock_fails_to_lower(
        model, (torch.randn(1, 1600),), stock_error=PASS_THROUGH,
        dynamic_shapes=({1: 10 * torch.export.Dim("frames", min=80, max=400)},), tol=1e-4)
    assert checked.folded.gemms_outside == []
    longer = (torch.randn(1, 2400),)     # another length, on the same .pte
    with torch.no_grad():
        verdict = compare_outputs(run_pte(checked.folded.pte, longer), model(*longer), atol=1e-4)
    expect(verdict.ok, NumericMismatch, f"at another length: {verdict}")

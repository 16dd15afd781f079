"""Quantized attention, measured: PT2E int8 models (XNNPACK's quantizer, per
channel, calibrated on the example input), stock / stock's flag / xnnfold, outputs against the
converted module (the PT2E model before export). One thread; latency: interleaved rounds,
medians; ETDump: the portable share of a run.

    xnnfold bench quantized-attention whisper [--rounds 30]   # the issue's encoder, both modes
    xnnfold bench quantized-attention models [--rounds 30]    # ViT, BERT, wav2vec2: static
    xnnfold bench quantized-attention mha                     # MHA cases: delegate calls, int8
    xnnfold bench quantized-attention layer-norm [--rounds 100]   # LayerNorm candidates

``layer-norm`` measures LayerNorm written with ops XNNPACK 1.5.1 takes (``mean.dim`` over
dims [2, 3] of a 4-D view, or two ``linear`` with a ``1/D`` row, then sub, mul, rsqrt, add)
against portable's ``native_layer_norm``: alone on whisper-tiny's encoder shape (1500 x 384),
and in place in the whisper encoder (its exported program rewritten before lowering).

The lowerings run with xnnfold's default settings (xnnfold.config: verification off), as users run them.
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter

from xnnfold.bench.scripts import parser



def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("part", choices=["whisper", "models", "mha", "layer-norm"],
                      help="the issue's Whisper encoder (static and dynamic), ViT / BERT / "
                      "wav2vec2 (static), the MHA cases against the per-part ideal, or the "
                      "LayerNorm candidates")
    args.add_argument("--rounds", type=int, default=30, help="interleaved timed rounds")
    return args


def _first(model, output="last_hidden_state"):
    """``model`` returning one tensor: ``output`` of its transformers output."""
    from torch import nn

    class First(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return getattr(self.model(*args, return_dict=True), output)

    return First().eval()


def vit():
    import torch
    from transformers import ViTConfig, ViTModel
    torch.manual_seed(0)
    config = ViTConfig(image_size=128, patch_size=16, hidden_size=192, num_hidden_layers=4,
                       num_attention_heads=3, intermediate_size=768)
    return _first(ViTModel(config, add_pooling_layer=False)), (torch.randn(1, 3, 128, 128),)


def bert():
    import torch
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    config = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4,
                        num_attention_heads=4, intermediate_size=1024,
                        max_position_embeddings=256)
    return _first(BertModel(config, add_pooling_layer=False)), \
        (torch.randint(0, 1000, (1, 128)),)


def wav2vec2():
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    torch.manual_seed(0)
    config = Wav2Vec2Config(hidden_size=192, num_hidden_layers=4, num_attention_heads=4,
                            intermediate_size=768, conv_dim=(64, 64, 64), conv_stride=(5, 4, 4),
                            conv_kernel=(10, 4, 4), num_conv_pos_embeddings=16,
                            num_conv_pos_embedding_groups=4)
    return _first(Wav2Vec2Model(config)), (torch.randn(1, 16000),)


MODELS = {"vit": vit, "bert": bert, "wav2vec2": wav2vec2}


def compare_variants(name: str, ep, inputs: tuple, reference, variants, rounds: int) -> dict:
    """Lower, check against ``reference``, time interleaved, profile; print one line each."""
    from xnnfold.pte import STOCK, PteRunner, lower
    from xnnfold.pte.timing import time_interleaved

    lowered, runners = {}, {}
    for variant in variants:
        try:
            lowered[variant] = lower(ep, variant)
            runners[variant] = PteRunner(lowered[variant].pte)
            out = runners[variant].run(inputs)[0]
        except Exception as error:  # noqa: BLE001 - a variant that fails is a finding
            print(f"{name:24s} {variant:10s} FAILED: {type(error).__name__}: "
                  f"{str(error).splitlines()[0][:120]}", flush=True)
            lowered.pop(variant, None)
            runners.pop(variant, None)
            continue
        low = lowered[variant]
        diff = (out - reference).abs().max().item()
        print(f"{name:24s} {variant:10s} delegate calls {low.delegate_calls:3d}, ops outside "
              f"{len(low.ops_outside):3d}, .pte {low.pte_bytes:,} B, max abs diff from the "
              f"converted module {diff:.3g} ({100 * diff / reference.abs().max().item():.2f}% "
              f"of its largest output); outside: {Counter(low.ops_outside).most_common(5)}",
              flush=True)
        if STOCK in lowered and variant != STOCK:
            # the calibrated quantization kept: XNNPACK takes as quantized what it takes so
            # for stock (the attention between computes in fp32, as the converted module)
            same = low.quantized_ops == lowered[STOCK].quantized_ops
            print(f"{name:24s} {variant:10s} ops taken as quantized: "
                  f"{'the same as stock' if same else 'DIFFERENT from stock'} "
                  f"{low.quantized_ops}", flush=True)
    medians = {k: statistics.median(v)
               for k, v in time_interleaved(runners, inputs, rounds).items()}
    profiles = etdump_interleaved(lowered, inputs)
    base, base_total = medians.get(STOCK), profiles.get(STOCK, (None,))[0]
    for variant, (total, portable, top) in profiles.items():
        print(f"{name:24s} {variant:10s} {medians[variant]:8.2f} ms"
              + (f" ({medians[variant] / base:.3f}x stock)" if base else "")
              + f"; ETDump {total:.2f} ms"
              + (f" ({total / base_total:.3f}x stock)" if base_total else "")
              + f", portable {portable:.2f} ms ({100 * portable / total:.1f}%) {top}",
              flush=True)
    return medians


def etdump_interleaved(lowered: dict, inputs: tuple, blocks: int = 5, runs: int = 5) -> dict:
    """{variant: (ms per run, of which portable, top portable ops)} from ETDumps taken in
    ``blocks`` rounds that visit every variant in turn (the machine's drift then hits all
    alike); medians over the blocks."""
    from xnnfold.pte.devtools import DELEGATE, operator_times

    totals: dict = {v: [] for v in lowered}
    portables: dict = {v: [] for v in lowered}
    last: dict = {}
    for _ in range(blocks):
        for variant, low in lowered.items():
            ops = operator_times(low.pte, inputs, runs=runs)
            totals[variant].append(sum(ops.values()))
            portables[variant].append(sum(ops.values()) - ops.get(DELEGATE, 0.0))
            last[variant] = ops
    return {v: (statistics.median(totals[v]), statistics.median(portables[v]),
                [(k, round(ms, 2)) for k, ms in last[v].items() if k != DELEGATE][:5])
            for v in lowered}


def run_whisper(rounds: int) -> None:
    import torch
    from xnnfold.models.sources import pt2e_quantized
    from xnnfold.models.zoo import whisper_encoder
    from xnnfold.pte import STOCK, STOCK_FLAG, XNNFOLD

    for mode in ("static", "dynamic"):
        model, inputs = whisper_encoder()
        converted = pt2e_quantized(model, inputs, mode)
        with torch.no_grad():
            reference = converted(*inputs)
        compare_variants(f"whisper-encoder {mode}", torch.export.export(converted, inputs),
                         inputs, reference, (STOCK, STOCK_FLAG, XNNFOLD), rounds)


def run_models(rounds: int) -> None:
    import torch
    from xnnfold.models.sources import pt2e_quantized
    from xnnfold.pte import STOCK, STOCK_FLAG, XNNFOLD

    for name, build in MODELS.items():
        model, inputs = build()
        converted = pt2e_quantized(model, inputs, "static")
        with torch.no_grad():
            reference = converted(*inputs)
        compare_variants(f"{name} static", torch.export.export(converted, inputs), inputs,
                         reference, (STOCK, STOCK_FLAG, XNNFOLD), rounds)


def run_mha() -> None:
    """Delegate calls, int8 weights, .pte and outputs: the MHA cases, stock and xnnfold, and
    the per-part ideal (separate q/k/v linears) lowered with both."""
    import torch
    from xnnfold import models
    from xnnfold.models.sources import pt2e_quantized
    from xnnfold.pte import STOCK, XNNFOLD, PteRunner, lower

    cases = {"self": lambda: models.attention_case("self"),
             "cross": lambda: models.attention_case("cross"),
             "different k/v": lambda: models.attention_case("kv"),
             "kdim/vdim": lambda: models.attention_case("kv", kdim=12, vdim=10),
             "decoder layer": lambda: models.decoder_case()}
    for mode in ("static", "dynamic"):
        for name, build in cases.items():
            case = build()
            for which, module in (("", case.model), (" ideal", case.ideal)):
                converted = pt2e_quantized(module, case.inputs, mode)
                with torch.no_grad():
                    reference = converted(*case.inputs)
                ep = torch.export.export(converted, case.inputs)
                for variant in (STOCK, XNNFOLD):
                    low = lower(ep, variant)
                    out = PteRunner(low.pte).run(case.inputs)[0]
                    int8 = [c.shape for c in low.delegate_constants if c.dtype == torch.int8]
                    fp32_2d = [c.shape for c in low.delegate_constants
                               if c.dtype == torch.float32 and len(c.shape) == 2]
                    print(f"{mode:7s} {name + which:20s} {variant:8s} delegate calls "
                          f"{low.delegate_calls:2d}, GEMMs outside {len(low.gemms_outside)}, "
                          f"int8 weights {sorted(int8)}, fp32 2-D {fp32_2d}, .pte "
                          f"{low.pte_bytes:,} B, max abs diff "
                          f"{(out - reference).abs().max().item():.2g}", flush=True)


# --------------------------------------------------------------------------------------------
# LayerNorm candidates


def decompose_layer_norms(program, how: str):
    """A copy of ``program`` with each last-dim ``layer_norm`` written with ops XNNPACK takes:
    ``how`` = "mean-dim" (mean.dim over [2, 3] of a [1, rows, D, 1] view) or "linear" (the
    means as linears with a constant 1/D row)."""
    import torch
    from xnnfold.graph.node_meta import tensor_val
    from xnnfold.graph.emit import Emitter, reshape_arg
    from xnnfold.graph.program_copy import copy_program
    from xnnfold.graph.constants import new_constant

    aten = torch.ops.aten
    program = copy_program(program)
    graph = program.graph
    for node in [n for n in graph.nodes if n.target is aten.layer_norm.default]:
        x, shape = node.args[0], node.args[1]
        weight, bias, eps = (list(node.args[2:5]) + [None, None, 1e-5][len(node.args) - 2:])
        width = shape[0]
        emit = Emitter(graph, node)
        if how == "mean-dim":
            x = emit(aten.reshape.default, x, [1, -1, width, 1])

            def mean(t):
                return emit(aten.mean.dim, t, [2, 3], True)
        else:
            row = new_constant(program, f"{node.name}_row", torch.full((1, width), 1 / width))

            def mean(t):
                return emit(aten.linear.default, t, row)
        centered = emit(aten.sub.Tensor, x, mean(x))
        variance = mean(emit(aten.mul.Tensor, centered, centered))
        out = emit(aten.mul.Tensor, centered,
                   emit(aten.rsqrt.default, emit(aten.add.Tensor, variance, eps)))
        if how == "mean-dim":
            out = emit(aten.reshape.default, out, reshape_arg(list(tensor_val(node).shape)))
        if weight is not None:
            out = emit(aten.mul.Tensor, out, weight)
        if bias is not None:
            out = emit(aten.add.Tensor, out, bias)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
    graph.lint()
    program.graph_module.recompile()
    return program


def run_layer_norm(rounds: int) -> None:
    import torch
    from torch import nn
    from xnnfold.models.sources import pt2e_quantized
    from xnnfold.models.zoo import whisper_encoder
    from xnnfold.pte import STOCK, XNNFOLD, PteRunner, lower
    from xnnfold.pte.timing import time_interleaved

    torch.manual_seed(0)
    norm = nn.LayerNorm(384)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    inputs = (torch.randn(1, 1500, 384) * 3 + 1,)
    with torch.no_grad():
        expected = norm(*inputs)
    ep = torch.export.export(norm.eval(), inputs)
    runners = {}
    for how in ("native", "mean-dim", "linear"):
        program = ep if how == "native" else decompose_layer_norms(ep, how)
        low = lower(program, STOCK)
        runners[how] = PteRunner(low.pte)
        out = runners[how].run(inputs)[0]
        print(f"layer norm 1500x384 {how:9s} delegate calls {low.delegate_calls}, ops outside "
              f"{low.ops_outside}, .pte {low.pte_bytes:,} B, max abs diff from eager "
              f"{(out - expected).abs().max().item():.2g}", flush=True)
    medians = {k: statistics.median(v)
               for k, v in time_interleaved(runners, inputs, rounds).items()}
    for how, median in medians.items():
        print(f"layer norm 1500x384 {how:9s} {1000 * median:8.1f} us "
              f"({median / medians['native']:.2f}x native_layer_norm)", flush=True)
    for mode in ("static", "dynamic"):
        model, inputs = whisper_encoder()
        converted = pt2e_quantized(model, inputs, mode)
        ep = torch.export.export(converted, inputs)
        runners = {}
        for how in ("native", "mean-dim"):
            program = ep if how == "native" else decompose_layer_norms(ep, how)
            low = lower(program, XNNFOLD)
            runners[how] = PteRunner(low.pte)
            print(f"whisper-encoder {mode} xnnfold, layer norm {how:9s}: delegate calls "
                  f"{low.delegate_calls}, ops outside {len(low.ops_outside)}, .pte "
                  f"{low.pte_bytes:,} B", flush=True)
        medians = {k: statistics.median(v)
                   for k, v in time_interleaved(runners, inputs, rounds // 3).items()}
        for how, median in medians.items():
            print(f"whisper-encoder {mode} xnnfold, layer norm {how:9s} {median:8.2f} ms "
                  f"({median / medians['native']:.3f}x native)", flush=True)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    torch.set_num_threads(1)
    import executorch.kernels.quantized  # noqa: F401 - the quantized ops' out variants
    {"whisper": lambda: run_whisper(args.rounds), "models": lambda: run_models(args.rounds),
     "mha": run_mha, "layer-norm": lambda: run_layer_norm(args.rounds)}[args.part]()
    return 0


if __name__ == "__main__":
    sys.exit(main())

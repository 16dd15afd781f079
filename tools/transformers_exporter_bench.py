"""Stock against xnnfold in transformers' own exporter (``transformers.exporters``): a BERT and a
ViT from configs (random weights), each exported with transformers' ``ExecutorchExporter`` and
with ``xnnfold.export.transformers_exporter``, run on transformers' ExecuTorch runner, checked
against eager and timed interleaved (one thread). A one-off measurement for
docs/transformers.md::

    .venv/bin/python tools/transformers_exporter_bench.py [--hidden 256] [--layers 4] [--rounds 30]
"""

from __future__ import annotations

import argparse
import time

import torch

from xnnfold.export.llm.runtime import set_threads
from xnnfold.export.transformers import import_transformers
from xnnfold.export.transformers_exporter import XnnfoldConfig, XnnfoldExecutorchExporter, \
    register
from xnnfold.pte import compare_outputs, inspect_lowered
from xnnfold.pte.timing import medians_interleaved


def models(tf, hidden: int, layers: int):
    """(name, model, inputs, the output compared) of each case."""
    common = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
                  intermediate_size=4 * hidden)
    bert = tf.BertModel(tf.BertConfig(vocab_size=1000, **common)).eval()
    vit = tf.ViTModel(tf.ViTConfig(image_size=224, patch_size=16, **common)).eval()
    yield ("BERT, 128 tokens", bert, {"input_ids": torch.randint(0, 1000, (1, 128)),
                                      "attention_mask": torch.ones(1, 128, dtype=torch.long)})
    yield "ViT, 224x224 (196 patches)", vit, {"pixel_values": torch.randn(1, 3, 224, 224)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    tf = import_transformers()
    from transformers.exporters import ExecutorchConfig, ExecutorchExporter

    set_threads(1)
    torch.manual_seed(0)
    register()
    variants = {"stock": (ExecutorchExporter, ExecutorchConfig),
                "xnnfold": (XnnfoldExecutorchExporter, XnnfoldConfig)}
    for name, model, inputs in models(tf, args.hidden, args.layers):
        with torch.no_grad():
            expected = model(**inputs).last_hidden_state
        exported = {}
        for variant, (exporter, config) in variants.items():
            start = time.perf_counter()
            exported[variant] = exporter().export(model, dict(inputs), config())
            seconds = time.perf_counter() - start
            program = exported[variant].program
            ops, calls, _, _ = inspect_lowered(program.exported_program())
            verdict = compare_outputs(exported[variant](**inputs).last_hidden_state, expected)
            print(f"{name:28s} {variant:8s} lowering {seconds:6.1f} s, .pte "
                  f"{len(program.buffer):,} bytes, {calls} delegate calls, "
                  f"{len([op for op in ops if op != 'alloc'])} ops outside, {verdict}", flush=True)

        def measure(model_):
            start = time.perf_counter()
            model_(**inputs)
            return ((time.perf_counter() - start) * 1e3,)

        medians = medians_interleaved(exported, measure, args.rounds, warmup=3)
        stock = medians["stock"][0]
        for variant, (median,) in medians.items():
            print(f"{name:28s} {variant:8s} {median:8.2f} ms median of {args.rounds} "
                  f"({median / stock:.2f}x stock)", flush=True)


if __name__ == "__main__":
    main()

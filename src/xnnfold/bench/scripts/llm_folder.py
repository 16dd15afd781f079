"""A random-weight transformers folder at a named model's real dims (config.json, weights as
safetensors written tensor by tensor, a tokenizer.json of exactly its vocabulary), for measuring
`xnnfold hf` at real size; writing an 8B folder holds a few tens of MB, not the weights.

    xnnfold bench llm-folder MODEL -o DIR [--layers N] [--dtype bfloat16|float32] [--seed 0]

MODEL: smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, llama-3.2-3b, llama-3.1-8b (their published
configs; tied heads as they are). ``--layers`` keeps every per-layer shape and cuts the depth
(an export's cost per layer, measured faster). ``--dtype``: how the weights are stored and what
config.json says (``bfloat16``, the default, as the models are published; `xnnfold hf` loads
either as float32). Weights N(0, 0.02), norms 1, biases 0, seeded.
"""

from __future__ import annotations

import sys

from xnnfold.bench.scripts import parser

MODELS = ("smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b")


def build_parser():
    args = parser(__file__, __doc__)
    args.add_argument("model", choices=MODELS, help="the model whose dims the folder has")
    args.add_argument("-o", "--output", required=True, help="the folder to write (created)")
    args.add_argument("--layers", type=int, help="decoder layers (default: the model's)")
    args.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                      help="the stored weights' type, and config.json's")
    args.add_argument("--seed", type=int, default=0, help="seed of the weights")
    return args


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.layers is not None and args.layers < 1:
        print(f"xnnfold: error: bench llm-folder: --layers {args.layers}: at least 1",
              file=sys.stderr)
        return 2
    import time
    from pathlib import Path

    from xnnfold.bench.random_folder import write_folder

    start = time.perf_counter()
    written = write_folder(Path(args.output), args.model, args.layers, args.dtype, args.seed)
    config = written["config"]
    print(f"{args.output}: {config['architectures'][0]} at {args.model}'s dims "
          f"({config['num_hidden_layers']} layers, hidden {config['hidden_size']}, vocabulary "
          f"{config['vocab_size']:,}), {written['parameters']:,} parameters, "
          f"{written['bytes'] / 2**30:.2f} GiB of {args.dtype} weights, random; "
          f"tokenizer.json of {config['vocab_size']:,} ids; "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``xnnfold hf``: transformers models saved with save_pretrained in a local folder (toy
configs, random weights) to .pte files through xnnfold, each checked against eager on the
runtime; a causal LM's generation-ready .pte (``xnnfold.export.llm``) against eager transformers'
greedy generation; ``xnnfold generate``."""

from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch import nn

from conftest import seed_everything
from xnnfold import cli
from xnnfold.export import hf
from xnnfold.export.hf import plan as hf_plan
from xnnfold.pte.compare import compare_outputs, quantized_tolerance
from xnnfold.export.transformers import import_transformers
from xnnfold.pte import run_pte


def _saved(folder, model):
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture
def tf():
    # a test requirement: a failure to import fails the tests. Not module-scoped (an import
    # costs nothing twice): a module fixture ties every test using it to one worker (conftest)
    return import_transformers()


def _rows(printed: str) -> dict:
    """{(part, variant): [cells]} of the table ``xnnfold hf`` prints."""
    return {tuple(line.split()[:2]): line.split() for line in printed.splitlines()
            if line.split()[1:2] in (["stock"], ["xnnfold"])}


def test_whisper_encoder_and_decoder_step_with_the_stock_comparison(tf, tmp_path, capsys):
    """--no-cache: the encoder and one decoder step, two .pte files (the generation .pte of a
    Whisper folder, the default: tests/test_seq2seq.py)."""
    torch.manual_seed(0)
    config = tf.WhisperConfig(vocab_size=512, num_mel_bins=16, d_model=64, encoder_layers=1,
                              decoder_layers=1, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, max_source_positions=50,
                              max_target_positions=16, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2, decoder_start_token_id=1)
    folder = _saved(tmp_path / "whisper", tf.WhisperForConditionalGeneration(config))
    assert cli.main(["hf", str(folder), "-o", str(tmp_path / "w.pte"), "--compare",
                     "--reps", "2", "--no-cache"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert set(rows) == {(p, v) for p in ("encoder", "decoder") for v in ("stock", "xnnfold")}
    assert all(cells[2] == "0" for cells in rows.values()), rows        # GEMMs outside
    assert all(cells[5:8] == ["max", "abs", "diff"] for cells in rows.values()), rows
    # the decoder's head is tied to the token table: stock stores it twice, xnnfold once
    assert int(rows["decoder", "xnnfold"][4].replace(",", "")) < \
        int(rows["decoder", "stock"][4].replace(",", "")), rows
    features = torch.randn(1, 16, 100)
    (states,) = run_pte((tmp_path / "w.encoder.pte").read_bytes(), (features,))
    assert states.shape == (1, 50, 64)


def test_causal_lm_logits_without_a_cache(tf, tmp_path, capsys):
    """Logits of 4,000 words at a scale of 25 (larger weights than transformers' default):
    stock's .pte and xnnfold's differ from eager by 4.1e-5 on a logit of 0.024, beyond a
    fixed 1e-5 + 1e-4 * |logit| (the command said WRONG and exited 1), within the generation
    check's comparison at the scale of the row."""
    torch.manual_seed(0)
    gpt2 = _saved(tmp_path / "gpt2", tf.GPT2LMHeadModel(tf.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=4000, n_positions=16,
        initializer_range=1.0)))
    assert cli.main(["hf", str(gpt2), "-o", str(tmp_path / "lm.pte"), "--no-cache"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert set(rows) == {("model", "xnnfold")} and rows["model", "xnnfold"][2] == "0", rows
    assert rows["model", "xnnfold"][5:8] == ["max", "abs", "diff"], rows
    (logits,) = run_pte((tmp_path / "lm.pte").read_bytes(), (torch.randint(0, 4000, (1, 8)),))
    assert logits.shape == (1, 8, 4000)
    # GPT-2's lm_head is an nn.Linear tied to the token table: --prefer size stores it once
    assert cli.main(["hf", str(gpt2), "-o", str(tmp_path / "lm-size.pte"), "--prefer",
                     "size", "--no-cache"]) == 0
    capsys.readouterr()
    default, size = ((tmp_path / f).stat().st_size for f in ("lm.pte", "lm-size.pte"))
    assert size < default - 4000 * 32 * 4 * 0.9, (size, default)


def test_vit_classifier_gives_its_logits(tf, tmp_path, capsys):
    """Issue 31: the class config.json names, not the base model (whose .pte returned hidden
    states (1, 5, 32) where the classifier's logits are (1, 5))."""
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(tf.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=16, patch_size=8, num_labels=5)).eval()
    folder = _saved(tmp_path / "vit", model)
    assert cli.main(["hf", str(folder), "-o", str(tmp_path / "vit.pte")]) == 0
    printed = capsys.readouterr().out
    rows = _rows(printed)
    assert rows["model", "xnnfold"][5:8] == ["max", "abs", "diff"], rows
    assert printed.splitlines()[-1] == f"{tmp_path / 'vit.pte'}: takes pixel_values " \
        "(1, 3, 16, 16) float32, these shapes only", printed
    image = torch.randn(1, 3, 16, 16)
    (logits,) = run_pte((tmp_path / "vit.pte").read_bytes(), (image,))
    with torch.no_grad():
        expected = model(pixel_values=image).logits
    assert compare_outputs([logits], expected).ok and logits.shape == (1, 5)


def test_text_classifier_seq2seq_and_clip(tf, tmp_path, capsys):
    """What issue 31 saw refused after 20 s of loading: a BERT classifier (input ids and a
    mask), T5 (encoder + decoder step) and CLIP (text and vision encoders), each checked
    against eager by default."""
    torch.manual_seed(0)
    folders = {
        "bert": tf.BertForSequenceClassification(tf.BertConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            vocab_size=100, max_position_embeddings=16, num_labels=3)),
        "t5": tf.T5ForConditionalGeneration(tf.T5Config(
            d_model=32, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=16,
            vocab_size=100)),
        "clip": tf.CLIPModel(tf.CLIPConfig(
            text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, vocab_size=100, max_position_embeddings=16,
                             bos_token_id=0, eos_token_id=2, pad_token_id=1),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, image_size=16, patch_size=8),
            projection_dim=16))}
    parts = {"bert": ["model"], "t5": ["encoder", "decoder"], "clip": ["text", "vision"]}
    for name, model in folders.items():
        folder = _saved(tmp_path / name, model)
        uncached = ["--no-cache"] if name == "t5" else []      # T5 generates: tests/test_t5.py
        assert cli.main(["hf", str(folder), "-o", str(tmp_path / f"{name}.pte"),
                         *uncached]) == 0, name
        printed = capsys.readouterr().out
        rows = _rows(printed)
        assert sorted(p for p, _ in rows) == sorted(parts[name]), rows
        assert all(r[2] == "0" and r[5:8] == ["max", "abs", "diff"] for r in rows.values())
        # the shapes each .pte takes (fixed), said
        takes = [line.split(": takes ")[1] for line in printed.splitlines() if ": takes " in line]
        assert takes == {
            "bert": ["input_ids (1, 8) int64, attention_mask (1, 8) int64, these shapes only "
                     "(--tokens 8 sets the text's length)"],
            "t5": ["input_ids (1, 8) int64, attention_mask (1, 8) int64, these shapes only "
                   "(--tokens 8 sets the text's length)",
                   "tokens (1, 8) int64, states (1, 8, 32) float32, these shapes only "
                   "(--tokens 8 sets the text's length)"],
            "clip": ["input_ids (1, 8) int64, attention_mask (1, 8) int64, these shapes only "
                     "(--tokens 8 sets the text's length)",
                     "pixel_values (1, 3, 16, 16) float32, these shapes only"]}[name], printed
    ids, mask = torch.randint(0, 100, (1, 8)), torch.ones(1, 8, dtype=torch.long)
    mask[0, 5:] = 0
    (logits,) = run_pte((tmp_path / "bert.pte").read_bytes(), (ids, mask))
    with torch.no_grad():
        expected = folders["bert"].eval()(input_ids=ids, attention_mask=mask).logits
    assert logits.shape == (1, 3) and compare_outputs([logits], expected).ok


def test_a_wrong_pte_exits_1_and_no_check_skips(tf, tmp_path, capsys, monkeypatch):
    torch.manual_seed(0)
    folder = _saved(tmp_path / "vit", tf.ViTModel(tf.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        image_size=16, patch_size=8)))
    from xnnfold.pte import compare
    capsys.readouterr()                                 # save_pretrained's progress bar
    wrong = compare.Comparison(False, 1.0, 1.0, "output 0: max abs diff 1 (for the test)")
    monkeypatch.setattr(compare, "compare_outputs", lambda actual, expected, **how: wrong)
    assert cli.main(["hf", str(folder), "-o", str(tmp_path / "v.pte")]) == 1
    captured = capsys.readouterr()
    assert "WRONG: output 0" in captured.out
    assert captured.err.strip().splitlines()[-1] == (f"xnnfold: error: {tmp_path / 'v.pte'}: WRONG: output 0: "
                                    "max abs diff 1 (for the test) (eager's outputs differ; "
                                    "the .pte is written, do not ship it)")
    assert cli.main(["hf", str(folder), "-o", str(tmp_path / "v.pte"), "--no-check"]) == 0
    assert _rows(capsys.readouterr().out)["model", "xnnfold"][5:7] == ["not", "checked"]


def test_a_folder_without_a_config_is_one_line(tf, tmp_path, capsys):
    assert cli.main(["hf", str(tmp_path), "-o", str(tmp_path / "x.pte")]) == 2
    assert capsys.readouterr().err.strip() == \
        f"xnnfold: error: {tmp_path}: no config.json (save the model with save_pretrained)"


# --- generation: one lowering per architecture ------------------------------------------------

# Larger random weights than transformers' default (0.02), so that greedy tokens depend on the
# context instead of settling on one token, and the best logit leads the next by a margin
# far above rounding.
_LM = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
           initializer_range=0.3)
ARCHITECTURES = {
    "llama": lambda tf: tf.LlamaForCausalLM(tf.LlamaConfig(**_LM)),                  # GQA
    "qwen2": lambda tf: tf.Qwen2ForCausalLM(tf.Qwen2Config(                 # q/k/v biases,
        tie_word_embeddings=True, **_LM)),                                  # tied head
    "phi3": lambda tf: tf.Phi3ForCausalLM(tf.Phi3Config(                   # fused qkv and
        pad_token_id=0, **_LM)),                                            # gate/up
    # a sliding window (8) shorter than the prompt, beside a global layer; the exact GELU:
    # XNNPACK 1.5.1 computes Gemma's tanh GELU as the exact one (SPEC, round four); an untied
    # head: with the tied one, the embedding (scaled by sqrt(hidden)) outweighs what random
    # layers add and greedy decoding repeats one token
    "gemma3": lambda tf: tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(
        head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
        hidden_activation="gelu", tie_word_embeddings=False, **_LM)),
    # learned positions, fused c_attn (Conv1D), tied head
    "gpt2": lambda tf: tf.GPT2LMHeadModel(tf.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=256,
        initializer_range=0.3)),
}
# llama's weights again, its .pte written with llm_kernels=True: the cache updated in place
# by llama::update_cache, attended by llama::custom_sdpa
LLM_KERNELS = "llama-llm-kernels"
# llama's weights again, its linears quantized (xnnfold hf --quantize)
W4, INT8 = "llama-8da4w", "llama-int8"
QUANTIZED = {W4: "8da4w", INT8: "int8"}
CACHE, PREFILL, PROMPT, NEW = 56, 16, 20, 32      # the prompt goes in as two prefill chunks
# qwen2 asks for more rows than its 64 positions (the README's max_cache=1024): it gets 64, and
# the notes `xnnfold hf` prints say so
ASKED_CACHE, CACHE_ROWS = {"qwen2": 1024}, {"qwen2": 64}


# In the slow set: the quantized exports (the longest of the set: 170 s for 8da4w on a loaded
# machine; tests/unit/test_llm_generation_parts.py checks the quantization itself), Phi-3
# (its fused projections are the fold's, tested on their own; ~35 s of make test's 15 minutes),
# Qwen2 and Gemma3 (~20 and ~27 s: the KV-cache step on both is in test_kv_cache, Gemma's
# tanh GELU in test_exact_gelu)
SLOW = {*QUANTIZED, "phi3", "qwen2", "gemma3"}


@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name
    for name in (*ARCHITECTURES, LLM_KERNELS, *QUANTIZED)])
def generation(request, tmp_path_factory):
    """A causal LM saved with a tokenizer.json, through ``hf`` into another folder (its check
    included; llama also beside stock, timed), and the same weights loaded back for eager
    (quantized as the .pte's)."""
    name = request.param
    if name not in _GENERATIONS:
        _GENERATIONS[name] = _generation(name, import_transformers(), tmp_path_factory)
    return _GENERATIONS[name]


# Each worker's exports, by architecture: pytest tears a parametrized module fixture down when
# the next test wants another parameter and builds it again when one wants it back (the llama
# export, 50 s, was built three times per run); the files live as long as the session.
_GENERATIONS: dict = {}


def _generation(name, tf, tmp_path_factory):
    from byte_tokenizer import byte_level_tokenizer

    from xnnfold.export.llm.export import quantized_copy

    architecture = name.split("-")[0]
    seed_everything(f"generation-{architecture}")
    folder = _saved(tmp_path_factory.mktemp(name), ARCHITECTURES[architecture](tf))
    byte_level_tokenizer(folder / "tokenizer.json", _LM["vocab_size"])
    pte = tmp_path_factory.mktemp(f"{name}-pte") / "generate.pte"
    asked = ASKED_CACHE.get(name, CACHE)
    plan = hf_plan.plan(str(folder), 8, True, asked, PREFILL)
    exported = hf.export_folder(plan, str(pte), compare=name == "llama", reps=2,
                                max_cache=asked, max_prefill=PREFILL,
                                llm_kernels=name == LLM_KERNELS, quantize=QUANTIZED.get(name))
    eager = tf.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    if name in QUANTIZED:
        eager = quantized_copy(eager, QUANTIZED[name])
    eager.generation_config.eos_token_id = None          # 32 tokens, as the .pte's run
    return Generated(name, pte, exported, eager, folder)


class Generated(NamedTuple):
    name: str
    pte: Path                  # written by hf in a folder of its own
    exported: object           # what hf returned
    eager: object              # the folder's model (quantized as the .pte's)
    folder: Path               # the saved model, with its tokenizer.json


def test_hf_writes_one_checked_pte_with_one_forward(generation):
    from executorch.runtime import Runtime

    name, pte, exported, _, _ = generation
    assert exported.wrong == []
    mine = {r["part"]: r for r in exported.rows if r["written"]}
    assert set(mine) == {"prefill", "decode"}            # the two phases of forward
    for row in mine.values():
        assert row["outputs"].startswith("max abs diff") and row["gemms_outside"] == 0, row
    methods = set(Runtime.get().load_program(pte.read_bytes()).method_names)
    # one method takes the cache (executorch's runner gives each method memory of its own)
    assert {m for m in methods if not m.startswith(("get_", "use_", "enable_"))} == {"forward"}
    assert {"get_max_context_len", "get_max_seq_len", "enable_dynamic_shape"} <= methods
    rows = CACHE_ROWS.get(name, CACHE)
    assert any(f"over a static KV cache of {rows} rows" in n for n in exported.notes), \
        exported.notes
    capped = [n for n in exported.notes if "is beyond" in n]
    assert capped == (["--max-cache 1024 is beyond the model's 64 positions: a cache of 64 "
                       "rows"] if name in ASKED_CACHE else []), exported.notes
    # the folder's tokenizer beside the .pte, and the runner's command lines printed
    assert (pte.parent / "tokenizer.json").read_bytes() == \
        (generation.folder / "tokenizer.json").read_bytes()
    runner = [n for n in exported.notes if n.startswith("executorch's runner")]
    assert len(runner) == 2 and all(str(pte.parent / "tokenizer.json") in n for n in runner)
    assert ("custom_ops" in runner[0]) == (name == LLM_KERNELS)


def _calls(pte) -> dict:
    """{method: {operator: how many kernel calls of it the plan makes outside delegates}},
    read from the .pte itself."""
    from collections import Counter

    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import KernelCall

    program = deserialize_pte_binary(pte.read_bytes()).program
    return {plan.name: Counter(plan.operators[i.instr_args.op_index].name
                               for chain in plan.chains for i in chain.instructions
                               if isinstance(i.instr_args, KernelCall))
            for plan in program.execution_plan}


def test_forward_runs_on_the_kernels_asked_for(generation):
    """Default: XNNPACK and portable only, the cache repeated nowhere (at most one
    expand_copy, the mask's: repeat_kv makes two per layer) and updated in place (index_put_,
    no copy_ back); llm_kernels: the cache updated in place and attended with custom_sdpa, as
    executorch's flow."""
    name, pte, _, _, _ = generation
    ops = _calls(pte)["forward"]
    # GQA's repeat_kv; the kv_cache step does not take a sliding layer yet (issue 36)
    assert ops["aten::expand_copy"] <= (2 if name == "gemma3" else 1), ops
    if name == LLM_KERNELS:
        # two layers: a key and a value update each, one attention each
        assert (ops["llama::update_cache"], ops["llama::custom_sdpa"]) == (4, 2), ops
        assert "aten::index_put" not in ops, ops
    else:
        assert not any(op.startswith("llama::") for op in ops), ops
        # the cache's rows written in place (run_reinplace_pass), no copy of it back
        assert "aten::index_put" not in ops, ops
        if name != "gemma3":         # its sliding layer's cache is written another way
            # the copy_ left write each layer's one-element cumulative_length
            # (transformers' StaticCache); the cache's copy would make them 6
            assert ops["aten::index_put_"] == 4 and ops["aten::copy_"] == 2, ops


def _eager_tokens(eager, prompt: list, new: int) -> tuple:
    """(eager transformers' greedy tokens after ``prompt``, their logits)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        reference = eager.generate(ids, max_new_tokens=new, do_sample=False,
                                   attention_mask=torch.ones_like(ids), output_logits=True,
                                   return_dict_in_generate=True)
    return reference.sequences[0, len(prompt):].tolist(), torch.cat(reference.logits)


def _margin_kept(logits: torch.Tensor) -> None:
    """A test whose argmax could flip on rounding would not test the cache: the best logit
    leads the next by more than fp32 rounding."""
    top = logits.topk(2).values
    assert float((top[:, 0] - top[:, 1]).min()) > 1e-3


def test_greedy_tokens_equal_eager_transformers(generation):
    """fp32: the .pte's greedy tokens are eager's and so are its logits, within rounding.
    Quantized: XNNPACK's integer kernels differ from torchao's eager simulation of them (by
    ~3% of the largest logit with 8da4w, stock's .pte as much; its 4-bit groups' scales are
    bf16), so eager is fed the .pte's tokens: each step's logits within the quantized tolerance,
    and the .pte's token eager's best wherever eager's best leads by more than twice that row's
    error."""
    from xnnfold.export.llm import Generator

    name, pte, _, eager, _ = generation
    seed_everything(f"prompt-{name}")
    prompt = torch.randint(0, _LM["vocab_size"], (PROMPT,)).tolist()
    generator = Generator(pte)
    assert (generator.max_cache, generator.max_prefill) == (CACHE_ROWS.get(name, CACHE),
                                                            PREFILL)
    run = generator.generate(prompt, NEW, stop_at_eos=False, keep_logits=True)
    logits = torch.cat(run.logits)
    assert len(set(run.tokens)) > NEW // 4, run.tokens           # not one token repeated
    assert run.decode_steps == NEW - 1
    if name not in QUANTIZED:
        tokens, expected = _eager_tokens(eager, prompt, NEW)
        _margin_kept(expected)
        assert run.tokens == tokens
        verdict = compare_outputs(logits, expected, per_row=True)
        assert verdict.ok, verdict
        return
    with torch.no_grad():            # eager on the .pte's sequence, at once (no cache)
        expected = eager(input_ids=torch.tensor([prompt + run.tokens[:-1]])).logits[0, PROMPT - 1:]
    verdict = compare_outputs(logits, expected, **quantized_tolerance(expected))
    assert verdict.ok, verdict
    top = expected.topk(2)
    # where eager's best leads by more than twice the row's error, no rounding flips it
    decided = (top.values[:, 0] - top.values[:, 1]) > 2 * (logits - expected).abs().amax(1)
    assert int(decided.sum()) >= NEW // 2, decided                # the test decides enough
    assert torch.equal(torch.tensor(run.tokens)[decided], top.indices[decided, 0])


def test_executorch_runner_generates_eager_tokens(generation):
    """executorch's own runner (TextLLMRunner, the C++ behind llama_main and the demo apps)
    on the .pte and the tokenizer `xnnfold hf` put beside it: a text prompt longer than one
    prefill chunk, then greedy decoding; the pieces it prints are eager's tokens', one by one,
    up to an EOS id the .pte names (where the runner stops). A quantized .pte: its own greedy
    tokens on xnnfold's Generator (checked against eager above), the same program and kernels."""
    from byte_tokenizer import sentence
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from xnnfold.export.llm import Generator
    from xnnfold.export.llm.text import RunnerTokenizer
    from xnnfold.pte.runner import load_llm_kernels

    name, pte, _, eager, _ = generation
    tokenizer = RunnerTokenizer(pte.parent / "tokenizer.json")
    text = sentence(6, seed=1)
    prompt = tokenizer.encode(text)
    assert PREFILL < len(prompt) <= CACHE - NEW, len(prompt)    # two chunks, room for NEW
    generator = Generator(pte)
    if name in QUANTIZED:
        tokens = generator.generate(prompt, NEW, stop_at_eos=False).tokens
    else:
        tokens, logits = _eager_tokens(eager, prompt, NEW)
        _margin_kept(logits)
    ends = [i for i, t in enumerate(tokens) if t in generator.eos_ids]
    tokens = tokens[:ends[0] + 1] if ends else tokens
    assert len(tokens) > NEW // 2 and len(set(tokens)) > len(tokens) // 4, tokens

    load_llm_kernels(pte.read_bytes())            # --llm-kernels: the llama:: kernels
    runner = TextLLMRunner(str(pte), str(pte.parent / "tokenizer.json"))
    pieces, stats = [], []
    runner.generate(text, GenerationConfig(echo=False, max_new_tokens=NEW, temperature=0.0),
                    pieces.append, stats.append)
    assert stats[0].num_prompt_tokens == len(prompt)
    assert pieces == [tokenizer.piece(t) for t in tokens]


@pytest.mark.parametrize("generation", ["llama"], indirect=True)
def test_beside_stock_timed(generation):
    _, pte, exported, _, _ = generation
    rows = {(r["part"], r["variant"]): r for r in exported.rows}
    assert set(rows) == {(m, v) for m in ("prefill", "decode") for v in ("stock", "xnnfold")}
    assert all(r["outputs"].startswith("max abs diff") for r in rows.values()), rows
    assert all(r["median_ms"] > 0 for r in rows.values())
    # the weights once, and no more than stock
    assert rows["decode", "xnnfold"]["pte_bytes"] <= rows["decode", "stock"]["pte_bytes"]
    weights = sum(p.numel() * 4 for p in generation[3].parameters())
    assert rows["decode", "xnnfold"]["pte_bytes"] < 1.5 * weights
    timed = [n.split(":")[0] for n in exported.notes if "tokens/s" in n]
    assert timed == ["stock", "xnnfold"]


@pytest.mark.parametrize("generation", ["llama"], indirect=True)
def test_generate_command(generation, capsys):
    """Token ids in, token ids out; text in (the tokenizer beside the .pte), the runner's
    text out; sampled with a seed: the same tokens twice, not greedy's."""
    from xnnfold.export.llm.text import RunnerTokenizer

    _, pte, _, eager, _ = generation
    tokenizer = RunnerTokenizer(pte.parent / "tokenizer.json")
    assert cli.main(["generate", str(pte), "--tokens", "1,2,3", "--max-new", "32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("prompt: 3 token(s); generated 32: ")
    printed = [int(t) for t in lines[1].split(": ")[-1].split(",")]
    assert printed == _eager_tokens(eager, [1, 2, 3], 32)[0]
    assert lines[0] == tokenizer.decode(printed)             # the tokenizer beside the .pte
    assert lines[2].startswith("prefill: 3 token(s) in ") and "tokens/s" in lines[2]
    assert lines[3].startswith("decode: 31 step(s) in ") and "tokens/s" in lines[3]

    text = "the quick brown fox"
    assert cli.main(["generate", str(pte), "--prompt", text, "--max-new", "12",
                     "--ignore-eos"]) == 0
    lines = capsys.readouterr().out.splitlines()
    greedy = _eager_tokens(eager, tokenizer.encode(text), 12)[0]
    assert lines[0] == tokenizer.decode(greedy)
    assert lines[1].endswith(",".join(map(str, greedy)))
    sampled = []
    for seed in ("7", "7"):
        assert cli.main(["generate", str(pte), "--prompt", text, "--max-new", "12",
                         "--ignore-eos", "--temperature", "1", "--top-p", "0.9",
                         "--seed", seed]) == 0
        sampled.append(capsys.readouterr().out.splitlines()[1])
    assert sampled[0] == sampled[1] and not sampled[0].endswith(",".join(map(str, greedy)))


@pytest.mark.parametrize("generation", ["llama"], indirect=True)
def test_generate_bad_input_is_one_line(generation, capsys, tmp_path):
    """One test for the cases: a test of its own each could land on another xdist worker,
    which would export the llama .pte again (50 s) for a check of the arguments."""
    _, pte, _, _, _ = generation
    alone = tmp_path / "alone.pte"                     # no tokenizer beside it
    alone.write_bytes(pte.read_bytes())
    for argv, message in [
            ([str(pte), "--tokens", "1,x"], "--tokens '1,x': expected comma-separated token ids"),
            ([str(pte), "--tokens", "1", "--max-new", "0"],
             "--max-new 0: generate at least one token"),
            ([str(pte), "--tokens", "999"], "token 999 is outside the vocabulary (0 to 255)"),
            ([str(pte), "--tokens", "1,2", "--max-new", "60"], "2 prompt token(s) at position "
             "0 leave room for 55 new token(s) in this .pte's 56 cache rows"),
            # the prompt alone too long: said as such, not as the warm-up's "+ 2 new"
            ([str(pte), "--tokens", ",".join(["1"] * 60), "--max-new", "5"], "60 prompt "
             "token(s) at position 0 need 60 cache rows; this .pte has 56"),
            ([str(pte), "--tokens", "1", "--top-p", "0"], "--top-p 0.0: more than 0, at most 1"),
            ([str(alone), "--prompt", "hi"], f"--prompt: no tokenizer beside {alone} "
             "(tokenizer.json, tokenizer.model): give --tokenizer, or --tokens ids")]:
        assert cli.main(["generate", *argv]) == 2, argv
        assert capsys.readouterr().err.strip().endswith(message), argv
    # a prompt that fills the cache takes one new token (from prefill): the warm-up asks
    # no more than that
    assert cli.main(["generate", str(pte), "--tokens", ",".join(["1"] * 56),
                     "--max-new", "1"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.splitlines()[1].startswith(
        "prompt: 56 token(s); generated 1: ")


# --- the cache is shared between the methods, or the lowering says so ------------------------

class _Counter(nn.Module):
    """A buffer each call adds its input to: what one method writes, the other must read."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4), persistent=False)

    def forward(self, x):
        self.total.add_(x.sum(0))
        return self.total.clone()


def _two_methods():
    from xnnfold.export.llm.export import GenerationPrograms

    counter = _Counter()
    with torch.no_grad():
        return GenerationPrograms({
            "prefill": torch.export.export(counter, (torch.ones(2, 4),)),
            "decode": torch.export.export(counter, (torch.ones(1, 4),))})


def test_the_buffer_written_by_one_method_is_read_by_the_other():
    from executorch.runtime import Runtime

    from xnnfold.export.llm import lower_generation

    program = Runtime.get().load_program(lower_generation(_two_methods(),
                                                          arenas_shared=True).pte)
    first = program.load_method("prefill").execute((torch.ones(2, 4),))[0]
    second = program.load_method("decode").execute((torch.full((1, 4), 3.0),))[0]
    assert first.tolist() == [2.0] * 4 and second.tolist() == [5.0] * 4


def test_without_the_shared_arena_the_lowering_refuses(monkeypatch):
    from executorch.exir import ExecutorchBackendConfig

    from xnnfold.export.llm import export

    monkeypatch.setattr(export, "emit_config", lambda: ExecutorchBackendConfig())
    with pytest.raises(export.CacheNotShared, match="buffer total is not at one shared place "
                       "in prefill and decode"):
        export.lower_generation(_two_methods(), arenas_shared=True)


# --- executorch's runner shares no memory between methods: one method, or wrong text ---------

class _CacheLM(nn.Module):
    """The smallest causal LM with a cache: each token's embedding written at its position,
    the logits of the mean of the rows up to the last position. What a method reads from the
    cache decides the next token."""

    def __init__(self, vocab: int = 256, rows: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.head = nn.Linear(16, vocab)
        self.register_buffer("cache", torch.zeros(rows, 16), persistent=False)

    def forward(self, input_ids, cache_position):
        self.cache.index_copy_(0, cache_position, self.embed(input_ids[0]))
        seen = (torch.arange(self.cache.shape[0]) <= cache_position[-1]).float()
        return self.head((seen @ self.cache / seen.sum()).reshape(1, 1, -1))


def _cache_lm_pte(methods: dict) -> bytes:
    """``_CacheLM`` lowered with the methods ``{name: prefill length or 1}``, the runner's
    metadata beside them."""
    from xnnfold.export.llm import lower_generation
    from xnnfold.export.llm.export import GenerationPrograms

    torch.manual_seed(0)
    model = _CacheLM()
    programs = {}
    for method, longest in methods.items():
        shapes = None
        if longest > 1:
            tokens = torch.export.Dim("tokens", min=1, max=longest)
            shapes = {"input_ids": {1: tokens}, "cache_position": {0: tokens}}
        example = min(2, longest)
        with torch.no_grad():
            programs[method] = torch.export.export(
                model, (torch.zeros(1, example, dtype=torch.long), torch.arange(example)),
                dynamic_shapes=shapes)
    metadata = {"get_max_seq_len": max(methods.values()), "get_max_context_len": 32,
                "get_vocab_size": 256, "use_kv_cache": True, "enable_dynamic_shape": True,
                "get_eos_ids": [300]}
    return lower_generation(GenerationPrograms(programs, metadata),
                            arenas_shared=len(programs) > 1).pte


def test_the_runner_reads_a_cache_only_within_one_method(tmp_path):
    """Why xnnfold's generation .pte has one method: executorch's runner loads each method
    with memory of its own, so on the two-method layout xnnfold wrote before (prefill and
    decode over one cache) every token after the first is computed from a cache prefill never
    wrote, silently; the same program as one forward gives eager's tokens. xnnfold's Generator
    refuses the old layout with one line."""
    from byte_tokenizer import byte_level_tokenizer, sentence
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from xnnfold.export.llm import Generator, NotAGenerationProgram
    from xnnfold.export.llm.text import RunnerTokenizer

    byte_level_tokenizer(tmp_path / "tokenizer.json", 256)
    tokenizer = RunnerTokenizer(tmp_path / "tokenizer.json")
    text = sentence(3, seed=2)
    prompt = tokenizer.encode(text)
    torch.manual_seed(0)
    eager, tokens, logits = _CacheLM(), [], None
    with torch.no_grad():
        logits = eager(torch.tensor([prompt]), torch.arange(len(prompt)))
        for position in range(len(prompt), len(prompt) + 12):
            tokens.append(int(logits.argmax()))
            logits = eager(torch.tensor([[tokens[-1]]]), torch.tensor([position]))
    texts = {}
    for layout, methods in {"one": {"forward": 8}, "two": {"prefill": 8, "decode": 1}}.items():
        pte = tmp_path / f"{layout}.pte"
        pte.write_bytes(_cache_lm_pte(methods))
        pieces = []
        TextLLMRunner(str(pte), str(tmp_path / "tokenizer.json")).generate(
            text, GenerationConfig(echo=False, max_new_tokens=12, temperature=0.0),
            pieces.append)
        texts[layout] = pieces
    expected = [tokenizer.piece(t) for t in tokens]
    assert len(set(tokens)) > 3, tokens
    assert texts["one"] == expected
    assert texts["two"][0] == expected[0] and texts["two"] != expected
    with pytest.raises(NotAGenerationProgram, match="methods prefill and decode: the "
                       "two-method layout of an older xnnfold"):
        Generator(tmp_path / "two.pte")


def test_several_methods_writing_the_cache_are_refused_for_the_runner():
    """A program whose methods each write the cache runs right only where they share arenas:
    lower_generation refuses it unless told so (executorch's LLM runner does not share)."""
    from xnnfold.export.llm import export

    with pytest.raises(export.CacheNotShared, match="methods decode and prefill each write "
                       "mutable buffers: executorch's LLM runner gives each method memory of "
                       "its own"):
        export.lower_generation(_two_methods())


def test_the_pass_and_the_runtime_helper_import_no_transformers():
    import subprocess
    import sys

    code = ("import sys, xnnfold.partitioner, xnnfold.export.llm, xnnfold.export.llm.runtime, "
            "xnnfold.export.llm.export; from xnnfold.export.llm import Generator; "
            "assert 'transformers' not in sys.modules, 'transformers imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    code = "import sys, xnnfold.partitioner; assert 'xnnfold.export.llm' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_api_caps_the_sizes_as_the_command_does_and_says_so(tf):
    """The README's ``causal_lm_to_pte(model, max_cache=1024, max_prefill=128)`` raised
    ValueError on a model of fewer positions, where ``xnnfold hf`` capped its default
    silently: both cap (the same function) and say it, a warning here, a note there."""
    from xnnfold.export.llm import export

    model = tf.LlamaForCausalLM(tf.LlamaConfig(**dict(_LM, max_position_embeddings=48)))
    with pytest.warns(UserWarning) as warned:
        assert export.sizes(model, 1024, 128) == (48, 48)
    assert [str(w.message) for w in warned] == [
        "LlamaForCausalLM: max_cache 1024 is beyond the model's 48 positions: a cache of 48 "
        "rows", "LlamaForCausalLM: max_prefill 128 is beyond the cache's 48 rows: prefills of "
        "up to 48 tokens"]


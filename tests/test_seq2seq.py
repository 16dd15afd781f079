"""Encoder-decoder generation (``xnnfold.export.seq2seq``, issue 35): Whisper and BART folders
(test-sized configs, random weights) through ``xnnfold hf`` (one lowering each), then run
through the calls executorch's speech runner makes: ``encoder`` once, ``text_decoder`` one
token per call with the encoder's output handed back as is. Greedy tokens against transformers'
``generate`` (Whisper: its prompt and processors, the language detected or given); the cross
keys and values computed once per input (XNNPACK's GEMMs counted per call in an ETDump); the
methods loaded with memory of their own, as executorch's ``Module`` loads them;
``xnnfold transcribe`` and ``xnnfold generate`` on the .pte."""

import contextlib
import io
import json
import tempfile
import wave
from pathlib import Path

import numpy
import pytest
import torch

from byte_tokenizer import byte_level_tokenizer, sentence
from conftest import seed_everything
from xnnfold import cli
from xnnfold.export.seq2seq import Seq2SeqProgram, WhisperPrompt
from xnnfold.export.seq2seq.lower import tied_tables
from xnnfold.models import speech

FRAMES, VOCAB = 200, 1708     # 2 s windows; 100 text tokens and Whisper's 1,608 special ones


@pytest.fixture(scope="module")
def whisper_pte(tmp_path_factory):
    """(folder, .pte) of ``xnnfold hf`` on a test-sized Whisper folder."""
    seed_everything("whisper_pte")
    root = tmp_path_factory.mktemp("whisper")
    folder = speech.save_whisper_folder(root / "model", "test", vocab=VOCAB, frames=FRAMES)
    pte = root / "w.pte"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["hf", str(folder), "-o", str(pte)]) == 0
    (root / "hf-printed.txt").write_text(printed.getvalue())     # what the user read
    return folder, pte


@pytest.fixture(scope="module")
def whisper_model(whisper_pte):
    from xnnfold.export.transformers import import_transformers

    return import_transformers().WhisperForConditionalGeneration.from_pretrained(
        str(whisper_pte[0])).eval()


@pytest.mark.parametrize("seed, language, task", [(0, None, None), (1, "en", None),
                                                  (2, "de", "translate")],
                         ids=["detected", "en", "de-translate"])
def test_whisper_tokens_equal_generate(whisper_pte, whisper_model, seed, language, task):
    features = speech.features(frames=FRAMES, seed=seed)
    config = whisper_model.generation_config.to_dict()
    prompt = WhisperPrompt(config, language, task)
    run = Seq2SeqProgram(whisper_pte[1]).generate(features, 24, prompt.prompt, prompt)
    options = {k: v for k, v in (("language", language), ("task", task)) if v}
    with torch.no_grad():
        expected = whisper_model.generate(features, max_new_tokens=24, **options)
    assert run.tokens == expected[0].tolist()
    assert len(set(run.tokens)) > 1 or run.stopped_at_eos     # the tokens depend on the input
    assert None not in run.prompt and len(run.step_seconds) == len(run.prompt) - 1 + 24


def test_whisper_methods_share_no_memory(whisper_pte, whisper_model):
    """executorch's Module gives each method planned memory of its own: the pybindings'
    module does too. The same tokens there, and only text_decoder has mutable buffers."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    folder, pte = whisper_pte
    # the module does not own its buffers: they live as long as it
    buffers = pte.read_bytes(), pte.with_suffix(".ptd").read_bytes()
    module = _load_for_executorch_from_buffer(*buffers)
    features = speech.features(frames=FRAMES, seed=0)
    config = whisper_model.generation_config.to_dict()
    (encoded,) = module.run_method("encoder", (features,))
    prompt = WhisperPrompt(config, "en")
    sequence = list(prompt.prompt)
    for position in range(len(prompt.prompt) - 1 + 8):
        (logits,) = module.run_method("text_decoder", (torch.tensor([[sequence[position]]]),
                                                       encoded, torch.tensor([position])))
        if position + 1 >= len(prompt.prompt):
            sequence.append(int(prompt(logits.reshape(-1), position + 1, len(sequence)).argmax()))
    with torch.no_grad():
        expected = whisper_model.generate(features, max_new_tokens=8, language="en")
    generated = sequence[len(prompt.prompt):]
    eos = config["eos_token_id"]
    assert generated[:len(expected[0])] == expected[0].tolist()
    assert len(expected[0]) == 8 or generated[len(expected[0])] == eos


def _gemm_events(pte: Path, method: str, inputs: tuple, calls: int) -> list:
    """XNNPACK's fully-connected events of ``calls`` runs of ``method``, from an ETDump (each
    event's times: one per run)."""
    from executorch.devtools import Inspector
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer

    buffers = pte.read_bytes(), pte.with_suffix(".ptd").read_bytes()   # kept: not owned
    module = _load_for_executorch_from_buffer(*buffers, enable_etdump=True)
    for _ in range(calls):
        module.run_method(method, inputs)
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "run.etdp")
        module.write_etdump_result_to_file(path)
        inspector = Inspector(etdump_path=path)
    return [event for block in inspector.event_blocks for event in block.events
            if event.is_delegated_op and event.name.startswith("Fully Connected")]


def test_cross_keys_and_values_computed_once_per_input(whisper_pte, whisper_model):
    """Per decoder call, XNNPACK runs each layer's self-attention q, k, v, o, cross-attention q
    and o, two MLP GEMMs, and the head: 8 per layer + 1. The cross k and v projections (2 per
    layer) run in the encoder, once per input (with its own 4 per layer and 2 MLP GEMMs)."""
    config = whisper_model.config
    layers = config.decoder_layers
    pte = whisper_pte[1]
    features = speech.features(frames=FRAMES, seed=0)
    encoded = Seq2SeqProgram(pte).encode(features).clone()
    steps = 3
    decoder = _gemm_events(pte, "text_decoder", (torch.tensor([[1]]), encoded,
                                                 torch.tensor([0])), steps)
    assert len(decoder) == 8 * layers + 1
    assert all(len(event.perf_data.raw) == steps for event in decoder)
    encoder = _gemm_events(pte, "encoder", (features,), 1)
    assert len(encoder) == 6 * config.encoder_layers + 2 * layers


def test_the_tied_table_is_stored_once(whisper_pte, whisper_model):
    """The head (proj_out) and the token lookup read one copy of the table, in the .ptd."""
    folder, pte = whisper_pte
    table = whisper_model.model.decoder.embed_tokens.weight
    table_bytes = table.numel() * 4
    assert table_bytes <= pte.with_suffix(".ptd").stat().st_size < table_bytes + 4096
    weights = sum(p.numel() for p in whisper_model.parameters()) * 4
    assert pte.stat().st_size < weights - table_bytes + 64 * 1024


def test_transcribe_command(whisper_pte, whisper_model, tmp_path, capsys):
    folder, pte = whisper_pte
    features = speech.features(frames=FRAMES, seed=1)
    numpy.save(tmp_path / "f.npy", features[0].numpy())
    assert cli.main(["transcribe", str(pte), str(tmp_path / "f.npy"), "--folder", str(folder),
                     "--language", "en", "--max-new", "6", "--no-warmup"]) == 0
    printed = capsys.readouterr().out
    with torch.no_grad():
        expected = whisper_model.generate(features, max_new_tokens=6, language="en")
    generated = next(line for line in printed.splitlines() if line.startswith("generated"))
    assert generated.split(": ")[1] == ",".join(str(t) for t in expected[0].tolist())
    assert "decoder calls, ms: " in printed
    # a 16 kHz WAV through the folder's feature extractor; a wrong shape is one line, exit 2
    samples = (numpy.sin(numpy.arange(16000) / 5.0) * 8000).astype("<i2")
    with wave.open(str(tmp_path / "a.wav"), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(samples.tobytes())
    assert cli.main(["transcribe", str(pte), str(tmp_path / "a.wav"), "--folder", str(folder),
                     "--max-new", "3", "--no-warmup"]) == 0
    numpy.save(tmp_path / "bad.npy", numpy.zeros((80, 3000), numpy.float32))
    assert cli.main(["transcribe", str(pte), str(tmp_path / "bad.npy")]) == 2
    assert "the .pte takes (80, 200)" in capsys.readouterr().err
    # more tokens than the decoder's cache holds: said before any work, not cut short
    assert cli.main(["transcribe", str(pte), str(tmp_path / "f.npy"), "--max-new", "500"]) == 2
    assert "this .pte's cache has 448" in capsys.readouterr().err


def test_hf_says_what_its_bytes_count_and_where_the_runner_comes_from(whisper_pte):
    _, pte = whisper_pte
    printed = (pte.parent / "hf-printed.txt").read_text()
    header, _, encoder, decoder = printed.splitlines()[:4]
    pte_bytes, ptd_bytes = pte.stat().st_size, pte.with_suffix(".ptd").stat().st_size
    assert " .pte + .ptd bytes " in header, header
    both = f" {pte_bytes + ptd_bytes:,} ({pte_bytes:,} + {ptd_bytes:,}) "
    assert both in encoder and both in decoder, (both, encoder, decoder)
    assert "(whisper_runner --model_path " in printed and ": a C++ program not in the pip " \
        "wheel, built from executorch's sources, examples/models/whisper)" in printed, printed


def test_transcribe_reads_the_extractor_a_processor_saved(whisper_pte, tmp_path, capsys):
    """A folder WhisperProcessor.save_pretrained wrote (transformers 5: the feature extractor
    inside processor_config.json, no preprocessor_config.json): a WAV is transcribed as with
    the model folder's preprocessor_config.json."""
    from byte_tokenizer import byte_level_tokenizer
    from xnnfold.export.transformers import import_transformers

    tf = import_transformers()
    folder, pte = whisper_pte
    processor_folder = tmp_path / "processor"
    byte_level_tokenizer(tmp_path / "tokenizer.json", 200)
    tf.WhisperProcessor(
        feature_extractor=tf.WhisperFeatureExtractor.from_pretrained(str(folder)),
        tokenizer=tf.WhisperTokenizer(tokenizer_file=str(tmp_path / "tokenizer.json")),
    ).save_pretrained(processor_folder)
    assert not (processor_folder / "preprocessor_config.json").exists()
    (processor_folder / "generation_config.json").write_bytes(
        (folder / "generation_config.json").read_bytes())
    rng = numpy.random.default_rng(44)
    with wave.open(str(tmp_path / "a.wav"), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes((rng.standard_normal(16000) * 4000).astype("<i2").tobytes())
    generated = []
    for model_folder in (folder, processor_folder):
        assert cli.main(["transcribe", str(pte), str(tmp_path / "a.wav"), "--folder",
                         str(model_folder), "--language", "en", "--max-new", "4",
                         "--no-warmup"]) == 0
        generated.append(next(line for line in capsys.readouterr().out.splitlines()
                              if line.startswith("generated")))
    assert generated[0] == generated[1], generated


def test_tied_tables_are_found_by_their_readers():
    """Only a placeholder read by both an embedding lookup and a GEMM goes to the .ptd."""
    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(10, 4))
            self.other = torch.nn.Parameter(torch.randn(10, 4))

        def forward(self, ids):
            hidden = torch.nn.functional.embedding(ids, self.table)
            looked_up = torch.nn.functional.embedding(ids, self.other)
            return torch.nn.functional.linear(hidden + looked_up, self.table)

    program = torch.export.export(Both(), (torch.tensor([[1, 2]]),))
    names = {n.name for n in tied_tables(program.graph_module)}
    assert names == {"p_table"}


@pytest.fixture(scope="module")
def bart_pte(tmp_path_factory):
    from tokenizers import processors

    seed_everything("bart_pte")
    root = tmp_path_factory.mktemp("bart")
    model = speech.bart(vocab=200, width=32, layers=1, heads=2, positions=64)
    model.save_pretrained(str(root / "model"))
    # with BART's post-processor (<s> ... </s>), which executorch's C++ tokenizers do not load
    tokenizer = byte_level_tokenizer(root / "model" / "tokenizer.json", 200)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 1), ("<s>", 0))
    tokenizer.save(str(root / "model" / "tokenizer.json"))
    pte = root / "b.pte"
    assert cli.main(["hf", str(root / "model"), "-o", str(pte), "--max-cache", "24"]) == 0
    return model, pte


@pytest.mark.parametrize("length", [1, 5, 40])
def test_bart_tokens_equal_greedy_generate(bart_pte, length):
    model, pte = bart_pte
    source = torch.randint(3, 200, (1, length), generator=torch.Generator().manual_seed(length))
    run = Seq2SeqProgram(pte).generate(source, 16, stop_at_eos=False)
    with torch.no_grad():
        expected = model.generate(source, do_sample=False, num_beams=1, max_new_tokens=16,
                                  min_length=0, no_repeat_ngram_size=0, eos_token_id=None,
                                  forced_bos_token_id=None, forced_eos_token_id=None)
    assert run.prompt == [model.config.decoder_start_token_id]
    assert run.tokens == expected[0, 1:].tolist()


def test_generate_command_runs_a_text_seq2seq_pte(bart_pte, capsys):
    assert cli.main(["generate", str(bart_pte[1]), "--tokens", "5,6,7", "--max-new", "4",
                     "--ignore-eos", "--no-warmup"]) == 0
    assert "generated 4 token(s)" in capsys.readouterr().out
    # what only a causal LM's .pte takes: one line, not ignored
    for option in (["--temperature", "1"], ["--seed", "3"]):
        assert cli.main(["generate", str(bart_pte[1]), "--tokens", "5,6,7", *option]) == 2
        assert capsys.readouterr().err.strip().endswith(
            f"{option[0]} is for a causal LM's .pte"), option


def test_generate_reads_and_prints_text_with_the_tokenizer_hf_copied(bart_pte, capsys):
    """hf copies the BART folder's tokenizer beside the .pte; generate --prompt encodes the
    text with it as transformers does (its post-processor's <s> ... </s> included) and prints
    the greedy tokens' text: transformers' greedy generate's."""
    from tokenizers import Tokenizer

    model, pte = bart_pte
    folder_tokenizer = pte.parent / "model" / "tokenizer.json"
    assert (pte.parent / "tokenizer.json").read_bytes() == folder_tokenizer.read_bytes()
    text = sentence(5, seed=3)
    tokenizer = Tokenizer.from_file(str(folder_tokenizer))
    ids = tokenizer.encode(text).ids
    assert ids[0] == 0 and ids[-1] == 1
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), do_sample=False, num_beams=1,
                                  max_new_tokens=8, min_length=0, no_repeat_ngram_size=0,
                                  eos_token_id=None, forced_bos_token_id=None,
                                  forced_eos_token_id=None)[0, 1:].tolist()
    assert cli.main(["generate", str(pte), "--prompt", text, "--max-new", "8", "--ignore-eos",
                     "--no-warmup"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == tokenizer.decode(expected, skip_special_tokens=False)
    assert lines[2] == f"generated 8 token(s): {','.join(map(str, expected))}"


def _build_contract_driver(out: Path) -> Path:
    """tools/seq2seq_contract.cpp built against the C++ runtime the executorch wheel ships."""
    import shutil
    import subprocess

    import executorch

    if shutil.which("g++") is None:
        pytest.skip("no g++ to build tools/seq2seq_contract.cpp")
    root = Path(list(executorch.__path__)[0])     # a namespace package: no __file__
    source = Path(__file__).parent.parent / "tools" / "seq2seq_contract.cpp"
    binary = out / "seq2seq_contract"
    subprocess.run(
        ["g++", "-std=c++17", "-O1", "-w", "-DC10_USING_CUSTOM_GENERATED_MACROS",
         f"-I{root / 'include'}", f"-I{root / 'include/executorch/runtime/core/portable_type/c10'}",
         str(source), "-o", str(binary), f"-L{root / 'lib'}", "-Wl,--no-as-needed",
         "-lexecutorch", "-lexecutorch_backend_xnnpack", "-lexecutorch_kernels_optimized",
         "-lexecutorch_threadpool", f"-Wl,-rpath,{root / 'lib'}"], check=True)
    return binary


@pytest.mark.slow
def test_the_cpp_module_runs_the_pte_as_the_runner_does(whisper_pte, whisper_model, tmp_path):
    """executorch's C++ ``Module`` (each method in memory of its own, the .pte mmapped, the
    .ptd as its data map) through the speech runner's calls: the tokens of the Python loop
    with the same prompt and no processors; without the .ptd the methods do not load."""
    import subprocess

    folder, pte = whisper_pte
    binary = _build_contract_driver(tmp_path)
    features = speech.features(frames=FRAMES, seed=1)
    features[0].numpy().astype("<f4").tofile(tmp_path / "f.f32")
    prompt = WhisperPrompt(whisper_model.generation_config.to_dict(), "en").prompt
    expected = Seq2SeqProgram(pte).generate(features, 10, prompt, None, stop_at_eos=False)
    args = [str(binary), str(pte), str(pte.with_suffix(".ptd")), str(tmp_path / "f.f32"),
            "80", str(FRAMES), str(prompt[0]), "10", *map(str, prompt[1:])]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ",".join(map(str, expected.tokens))
    args[2] = "-"
    assert subprocess.run(args, capture_output=True, text=True).returncode == 1


def test_the_start_token_is_generates():
    """decoder_start_token_id, else bos_token_id (mBART's configs name no start token), from
    the generation config first, as ``generate`` picks it."""
    from types import SimpleNamespace

    from xnnfold.export.seq2seq.export import _metadata

    def model(generation, config):
        return SimpleNamespace(generation_config=SimpleNamespace(**generation),
                               config=SimpleNamespace(vocab_size=10, **config))

    picked = [_metadata(model(g, c), 8, 1).get("decoder_start_token_id") for g, c in (
        ({"decoder_start_token_id": 2, "bos_token_id": 0}, {"decoder_start_token_id": 5}),
        ({"decoder_start_token_id": None, "bos_token_id": 0}, {}),
        ({}, {"decoder_start_token_id": 5}), ({}, {}))]
    assert picked == [2, 0, 5, None]

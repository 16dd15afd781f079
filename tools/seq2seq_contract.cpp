// The calls executorch's speech runner (extension/asr/runner/seq2seq_runner.cpp) makes, written
// against the C++ runtime the executorch wheel ships, without its tokenizer: a Module loaded
// from the .pte (and .ptd) with mmap, each method loaded with memory of its own; `encoder` once
// on the features; `text_decoder(token (1,1), the encoder's output as is, cache_position (1,))`
// once per token from the start token, greedy. Prints the token ids.
//   seq2seq_contract MODEL.pte [MODEL.ptd|-] FEATURES.f32 MELS FRAMES START MAX_NEW [PROMPT...]
// FEATURES.f32: MELS x FRAMES float32, row-major. PROMPT: token ids forced after START (the
// runner forces none).
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

using executorch::extension::Module;
using executorch::extension::from_blob;
using executorch::runtime::EValue;
using executorch::runtime::Error;

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s MODEL.pte MODEL.ptd|- FEATURES.f32 MELS FRAMES START MAX_NEW [PROMPT...]\n", argv[0]);
    return 2;
  }
  std::string pte = argv[1], ptd = argv[2];
  int mels = std::atoi(argv[4]), frames = std::atoi(argv[5]);
  int64_t start = std::atoll(argv[6]);
  int max_new = std::atoi(argv[7]);
  std::vector<int64_t> forced;
  for (int i = 8; i < argc; ++i) forced.push_back(std::atoll(argv[i]));

  std::vector<float> features(static_cast<size_t>(mels) * frames);
  std::ifstream in(argv[3], std::ios::binary);
  in.read(reinterpret_cast<char*>(features.data()), features.size() * sizeof(float));
  if (!in) { std::fprintf(stderr, "cannot read %zu floats from %s\n", features.size(), argv[3]); return 2; }

  Module module = ptd == "-" ? Module(pte, Module::LoadMode::Mmap)
                             : Module(pte, ptd, Module::LoadMode::Mmap);
  if (module.load() != Error::Ok || module.load_method("encoder") != Error::Ok ||
      module.load_method("text_decoder") != Error::Ok) {
    std::fprintf(stderr, "cannot load %s's encoder and text_decoder\n", pte.c_str());
    return 1;
  }
  auto input = from_blob(features.data(), {1, mels, frames});
  auto encoded = module.execute("encoder", input);
  if (!encoded.ok() || encoded->size() != 1 || !(*encoded)[0].isTensor()) {
    std::fprintf(stderr, "encoder failed or did not return one tensor\n");
    return 1;
  }
  auto encoder_output = std::make_shared<executorch::aten::Tensor>((*encoded)[0].toTensor());

  int64_t token = start, position = 0;
  auto token_tensor = from_blob(&token, {1, 1}, executorch::aten::ScalarType::Long);
  auto position_tensor = from_blob(&position, {1}, executorch::aten::ScalarType::Long);
  std::vector<EValue> inputs = {token_tensor, encoder_output, position_tensor};
  std::vector<int64_t> generated;
  for (int step = 0; step < static_cast<int>(forced.size()) + max_new; ++step) {
    auto out = module.execute("text_decoder", inputs);
    if (!out.ok() || out->size() != 1 || !(*out)[0].isTensor()) {
      std::fprintf(stderr, "text_decoder failed at position %lld\n", (long long)position);
      return 1;
    }
    const auto logits = (*out)[0].toTensor();
    const float* values = logits.const_data_ptr<float>();
    int64_t best = 0;
    for (int64_t i = 1; i < logits.numel(); ++i) if (values[i] > values[best]) best = i;
    token = step < static_cast<int>(forced.size()) ? forced[step] : best;
    if (step >= static_cast<int>(forced.size())) generated.push_back(best);
    ++position;
  }
  for (size_t i = 0; i < generated.size(); ++i) std::printf("%s%lld", i ? "," : "", (long long)generated[i]);
  std::printf("\n");
  return 0;
}

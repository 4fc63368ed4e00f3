// Passkey prompts (the filler of the LongLoRA / Landmark Attention passkey test) and their teacher-forced key loss.
#include "train/passkey.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/rng.h"

namespace mt::train {

namespace {

constexpr const char* kIntro = "A pass key is hidden in the text below. Remember it.\n";
constexpr const char* kFiller =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n";
constexpr const char* kQuestion = "What is the pass key? The pass key is ";

void append(std::vector<int32_t>& out, const std::vector<int32_t>& ids) {
    out.insert(out.end(), ids.begin(), ids.end());
}

}  // namespace

PasskeyPrompt passkey_prompt(const data::Tokenizer& tokenizer, int64_t seq_len, uint64_t seed, int64_t stage, int d) {
    PasskeyPrompt p;
    const uint64_t r = core::rng_u64(seed, core::hash_name("mt.train.passkey") + static_cast<uint64_t>(stage), d);
    p.key = std::to_string(10000 + r % 90000);
    p.depth = static_cast<double>(d) / (kPasskeyDepths - 1);
    const auto intro = tokenizer.encode(kIntro), filler = tokenizer.encode(kFiller),
               question = tokenizer.encode(kQuestion);
    const auto needle =
        tokenizer.encode("The pass key is " + p.key + ". Remember it. " + p.key + " is the pass key.\n");
    const auto key = tokenizer.encode(p.key);
    // Pieces are encoded apart and joined as ids, so the key's tokens are exactly `key` at the end of the row.
    const int64_t fixed = static_cast<int64_t>(intro.size() + needle.size() + question.size() + key.size());
    const int64_t room = seq_len + 1 - fixed;
    if (room < 0 || filler.empty()) return p;
    // The key sentence goes between filler sentences, at the whole sentence nearest below depth x room.
    const int64_t per = static_cast<int64_t>(filler.size());
    const int64_t at =
        std::min(room, static_cast<int64_t>(std::floor(p.depth * static_cast<double>(room) / per)) * per);
    append(p.tokens, intro);
    for (int64_t i = 0; i < room; ++i) {
        if (i == at) append(p.tokens, needle);
        p.tokens.push_back(filler[static_cast<size_t>(i % per)]);
    }
    if (at == room) append(p.tokens, needle);
    append(p.tokens, question);
    append(p.tokens, key);
    p.key_tokens = static_cast<int64_t>(key.size());
    MT_CHECK(static_cast<int64_t>(p.tokens.size()) == seq_len + 1,
             "passkey prompt holds {} tokens, expected {}",
             p.tokens.size(),
             seq_len + 1);
    return p;
}

PasskeyResult passkey_eval(
    nn::Model& model, const data::Tokenizer& tokenizer, int64_t seq_len, int64_t batch, uint64_t seed, int64_t stage) {
    PasskeyResult res;
    res.seq_len = seq_len;
    std::vector<PasskeyPrompt> prompts;
    for (int d = 0; d < kPasskeyDepths; ++d) {
        prompts.push_back(passkey_prompt(tokenizer, seq_len, seed, stage, d));
        if (prompts.back().tokens.empty()) return res;
    }
    const core::Tensor ids = core::Tensor::zeros({batch, seq_len}, core::DType::i32);
    const core::Tensor targets = core::Tensor::zeros({batch, seq_len}, core::DType::i32);
    for (size_t first = 0; first < prompts.size(); first += static_cast<size_t>(batch)) {
        int32_t* in = ids.data<int32_t>();
        int32_t* tg = targets.data<int32_t>();
        for (int64_t r = 0; r < batch; ++r) {
            const size_t i = std::min(first + static_cast<size_t>(r), prompts.size() - 1);
            const bool real = first + static_cast<size_t>(r) < prompts.size();
            const auto& t = prompts[i].tokens;
            for (int64_t c = 0; c < seq_len; ++c) {
                in[r * seq_len + c] = t[static_cast<size_t>(c)];
                const bool key = c >= seq_len - prompts[i].key_tokens;
                tg[r * seq_len + c] = real && key ? t[static_cast<size_t>(c) + 1] : nn::kIgnoreIndex;
            }
        }
        model.forward(ids, targets, /*training=*/false);
        const core::Tensor& dev_losses = model.last_token_losses();
        const core::Tensor losses =
            dev_losses.device() == core::Device::cpu ? dev_losses : dev_losses.to_device(core::Device::cpu);
        for (int64_t r = 0; r < batch && first + static_cast<size_t>(r) < prompts.size(); ++r) {
            const PasskeyPrompt& p = prompts[first + static_cast<size_t>(r)];
            double sum = 0.0;
            for (int64_t c = seq_len - p.key_tokens; c < seq_len; ++c)
                sum += core::tensor_get_flat(losses, r * seq_len + c);
            res.depth.push_back(p.depth);
            res.loss.push_back(sum / static_cast<double>(p.key_tokens));
            res.p_key.push_back(std::exp(-sum));
        }
    }
    for (size_t i = 0; i < res.loss.size(); ++i) {
        res.mean_loss += res.loss[i] / static_cast<double>(res.loss.size());
        res.mean_p_key += res.p_key[i] / static_cast<double>(res.loss.size());
    }
    res.ran = true;
    return res;
}

}  // namespace mt::train

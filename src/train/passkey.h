// Passkey retrieval (long_context.md §9): a 5-digit key hidden at 10 depths of filler text, asked for at the end of
// the row. The model reads each prompt in eval mode, teacher-forced; the loss of the key's tokens after the question
// is reported (at every curriculum stage start), never gated on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "nn/model.h"

namespace mt::train {

constexpr int kPasskeyDepths = 10;
constexpr int kPasskeyDigits = 5;

// One prompt: seq_len + 1 tokens (inputs are [0, seq_len), targets [1, seq_len]); the key's tokens are the row's last
// ones, and only their targets are supervised.
struct PasskeyPrompt {
    std::vector<int32_t> tokens;
    int64_t key_tokens = 0;  // the supervised targets: the last key_tokens of the row
    std::string key;         // the 5 digits
    double depth = 0.0;      // where the key sits in the filler, 0 (start) to 1 (end)
};

// The prompt at depth index d (0..9, depth d / 9) for a row of seq_len tokens; the key is drawn from Philox keyed by
// (seed, stage, d). Empty tokens when seq_len is too short to hold the instructions, the key sentence and the question.
PasskeyPrompt passkey_prompt(const data::Tokenizer& tokenizer, int64_t seq_len, uint64_t seed, int64_t stage, int d);

struct PasskeyResult {
    int64_t seq_len = 0;
    std::vector<double> depth;  // per prompt
    std::vector<double> loss;   // per prompt: mean cross-entropy (nats) of the key's tokens
    std::vector<double> p_key;  // per prompt: exp(-sum of those losses), the model's probability of the whole key
    double mean_loss = 0.0, mean_p_key = 0.0;
    bool ran = false;  // false when seq_len is too short for a prompt
};

// Runs the 10 prompts through the model in eval mode, `batch` rows per forward (the training batch, so the model keeps
// its buffers; rows past the last prompt repeat it unsupervised).
PasskeyResult passkey_eval(
    nn::Model& model, const data::Tokenizer& tokenizer, int64_t seq_len, int64_t batch, uint64_t seed, int64_t stage);

}  // namespace mt::train

// The `[[long.stages]]` array of the job config (docs/long_context.md "Curriculum"): read, checked and written beside
// the schema, whose rows are scalars and string arrays. Internal to src/train.
#pragma once

#include <toml++/toml.h>

#include <string>

#include "train/config.h"

namespace mt::train {

// Moves root's long.stages (an array of tables with seq_len, tokens, long_fraction, rope_base) into
// c.long_ctx.stages and erases it from root, so that the schema reads the rest of [long]. A wrong type, an unknown key
// or a value out of range ends with exit 2 naming the key as `long.stages[i].key`.
void config_long_take_stages(toml::table& root, JobConfig& c, const std::string& src);

// The curriculum's checks across keys (exit 2 naming the key): seq_len increasing from stage to stage, each at most
// model.max_seq_len; a rope_base only on a model with RoPE layers.
void config_long_validate(const JobConfig& c, const std::string& src);

// Writes c.long_ctx.stages into root as long.stages (the resolved TOML); nothing when there are none.
void config_long_put_stages(const JobConfig& c, toml::table& root);

}  // namespace mt::train

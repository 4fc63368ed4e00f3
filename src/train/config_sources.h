// The `[[data.sources]]` array of the job config (docs/data.md "Mixed sources"): each entry a data source of its own
// format with a name and a mixing weight, read with the schema's data.* rows and written back into the resolved TOML.
// Internal to src/train.
#pragma once

#include <toml++/toml.h>

#include <string>
#include <vector>

#include "train/config.h"

namespace mt::train {

// Moves root's data.sources (an array of tables) out of root, so that the schema reads the rest of [data]; each table
// is kept whole for config_sources_apply. A value that is not an array of tables ends with exit 2 naming the key.
std::vector<toml::table> config_sources_take(toml::table& root, const std::string& src);

// Fills c.data_sources from the tables config_sources_take kept: `name` (required, unique), `weight` (> 0, default 1)
// and the data keys of that source (format, paths, val_paths, tokenizer, skip_bad_samples, shapes.*), read by the
// schema's data.* rows onto a fresh DataConfig. Then c.data becomes the first image source's data (else the first
// source's), so that the checks and metrics keyed on data.format see the mixture's images. Exit 2 naming
// data.sources[i].key for an unknown or bad key, a missing or duplicate name, a weight <= 0, or sources of different
// vocabularies (docs/data.md "Mixed sources": one tokenizer for all, or shapes with token files of its vocabulary).
void config_sources_apply(JobConfig& c, const std::vector<toml::table>& tables, const std::string& src);

// The job as one source sees it (data = that source's data.*), for the per-format checks.
JobConfig config_source_view(const JobConfig& c, size_t source);

// Writes c.data_sources into root as data.sources (the resolved TOML); nothing when there are none.
void config_sources_put(const JobConfig& c, toml::table& root);

// The schema's rows of c as TOML tables (config.cpp; the resolved TOML without the arrays of tables).
toml::table config_resolved_table(const JobConfig& c);

// Reads the keys of `table` into the schema rows named prefix.key (config.cpp's reader, nested tables as
// prefix.table.key), exit 2 naming an unknown key or a bad value.
void config_assign_table(const toml::table& table, const std::string& prefix, JobConfig& c, const std::string& src);

}  // namespace mt::train

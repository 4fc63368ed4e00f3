// Config drift on resume: the keys of the resolved job config that differ from the config a checkpoint was saved
// with, leaving out the keys that do not change the training trajectory (paths of the run, logging, checkpoint
// cadence, threads, the device and the parallel layout, which resume reshards) and train.steps (extending a run is
// normal; a value below the checkpoint's step is an error of its own).
#pragma once

#include <string>
#include <vector>

namespace mt::train {

// One key that differs: its dotted name and both values as TOML text ("(absent)" for a key one side lacks).
struct ConfigDrift {
    std::string key;
    std::string saved;
    std::string now;
};

// Compares two resolved configs (JobConfig::to_toml text; the saved one in today's keys first, config_upgrade_saved,
// so that a checkpoint of an older moetrain compares key by key). Keys in the ignored sections or list are skipped; the
// result is sorted by key. Text that does not parse as TOML gives one entry with the key "(config_toml)".
// @param[in] saved_toml    the checkpoint manifest's config_toml
// @param[in] current_toml  this run's resolved config
std::vector<ConfigDrift> config_drift(const std::string& saved_toml, const std::string& current_toml);

}  // namespace mt::train

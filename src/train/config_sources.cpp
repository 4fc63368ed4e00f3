// Parsing, checking and writing of `[[data.sources]]`: each entry's data keys go through the schema's data.* rows, so
// every format reads its keys exactly as a single-source job does; the entry index is in every message.
#include "train/config_sources.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"

namespace mt::train {

namespace {

using core::ExitCode;

// The keys of an entry besides name and weight: the DataConfig members (data.document_mask and data.eot_token are the
// model's, the same for every source).
const char* const kSourceDataKeys[] = {"format", "paths", "val_paths", "tokenizer", "skip_bad_samples", "shapes"};

std::string node_type(const toml::node& n) {
    return std::string(toml::impl::node_type_friendly_names[static_cast<size_t>(n.type())]);
}

bool is_image_format(const std::string& format) {
    return format == "shapes" || format == "webdataset" || format == "image_jsonl";
}

// One entry: name, weight, and its data keys read onto a fresh DataConfig (the defaults of data.*, not the job's).
DataSource parse_source(const JobConfig& c, const toml::table& t, const std::string& at, const std::string& src) {
    DataSource s;
    toml::table data;
    for (const auto& [name, value] : t) {
        const std::string key = at + "." + std::string(name.str());
        if (name == "name") {
            if (!value.is_string())
                core::fail(
                    ExitCode::usage, "config value {} must be a string, got {} [{}]", key, node_type(value), src);
            s.name = value.as_string()->get();
        } else if (name == "weight") {
            if (!value.is_number())
                core::fail(
                    ExitCode::usage, "config value {} must be a number, got {} [{}]", key, node_type(value), src);
            s.weight =
                value.is_integer() ? static_cast<double>(value.as_integer()->get()) : value.as_floating_point()->get();
            if (!(s.weight > 0.0 && std::isfinite(s.weight)))
                core::fail_hint(ExitCode::usage,
                                "rows are drawn from source i with probability weight_i / sum(weight); leave a "
                                "source out instead of giving it weight 0",
                                "config value {} = {} is out of range: must be > 0 [{}]",
                                key,
                                s.weight,
                                src);
        } else if (std::find(std::begin(kSourceDataKeys), std::end(kSourceDataKeys), name.str()) !=
                   std::end(kSourceDataKeys)) {
            data.insert(name, value);
        } else {
            core::fail_hint(ExitCode::usage,
                            fmt::format("a source takes name, weight, {}", fmt::join(kSourceDataKeys, ", ")),
                            "unknown config key `{}` [{}]",
                            key,
                            src);
        }
    }
    if (!t.contains("name"))
        core::fail(
            ExitCode::usage, "config value {}.name is missing: every source needs one (its loss tag) [{}]", at, src);
    if (s.name.empty() || s.name.find_first_of("/ \t\"") != std::string::npos)
        core::fail(ExitCode::usage,
                   "config value {}.name = \"{}\" must be a non-empty word without '/', spaces or quotes (it names "
                   "the metrics loss/<name>) [{}]",
                   at,
                   s.name,
                   src);
    JobConfig scratch = c;
    scratch.data = DataConfig{};
    config_assign_table(data, "data", scratch, fmt::format("{}, {}", src, at));
    s.data = scratch.data;
    return s;
}

// One vocabulary for every source (docs/data.md "Mixed sources"): the same tokenizer, or the shapes set with token
// files written in its vocabulary (the image-text formats on disk put their specials after the tokenizer's ids, which
// the shapes vocabulary does not share).
void check_one_vocabulary(const std::vector<DataSource>& sources, const std::string& src) {
    const auto shapes =
        std::find_if(sources.begin(), sources.end(), [](const DataSource& s) { return s.data.format == "shapes"; });
    const DataSource* first_text = nullptr;
    for (size_t i = 0; i < sources.size(); ++i) {
        const DataSource& s = sources[i];
        if (s.data.format == "shapes") continue;
        if (shapes != sources.end() && is_image_format(s.data.format))
            core::fail_hint(ExitCode::usage,
                            "all sources share one vocabulary: the shapes set mixes with llmc or megatron token files "
                            "written in the shapes vocabulary only",
                            "config value data.sources[{}].format = \"{}\" cannot mix with the shapes source \"{}\": "
                            "its image-text specials follow the tokenizer's ids, not the shapes vocabulary's [{}]",
                            i,
                            s.data.format,
                            shapes->name,
                            src);
        if (first_text == nullptr) {
            first_text = &s;
        } else if (s.data.tokenizer != first_text->data.tokenizer) {
            core::fail_hint(ExitCode::usage,
                            "all sources share one vocabulary: tokenize every source with the same tokenizer",
                            "config value data.sources[{}].tokenizer = \"{}\" differs from source \"{}\"'s \"{}\" [{}]",
                            i,
                            s.data.tokenizer,
                            first_text->name,
                            first_text->data.tokenizer,
                            src);
        }
    }
}

}  // namespace

std::vector<toml::table> config_sources_take(toml::table& root, const std::string& src) {
    toml::table* sec = root["data"].as_table();
    if (sec == nullptr || !sec->contains("sources")) return {};
    const toml::node& node = *sec->get("sources");
    const toml::array* arr = node.as_array();
    if (arr == nullptr || arr->empty())
        core::fail_hint(ExitCode::usage,
                        "write each source as a [[data.sources]] table with name, weight, format and its keys",
                        "config value data.sources must be a non-empty array of tables, got {} [{}]",
                        arr == nullptr ? node_type(node) : "an empty array",
                        src);
    std::vector<toml::table> tables;
    for (size_t i = 0; i < arr->size(); ++i) {
        const toml::table* t = (*arr)[i].as_table();
        if (t == nullptr)
            core::fail(ExitCode::usage,
                       "config value data.sources[{}] must be a table, got {} [{}]",
                       i,
                       node_type((*arr)[i]),
                       src);
        tables.push_back(*t);
    }
    sec->erase("sources");
    return tables;
}

void config_sources_apply(JobConfig& c, const std::vector<toml::table>& tables, const std::string& src) {
    // The pipeline's schedule runs its own micro-batch loop, which neither tags rows nor weights them yet.
    if (c.parallel.pp > 1 && (!tables.empty() || c.loss.weighting != "token_mean"))
        core::fail(ExitCode::usage,
                   "parallel.pp = {} with {}: mixed sources and loss weighting run without pipeline parallelism "
                   "yet [{}]",
                   c.parallel.pp,
                   tables.empty() ? fmt::format("loss.weighting = \"{}\"", c.loss.weighting) : "data.sources",
                   src);
    if (tables.empty() && c.loss.weighting != "token_mean")
        core::fail_hint(ExitCode::usage,
                        "name the sources in [[data.sources]] tables (docs/multimodal.md \"Mixed sources and loss "
                        "weighting\")",
                        "config value loss.weighting = \"{}\" weights the sources of data.sources, and the config has "
                        "none [{}]",
                        c.loss.weighting,
                        src);
    const auto& par = c.parallel;
    if (c.loss.weighting == "gradnorm" && (par.tp > 1 || par.cp > 1 || par.ep > 1))
        core::fail(ExitCode::usage,
                   "loss.weighting = \"gradnorm\" with parallel.tp = {}, cp = {}, ep = {}: its per-source backward "
                   "runs with data parallelism only yet [{}]",
                   par.tp,
                   par.cp,
                   par.ep,
                   src);
    if (tables.empty()) return;
    if (!c.long_ctx.stages.empty())
        core::fail(ExitCode::usage,
                   "data.sources with a [[long.stages]] curriculum: a curriculum stage reads one token stream yet [{}]",
                   src);
    std::vector<DataSource> sources;
    std::set<std::string> names;
    for (size_t i = 0; i < tables.size(); ++i) {
        const std::string at = fmt::format("data.sources[{}]", i);
        DataSource s = parse_source(c, tables[i], at, src);
        if (!names.insert(s.name).second)
            core::fail(ExitCode::usage,
                       "config value {}.name = \"{}\" is a duplicate: every source needs its own name (its loss "
                       "tag) [{}]",
                       at,
                       s.name,
                       src);
        sources.push_back(std::move(s));
    }
    check_one_vocabulary(sources, src);
    for (DataSource& s : sources) s.data.loader_threads = c.data.loader_threads;  // a job-wide key, not a source's
    const auto image = std::find_if(
        sources.begin(), sources.end(), [](const DataSource& s) { return is_image_format(s.data.format); });
    c.data = image != sources.end() ? image->data : sources.front().data;
    c.data_sources = std::move(sources);
}

JobConfig config_source_view(const JobConfig& c, size_t source) {
    JobConfig view = c;
    view.data = c.data_sources.at(source).data;
    view.data_sources.clear();
    return view;
}

void config_sources_put(const JobConfig& c, toml::table& root) {
    if (c.data_sources.empty()) return;
    toml::array arr;
    for (size_t i = 0; i < c.data_sources.size(); ++i) {
        const DataSource& s = c.data_sources[i];
        const toml::table resolved = config_resolved_table(config_source_view(c, i));
        const toml::table& data = *resolved["data"].as_table();
        toml::table t{{"name", s.name}, {"weight", s.weight}};
        for (const char* key : kSourceDataKeys)
            if (const toml::node* v = data.get(key)) t.insert(key, *v);
        arr.push_back(std::move(t));
    }
    if (!root.contains("data")) root.insert("data", toml::table{});
    root["data"].as_table()->insert_or_assign("sources", std::move(arr));
}

}  // namespace mt::train

// Test helper: a strict parser of the Prometheus text exposition format 0.0.4, written from its rules (conventions
// §7.2) rather than from moetrain's writer: every line '\n'-terminated, metric and label name syntax, HELP and TYPE at
// most once per family and before its samples, a family's samples in one group, label and HELP escapes, value and
// timestamp syntax, unique series, counters named *_total, histogram buckets with le and an le="+Inf" bucket.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace mt::testing {

struct PromSample {
    std::string name;
    std::map<std::string, std::string> labels;  // unescaped values
    double value = 0.0;
};

struct PromFamily {
    std::string name;
    std::string type = "untyped";
    std::string help;  // unescaped
    bool has_help = false, has_type = false;
    std::vector<PromSample> samples;
};

struct PromExposition {
    std::vector<PromFamily> families;
    const PromFamily* find(const std::string& name) const {
        for (const auto& f : families)
            if (f.name == name) return &f;
        return nullptr;
    }
};

namespace prom_detail {

inline const std::regex kMetricName("[a-zA-Z_:][a-zA-Z0-9_:]*");
inline const std::regex kLabelName("[a-zA-Z_][a-zA-Z0-9_]*");
inline const std::regex kValue("[+-]?([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][+-]?[0-9]+)?");
inline const std::regex kTimestamp("-?[0-9]+");

[[noreturn]] inline void fail(size_t line, const std::string& what) {
    throw std::runtime_error(fmt::format("line {}: {}", line, what));
}

inline double parse_value(const std::string& s, size_t line) {
    if (s == "NaN") return std::nan("");
    if (s == "+Inf") return INFINITY;
    if (s == "-Inf") return -INFINITY;
    if (!std::regex_match(s, kValue)) fail(line, "bad value '" + s + "'");
    return std::strtod(s.c_str(), nullptr);
}

// Unescapes s (allowed: `\\`, `\n`, and `\"` when quote is set); any other backslash sequence fails.
inline std::string unescape(const std::string& s, bool quote, size_t line) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\\') {
            out += s[i];
            continue;
        }
        if (i + 1 == s.size()) fail(line, "a lone backslash at the end");
        const char c = s[++i];
        if (c == '\\')
            out += '\\';
        else if (c == 'n')
            out += '\n';
        else if (c == '"' && quote)
            out += '"';
        else
            fail(line, fmt::format("bad escape '\\{}'", c));
    }
    return out;
}

}  // namespace prom_detail

// Parses text or throws std::runtime_error("line N: what").
inline PromExposition prometheus_parse(const std::string& text) {
    using namespace prom_detail;
    if (!text.empty() && text.back() != '\n') fail(0, "the text does not end in a newline");
    PromExposition out;
    std::map<std::string, size_t> index;  // family name -> out.families
    std::set<std::string> closed;         // families whose sample group has ended
    std::set<std::string> series;         // name + labels, for duplicates
    std::string open;                     // the family whose samples come now
    auto family = [&](const std::string& name) -> PromFamily& {
        const auto [it, added] = index.emplace(name, out.families.size());
        if (added) out.families.emplace_back().name = name;
        return out.families[it->second];
    };
    // The family a sample belongs to: histogram and summary samples carry suffixes.
    auto family_of = [&](const std::string& name) {
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
            const std::string s = suffix;
            if (name.size() <= s.size() || name.compare(name.size() - s.size(), s.size(), s) != 0) continue;
            const auto it = index.find(name.substr(0, name.size() - s.size()));
            if (it == index.end()) continue;
            const std::string& type = out.families[it->second].type;
            if (type == "histogram" || (type == "summary" && s != "_bucket")) return it->first;
        }
        return name;
    };
    size_t n = 0;
    for (size_t pos = 0; pos < text.size();) {
        const size_t end = text.find('\n', pos);
        const std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        ++n;
        if (line.empty()) continue;
        if (line[0] == '#') {
            std::smatch m;
            static const std::regex kMeta("# (HELP|TYPE) ([^ ]+)(?: (.*))?");
            if (!std::regex_match(line, m, kMeta)) continue;  // a plain comment
            const std::string name = m[2];
            if (!std::regex_match(name, kMetricName)) fail(n, "bad metric name '" + name + "'");
            if (closed.count(name) || open == name) fail(n, m[1].str() + " of " + name + " after its samples");
            if (!open.empty()) closed.insert(open), open.clear();
            PromFamily& f = family(name);
            if (m[1] == "HELP") {
                if (f.has_help) fail(n, "a second HELP for " + name);
                f.has_help = true;
                f.help = unescape(m[3], false, n);
            } else {
                static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary", "untyped"};
                if (f.has_type) fail(n, "a second TYPE for " + name);
                if (!kTypes.count(m[3])) fail(n, "bad type '" + m[3].str() + "'");
                f.has_type = true;
                f.type = m[3];
            }
            continue;
        }
        // name{labels} value [timestamp]
        size_t i = 0;
        while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
        PromSample s;
        s.name = line.substr(0, i);
        if (!std::regex_match(s.name, kMetricName)) fail(n, "bad metric name '" + s.name + "'");
        if (i < line.size() && line[i] == '{') {
            ++i;
            while (i < line.size() && line[i] != '}') {
                const size_t eq = line.find('=', i);
                if (eq == std::string::npos) fail(n, "a label without '='");
                const std::string label = line.substr(i, eq - i);
                if (!std::regex_match(label, kLabelName)) fail(n, "bad label name '" + label + "'");
                if (eq + 1 >= line.size() || line[eq + 1] != '"') fail(n, "label value not quoted");
                size_t q = eq + 2;
                while (q < line.size() && line[q] != '"') q += line[q] == '\\' ? 2 : 1;
                if (q >= line.size()) fail(n, "unterminated label value");
                if (!s.labels.emplace(label, unescape(line.substr(eq + 2, q - eq - 2), true, n)).second)
                    fail(n, "label " + label + " twice");
                i = q + 1;
                if (i < line.size() && line[i] == ',') {
                    ++i;
                    if (i < line.size() && line[i] == '}') fail(n, "a trailing comma in the labels");
                } else if (i >= line.size() || line[i] != '}') {
                    fail(n, "labels not separated by ','");
                }
            }
            if (i >= line.size()) fail(n, "unterminated labels");
            ++i;
        }
        if (i >= line.size() || line[i] != ' ') fail(n, "no space before the value");
        std::vector<std::string> fields;
        for (size_t f = i; f < line.size();) {
            while (f < line.size() && line[f] == ' ') ++f;
            const size_t e = std::min(line.find(' ', f), line.size());
            if (e > f) fields.push_back(line.substr(f, e - f));
            f = e;
        }
        if (fields.empty() || fields.size() > 2) fail(n, "expected a value and an optional timestamp");
        s.value = parse_value(fields[0], n);
        if (fields.size() == 2 && !std::regex_match(fields[1], kTimestamp)) fail(n, "bad timestamp");
        const std::string fam = family_of(s.name);
        if (closed.count(fam)) fail(n, "samples of " + fam + " not in one group");
        if (!open.empty() && open != fam) closed.insert(open);
        open = fam;
        std::string key = s.name;
        for (const auto& [k, v] : s.labels) key += "\x01" + k + "\x02" + v;
        if (!series.insert(key).second) fail(n, "series " + s.name + " twice");
        PromFamily& f = family(fam);
        if (f.type == "counter" && !fam.ends_with("_total")) fail(n, "counter " + fam + " does not end in _total");
        if (f.type == "histogram" && s.name.ends_with("_bucket") && !s.labels.count("le"))
            fail(n, "a histogram bucket without le");
        f.samples.push_back(std::move(s));
    }
    for (const PromFamily& f : out.families) {
        if (f.type != "histogram") continue;
        bool inf = false;
        for (const PromSample& s : f.samples) inf = inf || (s.labels.count("le") && s.labels.at("le") == "+Inf");
        if (!inf) fail(n, "histogram " + f.name + " has no le=\"+Inf\" bucket");
    }
    return out;
}

}  // namespace mt::testing

#include "runtime/serve/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {
namespace {

static_assert(std::atomic<double>::is_always_lock_free,
              "metrics assume lock-free atomic<double>");
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "metrics assume lock-free atomic<uint64_t>");

// Adds `v` to `a` with a compare-exchange loop (atomic<double>::fetch_add is
// C++20).
void AtomicAdd(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

bool IsAlpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(absl::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (!(IsAlpha(c) || c == '_' || c == ':' || (i > 0 && IsDigit(c)))) {
      return false;
    }
  }
  return true;
}

// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved for Prometheus).
bool IsValidLabelName(absl::string_view s) {
  if (s.empty() || absl::StartsWith(s, "__")) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (!(IsAlpha(c) || c == '_' || (i > 0 && IsDigit(c)))) return false;
  }
  return true;
}

// Well-formed UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
bool IsValidUtf8(absl::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    i += len;
  }
  return true;
}

const char* TypeName(int type) {
  switch (type) {
    case 0:
      return "counter";
    case 1:
      return "gauge";
    default:
      return "histogram";
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Formatting.

std::string FormatBucketBound(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == 0) return "0";  // Also -0, as the Go client writes it.
  // Shortest round-trip digits, in scientific form: [-]d[.ddd]e(+|-)xx.
  char buf[64];
  const std::to_chars_result r =
      std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const absl::string_view sci(buf, r.ptr - buf);
  const size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (IsDigit(c)) digits.push_back(c);
  }
  const int exp = std::atoi(std::string(sci.substr(e + 1)).c_str());
  const int nd = static_cast<int>(digits.size());

  std::string out = negative ? "-" : "";
  // Go's 'g' with shortest precision: %e when exp < -4 || exp >= 6.
  if (exp < -4 || exp >= 6) {
    out.push_back(digits[0]);
    if (nd > 1) absl::StrAppend(&out, ".", digits.substr(1));
    const int abs_exp = std::abs(exp);
    absl::StrAppend(&out, exp < 0 ? "e-" : "e+", abs_exp < 10 ? "0" : "",
                    abs_exp);
  } else if (exp >= 0) {
    if (nd <= exp + 1) {
      absl::StrAppend(&out, digits, std::string(exp + 1 - nd, '0'));
    } else {
      absl::StrAppend(&out, digits.substr(0, exp + 1), ".",
                      digits.substr(exp + 1));
    }
  } else {
    absl::StrAppend(&out, "0.", std::string(-exp - 1, '0'), digits);
  }
  return out;
}

std::string FormatMetricValue(double v) {
  constexpr double kTwo53 = 9007199254740992.0;
  if (std::isfinite(v) && std::fabs(v) < kTwo53 && v == std::trunc(v)) {
    return absl::StrCat(static_cast<int64_t>(v));  // -0 prints "0".
  }
  return FormatBucketBound(v);
}

namespace {

// Backslash and newline always; the double quote only inside label values.
std::string Escape(absl::string_view s, bool quotes) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::string EscapeLabelValue(absl::string_view s) { return Escape(s, true); }

std::string EscapeHelp(absl::string_view s) { return Escape(s, false); }

// ---------------------------------------------------------------------------
// Metrics.

bool Counter::Increment(double v) {
  if (!(v >= 0)) return false;  // Negative or NaN.
  AtomicAdd(value_, v);
  return true;
}

void Gauge::Add(double v) { AtomicAdd(value_, v); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    buckets_[i].store(0, std::memory_order_relaxed);
  }
}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  const size_t i =
      std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, v);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t total = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    total += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = total;
  }
  s.count = total;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------------------
// Registry.

struct MetricsRegistry::Child {
  // `k1="v1",k2="v2"` (sorted by name, values escaped), or "".
  std::string label_text;
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
};

struct MetricsRegistry::Family {
  Type type;
  std::string name;
  std::string help;
  std::vector<std::string> label_names;  // Sorted.
  std::vector<double> bounds;            // Histograms only.
  std::vector<std::unique_ptr<Child>> children;
  absl::flat_hash_map<std::string, Child*> by_labels;  // Key: label_text.
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

absl::StatusOr<MetricsRegistry::Child*> MetricsRegistry::AddChild(
    Type type, absl::string_view name, absl::string_view help,
    std::vector<double> bounds, MetricLabels labels) {
  const char* type_name = TypeName(static_cast<int>(type));
  // Validate the name.
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid metric name \"", name,
                     "\" (must match [a-zA-Z_:][a-zA-Z0-9_:]*)"));
  }
  const bool ends_total = absl::EndsWith(name, "_total");
  if (type == Type::kCounter && !ends_total) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter name \"", name, "\" must end in \"_total\""));
  }
  if (type != Type::kCounter && ends_total) {
    return absl::InvalidArgumentError(absl::StrCat(
        type_name, " name \"", name, "\" must not end in \"_total\""));
  }
  if (type == Type::kGauge &&
      (absl::EndsWith(name, "_bucket") || absl::EndsWith(name, "_sum") ||
       absl::EndsWith(name, "_count"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("gauge name \"", name,
                     "\" must not end in \"_bucket\", \"_sum\" or \"_count\""));
  }
  if (!IsValidUtf8(help)) {
    return absl::InvalidArgumentError(
        absl::StrCat("help text of \"", name, "\" is not valid UTF-8"));
  }

  // Validate and canonicalize the labels.
  std::sort(labels.begin(), labels.end());
  std::vector<std::string> label_names;
  label_names.reserve(labels.size());
  std::vector<std::string> label_parts;
  label_parts.reserve(labels.size());
  for (const auto& [label, value] : labels) {
    if (!IsValidLabelName(label)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid label name \"", label, "\" on \"", name,
          "\" (must match [a-zA-Z_][a-zA-Z0-9_]* and not start with __)"));
    }
    if (type == Type::kHistogram && label == "le") {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram \"", name, "\" may not have a label named \"le\""));
    }
    if (!label_names.empty() && label_names.back() == label) {
      return absl::InvalidArgumentError(
          absl::StrCat("label \"", label, "\" given twice on \"", name, "\""));
    }
    if (!IsValidUtf8(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "value of label \"", label, "\" on \"", name, "\" is not UTF-8"));
    }
    label_names.push_back(label);
    label_parts.push_back(
        absl::StrCat(label, "=\"", EscapeLabelValue(value), "\""));
  }
  std::string label_text = absl::StrJoin(label_parts, ",");

  // Validate the bounds.
  if (type == Type::kHistogram) {
    if (!bounds.empty() && std::isinf(bounds.back()) && bounds.back() > 0) {
      bounds.pop_back();
    }
    for (size_t i = 0; i < bounds.size(); ++i) {
      if (std::isnan(bounds[i]) || std::isinf(bounds[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("histogram \"", name, "\": bucket bound ",
                         FormatBucketBound(bounds[i]), " is not finite"));
      }
      if (i > 0 && !(bounds[i] > bounds[i - 1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram \"", name, "\": bucket bounds must be strictly ",
            "increasing (", FormatBucketBound(bounds[i - 1]), " then ",
            FormatBucketBound(bounds[i]), ")"));
      }
    }
  } else {
    bounds.clear();
  }

  absl::MutexLock lock(&mu_);
  Family* family;
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    family = it->second;
    if (family->type != type) {
      return absl::AlreadyExistsError(
          absl::StrCat("metric \"", name, "\" is already registered as a ",
                       TypeName(static_cast<int>(family->type))));
    }
    if (family->help != help) {
      return absl::AlreadyExistsError(
          absl::StrCat("metric \"", name,
                       "\" is already registered with a different help text"));
    }
    if (family->label_names != label_names) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metric \"", name, "\" is already registered with label names {",
          absl::StrJoin(family->label_names, ","), "}, not {",
          absl::StrJoin(label_names, ","), "}"));
    }
    if (family->bounds != bounds) {
      return absl::AlreadyExistsError(absl::StrCat(
          "histogram \"", name,
          "\" is already registered with different bucket bounds"));
    }
    auto child = family->by_labels.find(label_text);
    if (child != family->by_labels.end()) return child->second;
  } else {
    std::vector<std::string> names = {std::string(name)};
    if (type == Type::kHistogram) {
      names.push_back(absl::StrCat(name, "_bucket"));
      names.push_back(absl::StrCat(name, "_sum"));
      names.push_back(absl::StrCat(name, "_count"));
    }
    for (const std::string& n : names) {
      if (taken_names_.contains(n)) {
        return absl::AlreadyExistsError(
            absl::StrCat(type_name, " \"", name, "\" would render \"", n,
                         "\", which another metric already renders"));
      }
    }
    taken_names_.insert(names.begin(), names.end());
    auto owned = std::make_unique<Family>();
    family = owned.get();
    family->type = type;
    family->name = std::string(name);
    family->help = std::string(help);
    family->label_names = std::move(label_names);
    family->bounds = bounds;
    families_.push_back(std::move(owned));
    by_name_.emplace(family->name, family);
  }

  auto child = std::make_unique<Child>();
  child->label_text = std::move(label_text);
  switch (type) {
    case Type::kCounter:
      child->counter.reset(new Counter());
      break;
    case Type::kGauge:
      child->gauge.reset(new Gauge());
      break;
    case Type::kHistogram:
      child->histogram.reset(new Histogram(std::move(bounds)));
      break;
  }
  Child* result = child.get();
  family->by_labels.emplace(result->label_text, result);
  family->children.push_back(std::move(child));
  return result;
}

absl::StatusOr<Counter*> MetricsRegistry::AddCounter(absl::string_view name,
                                                     absl::string_view help,
                                                     MetricLabels labels) {
  absl::StatusOr<Child*> child =
      AddChild(Type::kCounter, name, help, {}, std::move(labels));
  if (!child.ok()) return child.status();
  return (*child)->counter.get();
}

absl::StatusOr<Gauge*> MetricsRegistry::AddGauge(absl::string_view name,
                                                 absl::string_view help,
                                                 MetricLabels labels) {
  absl::StatusOr<Child*> child =
      AddChild(Type::kGauge, name, help, {}, std::move(labels));
  if (!child.ok()) return child.status();
  return (*child)->gauge.get();
}

absl::StatusOr<Histogram*> MetricsRegistry::AddHistogram(
    absl::string_view name, absl::string_view help, std::vector<double> bounds,
    MetricLabels labels) {
  absl::StatusOr<Child*> child = AddChild(Type::kHistogram, name, help,
                                          std::move(bounds), std::move(labels));
  if (!child.ok()) return child.status();
  return (*child)->histogram.get();
}

std::string MetricsRegistry::Render() const {
  // `name{labels} value\n`; `extra` is one more label (le="...") or "".
  auto sample = [](std::string* out, absl::string_view name,
                   absl::string_view labels, absl::string_view extra,
                   absl::string_view value) {
    absl::StrAppend(out, name);
    if (!labels.empty() || !extra.empty()) {
      absl::StrAppend(out, "{", labels,
                      !labels.empty() && !extra.empty() ? "," : "", extra, "}");
    }
    absl::StrAppend(out, " ", value, "\n");
  };

  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& family : families_) {
    absl::StrAppend(&out, "# HELP ", family->name, " ",
                    EscapeHelp(family->help), "\n");
    absl::StrAppend(&out, "# TYPE ", family->name, " ",
                    TypeName(static_cast<int>(family->type)), "\n");
    const std::string bucket_name = absl::StrCat(family->name, "_bucket");
    const std::string sum_name = absl::StrCat(family->name, "_sum");
    const std::string count_name = absl::StrCat(family->name, "_count");
    for (const auto& child : family->children) {
      switch (family->type) {
        case Type::kCounter:
          sample(&out, family->name, child->label_text, "",
                 FormatMetricValue(child->counter->value()));
          break;
        case Type::kGauge:
          sample(&out, family->name, child->label_text, "",
                 FormatMetricValue(child->gauge->value()));
          break;
        case Type::kHistogram: {
          const HistogramSnapshot s = child->histogram->Snapshot();
          for (size_t i = 0; i < s.cumulative.size(); ++i) {
            const std::string le = absl::StrCat(
                "le=\"",
                i < s.bounds.size() ? FormatBucketBound(s.bounds[i]) : "+Inf",
                "\"");
            sample(&out, bucket_name, child->label_text, le,
                   FormatMetricValue(static_cast<double>(s.cumulative[i])));
          }
          sample(&out, sum_name, child->label_text, "",
                 FormatMetricValue(s.sum));
          sample(&out, count_name, child->label_text, "",
                 absl::StrCat(s.count));
          break;
        }
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// Buckets.

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (count < 1 || !std::isfinite(start) || !std::isfinite(factor) ||
      start <= 0 || factor <= 1) {
    return {};
  }
  std::vector<double> bounds(count);
  double v = start;
  for (int i = 0; i < count; ++i) {
    bounds[i] = v;
    v *= factor;
  }
  return bounds;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  if (count < 1 || !std::isfinite(start) || !std::isfinite(width) ||
      width <= 0) {
    return {};
  }
  std::vector<double> bounds(count);
  for (int i = 0; i < count; ++i) bounds[i] = start + i * width;
  return bounds;
}

std::vector<double> DefaultTimeToFirstTokenBuckets() {
  return {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> DefaultInterTokenLatencyBuckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}

std::vector<double> DefaultRequestLatencyBuckets() {
  return {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
          5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
          60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

}  // namespace tessera

#pragma once
// A multi-process test's parameters, typed on both sides. The parent hands run_workers a Case (a
// plain struct); each worker's body receives the same Case. Between them it travels as one
// environment value, because the GPU build execs its workers (a fork would share the memory): a
// Case names its fields once, for writing and for reading,
//
//   struct ResumeCase {
//     std::string style = "ddp";  // ...
//     int steps = 3;              // ...
//     DDP_CASE_FIELDS(style, steps)
//   };
//
// Fields are std::string (one line), bool, int, int64_t or double.

#include <cstdint>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

// DDP_CASE_FIELDS(a, b, ...) defines `template <class Field> void fields(Field& field)` calling
// field("a", a); field("b", b); ... for up to 12 members.
#define DDP_CASE_FIELD_(name) field(#name, name);
#define DDP_CASE_EACH_1_(m, a) m(a)
#define DDP_CASE_EACH_2_(m, a, ...) m(a) DDP_CASE_EACH_1_(m, __VA_ARGS__)
#define DDP_CASE_EACH_3_(m, a, ...) m(a) DDP_CASE_EACH_2_(m, __VA_ARGS__)
#define DDP_CASE_EACH_4_(m, a, ...) m(a) DDP_CASE_EACH_3_(m, __VA_ARGS__)
#define DDP_CASE_EACH_5_(m, a, ...) m(a) DDP_CASE_EACH_4_(m, __VA_ARGS__)
#define DDP_CASE_EACH_6_(m, a, ...) m(a) DDP_CASE_EACH_5_(m, __VA_ARGS__)
#define DDP_CASE_EACH_7_(m, a, ...) m(a) DDP_CASE_EACH_6_(m, __VA_ARGS__)
#define DDP_CASE_EACH_8_(m, a, ...) m(a) DDP_CASE_EACH_7_(m, __VA_ARGS__)
#define DDP_CASE_EACH_9_(m, a, ...) m(a) DDP_CASE_EACH_8_(m, __VA_ARGS__)
#define DDP_CASE_EACH_10_(m, a, ...) m(a) DDP_CASE_EACH_9_(m, __VA_ARGS__)
#define DDP_CASE_EACH_11_(m, a, ...) m(a) DDP_CASE_EACH_10_(m, __VA_ARGS__)
#define DDP_CASE_EACH_12_(m, a, ...) m(a) DDP_CASE_EACH_11_(m, __VA_ARGS__)
#define DDP_CASE_PICK_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, name, ...) name
#define DDP_CASE_FIELDS(...)                                                               \
  template <class Field>                                                                   \
  void fields(Field& field) {                                                              \
    DDP_CASE_PICK_(__VA_ARGS__, DDP_CASE_EACH_12_, DDP_CASE_EACH_11_, DDP_CASE_EACH_10_,   \
                   DDP_CASE_EACH_9_, DDP_CASE_EACH_8_, DDP_CASE_EACH_7_, DDP_CASE_EACH_6_, \
                   DDP_CASE_EACH_5_, DDP_CASE_EACH_4_, DDP_CASE_EACH_3_, DDP_CASE_EACH_2_, \
                   DDP_CASE_EACH_1_)                                                       \
    (DDP_CASE_FIELD_, __VA_ARGS__)                                                         \
  }

namespace ddp::testing {

// The parameters of a worker that takes none.
struct NoCase {
  template <class Field>
  void fields(Field&) {}
};

namespace detail {

// The environment variable a Case travels in.
inline constexpr const char* kCaseVariable = "DDP_TEST_CASE";

// Writes each field as "name=value" on its own line.
class CaseWriter {
 public:
  template <class T>
  void operator()(const char* name, const T& value) {
    std::ostringstream text;
    if constexpr (std::is_same_v<T, std::string>) {
      if (value.find('\n') != std::string::npos) {
        throw std::invalid_argument(std::string("test case field ") + name + " holds a newline");
      }
      text << value;
    } else if constexpr (std::is_same_v<T, double>) {
      text.precision(17);
      text << value;
    } else {
      static_assert(std::is_integral_v<T>, "a Case field is a string, bool, integer or double");
      text << static_cast<int64_t>(value);
    }
    lines_ += std::string(name) + "=" + text.str() + "\n";
  }
  const std::string& text() const { return lines_; }

 private:
  std::string lines_;
};

// Reads the fields CaseWriter wrote; a field the text lacks is an error naming it (the parent and
// the worker disagree on the Case, which one binary cannot, unless a field was renamed by half).
class CaseReader {
 public:
  explicit CaseReader(const std::string& text) {
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      const auto equals = line.find('=');
      if (equals != std::string::npos) values_[line.substr(0, equals)] = line.substr(equals + 1);
    }
  }
  template <class T>
  void operator()(const char* name, T& value) {
    const std::string& text = at(name);
    if constexpr (std::is_same_v<T, std::string>) {
      value = text;
    } else if constexpr (std::is_same_v<T, double>) {
      value = std::stod(text);
    } else {
      static_assert(std::is_integral_v<T>, "a Case field is a string, bool, integer or double");
      value = static_cast<T>(std::stoll(text));
    }
  }

 private:
  const std::string& at(const char* name) const {
    const auto it = values_.find(name);
    if (it == values_.end()) {
      throw std::runtime_error(std::string("the test worker's case has no field '") + name + "'");
    }
    return it->second;
  }
  std::map<std::string, std::string> values_;
};

template <class Case>
std::string encode_case(Case c) {
  CaseWriter writer;
  c.fields(writer);
  return writer.text();
}

template <class Case>
Case decode_case(const std::string& text) {
  Case c;
  CaseReader reader(text);
  c.fields(reader);
  return c;
}

}  // namespace detail
}  // namespace ddp::testing

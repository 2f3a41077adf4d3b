#pragma once
// Under --json, stdout carries the JSON objects alone, one per line, so that every line a consumer
// reads parses: the rest this process prints to stdout (a tool's text lines, the library's
// --verbose tables, a launcher's notes) goes to stderr instead. A process-wide switch, as stdout
// itself is.
//
//   if (args.json) ddp::tools::reserve_stdout_for_json();
//   ...
//   ddp::tools::print_json_line(object.dump());

#include <string>

namespace ddp::tools {

// From here on fd 1 is a copy of stderr, and print_json_line writes to the stdout it was. Once
// per process; a second call does nothing.
void reserve_stdout_for_json();

// `json` and a newline on the JSON stdout (the real one before reserve_stdout_for_json, else
// stdout), flushed.
void print_json_line(const std::string& json);

}  // namespace ddp::tools

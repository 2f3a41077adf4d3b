#!/usr/bin/env python3
"""Every C++ block of README.md and docs/**/*.md as one translation unit, for the suite to compile.

    doc_snippets.py SOURCE_DIR OUT_DIR    writes OUT_DIR/snippets.cpp and OUT_DIR/CMakeLists.txt

A ```cpp block compiles as written, at namespace scope, in a namespace of its own named for its
file and line (so a compiler error names the block). A fragment states what it runs in with an
HTML comment right before it, which Markdown does not show:

    <!-- compile-in
    struct Batch { torch::Tensor x, y; };
    void train(std::vector<Batch>& data) {
    @@
    }
    -->

where the line `@@` stands for the block. A block right after `<!-- program: NAME -->` is a whole
program instead: it builds as the executable NAME (the suite then runs it). Every block also sees doc_context.hpp's models (Net,
Gpt). #include lines of blocks and contexts are hoisted to
the top. Refused (exit 1, naming file and line): an indented code block that names `ddp::` (it
would escape the check: fence it as ```cpp) and a context without its `@@` line.
"""
import pathlib
import re
import sys

PRELUDE = ["#include <ddp/ddp.hpp>", "#include <torch/torch.h>", '#include "doc_context.hpp"']
CMAKE = """cmake_minimum_required(VERSION 3.18)
project(doc_snippets CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
find_package(ddp REQUIRED)
add_library(doc_snippets OBJECT snippets.cpp)
target_link_libraries(doc_snippets PRIVATE ddp::ddp)
"""


def blocks(path):
    """(line, code, context or None, program name or None) for each ```cpp block; errors for
    unchecked C++."""
    lines = path.read_text().split("\n")
    found, errors = [], []
    i = 0
    context, context_end = None, -1
    program, program_line = None, -1
    while i < len(lines):
        line = lines[i]
        if line.strip() == "<!-- compile-in":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "-->")
            context, context_end = lines[i + 1:end], end
            if "@@" not in [c.strip() for c in context]:
                errors.append(f"{path}:{i + 1}: a compile-in context without its '@@' line")
            i = end + 1
            continue
        named = re.match(r"^<!-- program: (\w+) -->$", line.strip())
        if named:
            program, program_line = named.group(1), i
            i += 1
            continue
        fence = re.match(r"^```(\w*)", line)
        if fence:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if fence.group(1) in ("cpp", "c++"):
                mine = context if context_end == i - 1 else None
                name = program if program_line == i - 1 else None
                found.append((i + 1, lines[i + 1:end], mine, name))
            i = end + 1
            continue
        if line.startswith("    ") and i > 0 and lines[i - 1].strip() == "":
            # An indented code block (after a blank line): up to the first line that is neither
            # indented nor blank.
            end = next((j for j in range(i, len(lines))
                        if lines[j].strip() and not lines[j].startswith("    ")), len(lines))
            # A quoted message (an error or warning text) is not code.
            quoted = lines[i].lstrip().startswith(("ddp:", "[ddp"))
            if not quoted and any("ddp::" in c for c in lines[i:end]):
                errors.append(f"{path}:{i + 1}: an indented code block names ddp::; fence it "
                              "as ```cpp so that the suite compiles it")
            i = end
            continue
        i += 1
    return found, errors


def main():
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    docs = [src / "README.md"] + sorted((src / "docs").rglob("*.md"))
    includes, bodies, errors, programs = list(PRELUDE), [], [], {}
    for doc in docs:
        found, errs = blocks(doc)
        errors += errs
        for line, code, context, program in found:
            if program:
                programs[program] = f"// {doc.relative_to(src)}:{line}\n" + "\n".join(code) + "\n"
                continue
            text = code if context is None else [
                c for part in context for c in (code if part.strip() == "@@" else [part])]
            for c in text:
                if c.startswith("#include") and c not in includes:
                    includes.append(c)
            name = re.sub(r"\W", "_", doc.relative_to(src).as_posix()) + f"_line{line}"
            body = [c for c in text if not c.startswith("#include")]
            bodies.append(f"// {doc.relative_to(src)}:{line}\nnamespace {name} {{\n"
                          "using namespace doc_context;\n" +
                          "\n".join(body) + f"\n}}  // namespace {name}\n")
    if errors:
        print("\n".join(errors))
        return 1
    out.mkdir(parents=True, exist_ok=True)
    (out / "doc_context.hpp").write_text((src / "tests/package/doc_context.hpp").read_text())
    (out / "snippets.cpp").write_text("\n".join(includes) + "\n\n" + "\n".join(bodies))
    cmake = CMAKE
    for name, code in programs.items():
        (out / f"{name}.cpp").write_text(code)
        cmake += (f"add_executable({name} {name}.cpp)\n"
                  f"target_link_libraries({name} PRIVATE ddp::ddp)\n")
    (out / "CMakeLists.txt").write_text(cmake)
    print(f"{len(bodies)} C++ blocks and {len(programs)} programs ({' '.join(programs)}) "
          f"from {len(docs)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

// outputs.hpp — an output path is checked before the work that fills it: a run that cannot write its
// result fails in its first second, not after hours (train's --log, --save; reports' --json, --html,
// --trace).
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace shardlab {

// PATH can be created or written: an existing file opens for writing (not truncated), a new one's
// directory exists and is writable; nothing is created, so every rank may check at once.
// InputError otherwise:
// "FLAG 'PATH': cannot write it: <the system's reason> (checked WHEN)".
void probe_output_file(const std::string& path, const char* flag, const char* when);

// (flag, path) pairs; empty paths are skipped.
using NamedPaths = std::vector<std::pair<std::string, std::string>>;
// No output is an input or another output (paths compared after resolving `.`, `..` and the
// symlinks of what exists): `--data corpus.txt --log corpus.txt` would overwrite the corpus.
// InputError naming both flags and the path.
void check_outputs_distinct(const NamedPaths& inputs, const NamedPaths& outputs);

}  // namespace shardlab

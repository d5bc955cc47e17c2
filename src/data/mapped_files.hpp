// mapped_files.hpp — token files mapped in place (llm.c shards) watched for a change under the run.
// A file truncated after it was mapped raises SIGBUS at the next read of a page past its new end;
// the handler names the file and ends the process with exit 1 (bad input) instead of a raw crash.
#pragma once
#include <cstddef>
#include <string>

namespace shardlab {

// Registers [base, base + length) as `path`'s mapping (installs the SIGBUS handler on first use).
void watch_mapping(const std::string& path, const void* base, size_t length);
void unwatch_mapping(const void* base);  // before munmap

}  // namespace shardlab

// check.hpp — one family of checks with one reporter.
//
//  * InputError: the user gave something we cannot use (bad option, bad file, budget too small).
//    Thrown with a message that carries the values involved; the CLI prints it and exits 1.
//    (Out of memory is its own exception, memory::OutOfMemory: exit 4.)
//  * SHARD_CHECK(cond, fmt, args...): an internal fault (a bug). The reporter formats the failed
//    statement, file:line, the rank and device of this process, and the values into the message of
//    an InternalError it throws, so tests can observe it and the CLI can print it and abort the
//    whole job (exit 2).
//  * MPI_CHECK / CUDA_CHECK / NCCL_CHECK / CUBLAS_CHECK (in their own headers) feed the same reporter.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace shardlab {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// Who this process is, for messages: set once the communicator knows (rank -1 = not yet known).
void set_process_identity(int rank, int world, std::string device);
int process_rank();
std::string process_identity();  // "rank 2/4 cpu" or "rank ?"

// Formats the report and throws InternalError. Never returns.
[[noreturn]] void check_failed(const char* statement, const char* file, int line, const std::string& detail);

}  // namespace shardlab

#define SHARD_CHECK(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::shardlab::check_failed(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__));      \
  } while (0)

// Input validation: throws InputError with the formatted message when cond is false.
#define SHARD_REQUIRE(cond, ...)                                                            \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      throw ::shardlab::InputError(::fmt::format(__VA_ARGS__));                             \
  } while (0)

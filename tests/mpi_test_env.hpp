#pragma once
#include "src/comm/mpi_runtime.hpp"

namespace shardlab::test {
extern MpiRuntime* g_mpi;  // set by mpi_main.cpp
}

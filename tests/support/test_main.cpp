#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "support/workers.hpp"

int main(int argc, char** argv) {
  const int worker_code = ddp::testing::maybe_run_worker();
  if (worker_code >= 0) return worker_code;
  at::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
